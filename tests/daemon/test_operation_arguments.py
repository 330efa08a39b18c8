"""Every operation's arguments are checked by its model, on the socket as in the CLI: a wrong
type, an unknown or misspelt key, a count out of range is exit 2 with one line naming the field,
answered before anything runs (no search child is started, no knob is written)."""
from __future__ import annotations

import pytest

from tests.daemon.conftest import power_limit_w, write_config
from tuner import ops
from tuner.errors import BadInput
from tuner.ops.args import validate

BAD = [
    ("search_mixed", {"budget": "x", "bogus": 1}, "budget"),
    ("search_mixed", {"bogus": 1}, "bogus: unknown argument"),
    ("search_mixed", {"budget": 0}, "--budget"),
    ("search_mixed", {"max_choices": 1}, "--max-choices"),
    ("search_mixed", {"proposer": "annealing"}, "unknown proposer 'annealing'"),
    ("search_mixed", {"families": ["flash_mla"]}, "unknown kernel family 'flash_mla'"),
    ("search_mixed", {"knobs": ["none", "gpu0.power_limit_w"]}, "cannot be combined"),
    ("search_mixed", {"timeout_s": float("inf")}, "timeout_s"),
    ("search_host", {"budget": "many"}, "budget"),
    ("search_host", {"families": ["rmsnorm"]}, "families: unknown argument"),
    ("search_kernel", {"budget": 3}, "family"),
    ("search_kernel", {"family": "softmax", "ideas": ["x"]}, "--idea: only for --proposer llm"),
    ("status", {"incidents": 1e20}, "incidents"),
    ("status", {"incidents": -1}, "incidents"),
    ("trials", {"limit": -5}, "limit"),
    ("recover", {"from_default": True}, "from_default: unknown argument"),
    ("rollback", {"txn": "all"}, "txn: unknown argument"),
    ("confirm", {"txn": 3}, "txn: unknown argument"),
    ("baseline", {"accept_curent": True}, "accept_curent: unknown argument"),
]


@pytest.mark.parametrize("op,args,names", BAD)
def test_validate_refuses_with_one_line_naming_the_field(op, args, names):
    with pytest.raises(BadInput) as e:
        validate(op, ops.get(op), args)
    msg = str(e.value)
    assert names in msg and "\n" not in msg and msg.startswith(f"{op}: "), msg


def test_good_search_options_pass_through_unchanged():
    args = {"budget": 4, "families": ["rmsnorm"], "knobs": ["none"], "max_choices": 3}
    assert validate("search_mixed", ops.get("search_mixed"), args) == args


def test_the_daemon_answers_bad_arguments_with_exit_2_and_starts_nothing(tmp_path, sim_host,
                                                                         start_daemon):
    cfg = write_config(tmp_path / "daemon.toml", sim_host, tmp_path)
    d = start_daemon(cfg)
    d.wait_ready()
    watts = power_limit_w(sim_host)
    for op, args, names in BAD:
        r = d.call(op, **args)
        assert r["ok"] is False and r["exit_code"] == 2, (op, args, r)
        assert names in r["error"] and "\n" not in r["error"], (op, r["error"])
    info = d.call("daemon")["result"]
    assert info["search"]["running"] is False and "op" not in info["search"]  # no child started
    assert not (tmp_path / "state" / "search-child.out").exists()
    assert power_limit_w(sim_host) == watts
    # the spelling that exists still works
    assert d.call("recover", from_defaults=True)["ok"] is True
    assert d.stop() == 0
