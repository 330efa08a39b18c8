"""The one A/B routine (tuner.search.ab): ABBA order, the sequential extension, the monitor poll."""
import pytest

from tuner.search.ab import AB
from tuner.trial import Measurement


def recorder(values=None):
    order = []

    def measure(side):
        order.append(side)
        v = (values or {}).get(side, 100.0)
        return Measurement(metric="tok/s", value=v, samples=[v])

    return order, measure


def test_pairs_alternate_in_abba_order_and_fill_both_sides():
    order, measure = recorder({"a": 100.0, "b": 110.0})
    ab = AB().run(measure, 3)
    assert "".join(order) == "abbaab"
    assert [m.value for m in ab.a] == [100.0] * 3 and [m.value for m in ab.b] == [110.0] * 3


def test_undecided_extends_up_to_max_pairs_and_decided_stops_at_once():
    order, measure = recorder()
    asked = []

    def never(a, b):
        asked.append(len(a))
        return False

    AB().run(measure, 3, max_pairs=16, decided=never)
    assert len(order) == 32 and asked == list(range(3, 17))  # asked only from the 3rd pair on
    order, measure = recorder()
    AB().run(measure, 3, max_pairs=16, decided=lambda a, b: len(a) >= 5)
    assert len(order) == 10
    order, measure = recorder()
    AB().run(measure, 3, max_pairs=16)  # nothing to decide with: exactly the planned pairs
    assert len(order) == 6


def test_with_a_poll_every_candidate_sample_is_polled_and_the_candidate_is_measured_last():
    order, measure = recorder()
    polls = []
    ab = AB().run(measure, 2, poll=lambda: polls.append(len(order)))
    assert "".join(order) == "abbab"  # two pairs end on the incumbent: one more candidate sample
    assert polls == [2, 3, 5] and len(ab.b) == 3


def test_samples_taken_before_an_incident_stay_readable():
    order, measure = recorder()

    class Incident(Exception):
        pass

    def poll():
        if len(order) >= 3:
            raise Incident

    ab = AB()
    with pytest.raises(Incident):
        ab.run(measure, 3, poll=poll)
    assert len(ab.a) == 1 and len(ab.b) == 2
