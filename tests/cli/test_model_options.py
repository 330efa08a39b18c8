"""The search commands' options are their options models' fields (tuner.cli.model_options): each
field is an option with the model's flag, default and help, FLAGS (for messages) names the same
flags, a field added to a model is on the command line with no CLI edit, and a local search
builds its options once and runs them as built."""
from __future__ import annotations

import json
from typing import Optional

import pytest
import typer
from pydantic import Field
from typer.testing import CliRunner

from tests.simhelpers import run_cli
from tuner.cli import app
from tuner.search.options import (HostSearchOptions, KernelSearchOptions, MixedSearchOptions,
                                  cli)

COMMANDS = {"host": HostSearchOptions, "mixed": MixedSearchOptions, "kernel": KernelSearchOptions}
#: help filled in from a registry when the command line is built (tuner.cli.common.live_help)
LIVE = {"proposer", "workload", "family"}
#: fields the command line does not set (the daemon's and tests' own)
NOT_ON_CLI = {"isolate"}
#: host-search fields a subclass's command leaves off (search mixed plans no rate budget yet)
NOT_ON = {"mixed": {"wait_for_policy"}}


def _params(cmd: str) -> dict[str, object]:
    group = typer.main.get_command(app).commands["search"]
    return {p.name: p for p in group.commands[cmd].params}


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_every_field_is_an_option_with_the_models_flag_default_and_help(cmd):
    model, params = COMMANDS[cmd], _params(cmd)
    for name, field in model.model_fields.items():
        if name in NOT_ON_CLI | NOT_ON.get(cmd, set()):
            assert name not in params
            continue
        p = params[name]
        assert p.opts[0] == field.json_schema_extra["flag"] == model.FLAGS[name], name
        if field.is_required():
            assert p.required, name
        else:
            assert p.default == field.default, (name, p.default, field.default)
        if name not in LIVE:
            assert p.help == field.description, name
        assert (p.help or "").strip(), name
    assert set(params) - set(model.model_fields) == {"as_json"}


def test_flags_come_from_the_fields():
    # search host's A/B pairs field is `repeats`, typed as --rounds: a message names --rounds
    assert HostSearchOptions.FLAGS["repeats"] == "--rounds"
    assert MixedSearchOptions.FLAGS["repeats"] == "--repeats"
    assert MixedSearchOptions.FLAGS["rounds"] == "--rounds"
    from tuner.errors import BadInput

    with pytest.raises(BadInput, match=r"repeats \(--rounds\)"):
        HostSearchOptions.parse("search_host", {"repeats": 0})


class _Plus(HostSearchOptions):
    warmup: int = Field(2, ge=1, description="Warm-up runs before each trial.",
                        json_schema_extra=cli("--warmup", "N"))
    label: Optional[str] = Field(None, description="A label for the run.",
                                 json_schema_extra=cli("--label"))


def _app_of(model):
    from tuner.cli.model_options import model_command
    from tuner.ops.settings import Settings

    shown = []
    a = typer.Typer()

    @a.callback()
    def _root(ctx: typer.Context) -> None:
        ctx.obj = Settings(state_dir="/nonexistent", backend=None, sim_root=None)

    a.command("plus")(model_command(model, "search_host", lambda res, o: shown.append(o),
                                     "A search with more options."))
    return a, shown


def test_a_field_added_to_the_model_is_on_the_command_line(monkeypatch):
    from tuner.daemon import client

    asked = []
    monkeypatch.setattr(client, "try_call", lambda name, args: asked.append((name, args)) or {})
    a, shown = _app_of(_Plus)
    r = CliRunner().invoke(a, ["plus", "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "--warmup" in r.output and "Warm-up runs before each trial." in r.output
    assert "[default: 2]" in r.output and "--label" in r.output and "--rounds" in r.output

    r = CliRunner().invoke(a, ["plus", "--warmup", "5", "--label", "x", "--budget", "3"])
    assert r.exit_code == 0, r.output
    (name, args), = asked
    assert name == "search_host" and args == {"warmup": 5, "label": "x", "budget": 3}
    (o,), = [shown]
    assert isinstance(o, _Plus) and (o.warmup, o.label, o.budget, o.repeats) == (5, "x", 3, 3)

    r = CliRunner().invoke(a, ["plus", "--warmup", "0"])
    assert r.exit_code == 2 and "--warmup" in r.output, r.output


@pytest.mark.usefixtures("cli_env")
def test_a_local_search_builds_its_options_once(capsys, monkeypatch):
    """The CLI builds KernelSearchOptions and the operation runs that object: no dump and
    re-validation on the way (the daemon's path sends JSON and builds its own)."""
    import tuner.search.kernel as ks

    built, ran = [], []
    orig = KernelSearchOptions.model_validate.__func__

    def counting(cls, *a, **kw):
        built.append(cls)
        return orig(cls, *a, **kw)

    monkeypatch.setattr(KernelSearchOptions, "model_validate", classmethod(counting))

    def fake_search(state, family, **kw):
        ran.append((family, kw))
        return {"run_id": "r1", "buckets": [], "entries": 0, "table": "t.json", "trials": []}

    monkeypatch.setattr(ks, "run_kernel_search", fake_search)
    rc, out, err = run_cli(capsys, "search", "kernel", "--family", "softmax", "--budget", "2",
                           "--proposer", "random", "--device", "cpu", "--shape", "3x17",
                           "--json")
    assert rc == 0, err
    assert json.loads(out)["run_id"] == "r1"
    assert built == [KernelSearchOptions], built
    (family, kw), = ran
    assert (family, kw["budget"], kw["shapes"]) == ("softmax", 2, [(3, 17)])
