"""Mechanisms the verdicts rest on: poisoned allocations, the ghost run, bit-identity, timing."""
import torch

from kernelsearch.families import get
from kernelsearch.harness import correctness, timing
from kernelsearch.harness.correctness import Runner, bit_equal


def test_allocations_are_poisoned_and_ghost_changes_output(redteam):
    fam = get("softmax")
    (x,) = fam.make_inputs((3, 40), "float32", "cpu", torch.Generator().manual_seed(0))
    r = Runner(redteam("honest").read_text())
    out, launches = r.call((x,))
    assert launches == 1 and torch.isfinite(out).all()
    ghost, _ = r.call((x,), ghost=True)
    assert torch.isnan(ghost).all()  # a no-op kernel leaves the poison in place
    assert not bit_equal(ghost, out)


def test_never_launching_candidate_has_identical_ghost(redteam):
    fam = get("softmax")
    (x,) = fam.make_inputs((3, 40), "float32", "cpu", torch.Generator().manual_seed(0))
    r = Runner(redteam("never_launches").read_text())
    out, launches = r.call((x,))
    ghost, _ = r.call((x,), ghost=True)
    assert launches == 0 and bit_equal(out, ghost)


def test_bit_equal_is_bitwise():
    a = torch.tensor([0.0, float("nan")])
    assert bit_equal(a, a.clone())
    assert not bit_equal(torch.tensor([0.0]), torch.tensor([-0.0]))


def test_bench_and_ab_on_cpu():
    f = lambda x: x * 2  # noqa: E731
    sets = [(torch.randn(100),) for _ in range(2)]
    r = timing.bench(f, sets, "cpu", warmup=1, reps=5)
    assert r["median_s"] > 0 and r["n"] == 5 and r["mode"] == "wall"
    ab = timing.ab(f, f, sets, "cpu", rounds=4, reps=3)
    assert ab["speedup"] > 0 and ab["speedup_p25"] <= ab["speedup_p75"]


def test_floor_uses_read_ceiling_with_margin():
    c = timing.Ceilings(read_Bps=4.57e12, flops=989e12, margin=1.1)
    # 134 MB of KV cache (decode at 4k): floor ~26.7 us; SDPA's real 29 us must pass
    assert timing.too_fast(29.4e-6, 134.2e6, 1e9, c) is None
    assert "physical floor" in timing.too_fast(20e-6, 134.2e6, 1e9, c)
    # the copy figure alone (4.25 TB/s, no margin) would have rejected SDPA decode at 128k
    copy_only = timing.Ceilings(read_Bps=4.25e12, flops=989e12, margin=1.0)
    assert timing.too_fast(940.4e-6, 4.295e9, 1e9, copy_only) is not None
    assert timing.too_fast(940.4e-6, 4.295e9, 1e9, c) is None


def test_compare_reports_first_bad_element():
    fam = get("softmax")
    ref = torch.full((4,), 0.25, dtype=torch.float64)
    out = torch.tensor([0.25, 0.25, 0.25, 0.3])
    try:
        correctness.compare(out, ref, "float32", fam, "here")
    except correctness.Rejected as e:
        assert e.rule == "tolerance" and "flat index 3" in e.detail
    else:
        raise AssertionError("not rejected")


def test_host_cost_is_a_cuda_measurement_and_never_decides():
    """Host launch cost is measured only where a GPU queue exists; elsewhere the record has no
    host fields, and a failure to measure it is recorded instead of raised."""
    from kernelsearch.harness import timing as tm

    assert tm.host_cost(lambda: None, [()], "cpu") is None
    assert tm.host_costs(lambda: None, lambda: None, [()], "cpu") == {}

    def boom(*a):
        raise RuntimeError("no GPU queue here")

    rec = tm.host_costs(boom, boom, [()], "cuda")
    assert set(rec) == {"host_error"} and "RuntimeError" in rec["host_error"]


def test_fingerprint_sees_one_changed_element_across_chunks(monkeypatch):
    """Inputs too big to copy are fingerprinted (sum and position-weighted sum of their bits, in
    chunks): a copy matches, one changed element or two swapped ones do not."""
    monkeypatch.setattr(correctness, "CHUNK", 1000)
    x = torch.randn(7, 1001)
    fp = correctness.fingerprint(x)
    assert correctness.fingerprint(x.clone()) == fp
    y = x.clone()
    y[6, 1000] += 1.0
    assert correctness.fingerprint(y) != fp
    z = x.clone()
    z[0, 0], z[5, 3] = x[5, 3], x[0, 0]
    assert correctness.fingerprint(z) != fp
    monkeypatch.setattr(correctness, "SNAPSHOT_BYTES", 1024)
    assert correctness._unchanged(x, correctness._snapshot(x))
    assert not correctness._unchanged(y, correctness._snapshot(x))


def test_last_timed_run_gets_new_values_in_the_same_tensors():
    """The output the judge checks after timing comes from a run on the same tensors as every
    earlier run (state a candidate keeps on them persists) holding values no earlier run saw (no
    freed buffer can hold their answer)."""
    seen = []

    def fn(x):
        seen.append((x, float(x[0])))
        return x * 2

    sets = [(torch.ones(3),), (torch.ones(3) * 2,)]

    def refresh(a):
        a[0].fill_(5.0)

    r = timing.bench(fn, sets, "cpu", warmup=2, reps=4, refresh=refresh)
    assert all(x is sets[i % 2][0] for i, (x, _) in enumerate(seen[2:]))
    assert [v for _, v in seen] == [1, 2, 1, 2, 1, 5]
    assert r["last_index"] == 1 and torch.equal(r["last"], torch.full((3,), 10.0))
