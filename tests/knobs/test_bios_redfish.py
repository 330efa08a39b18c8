"""BIOS knobs over Redfish against the BMC double (served over HTTP on 127.0.0.1): pending until
reset, If-Match/ETag (428, 412), settings-failed messages after the reset, registry domains,
clearing a pending change, HTTP Basic auth with the password kept out of errors and logs."""
from __future__ import annotations

import json
import logging

import pytest
import requests

from tests.profiles import simhost
from tuner.bios.redfish import RedfishBios, RedfishError
from tuner.errors import BadInput, KnobUnavailable, OutOfDomain
from tuner.knobs import bios as biosk, registry
from tuner.knobs.base import Choice, Effect, IntRange
from tuner.sim import bmc


@pytest.fixture
def served(tmp_path):
    root = simhost.make(tmp_path / "h", pci=False)
    srv, url = bmc.serve(root)
    (root / "etc/metaltune/bmc.yaml").write_text(f"method: redfish\nurl: {url}\n")
    yield root, url, bmc.BmcDouble(root)
    srv.shutdown()
    srv.server_close()


def knobs(root):
    return registry.discover(simhost.host(root), ["bios"])


def reset(url):
    r = requests.post(f"{url}{bmc.SYS}/Actions/ComputerSystem.Reset",
                      json={"ResetType": "ForceRestart"}, timeout=5)
    assert r.status_code == 204


def test_domains_come_from_the_attribute_registry(served):
    root, _, _ = served
    ks = knobs(root)
    assert "bios.BiosVersion" not in ks  # read-only in the registry: not a knob
    wp = ks["bios.WorkloadProfile"]
    assert wp.effect is Effect.REBOOT
    assert isinstance(wp.limits(), Choice) and "HighPerformanceCompute" in wp.limits().values
    mr = ks["bios.MemoryRefreshRate"].limits()
    assert isinstance(mr, IntRange) and (mr.min, mr.max) == (1, 4)
    assert ks["bios.SriovGlobalEnable"].limits().values == [False, True]
    with pytest.raises(OutOfDomain):
        wp.apply("Turbo")


def test_change_is_pending_until_reset_then_applied_with_messages(served):
    root, url, dbl = served
    k = knobs(root)["bios.WorkloadProfile"]
    assert k.apply("HighPerformanceCompute") == "HighPerformanceCompute"  # the staged value
    assert k.read() == "Balanced"          # still in force until the reset
    assert k.pending() == "HighPerformanceCompute"
    st = dbl.state()
    assert st["pending"] == {"WorkloadProfile": "HighPerformanceCompute"}
    assert st["apply_time"] == "OnReset"   # never "Immediate": the BMC must not reboot the host
    reset(url)
    k.backend.invalidate()
    assert k.read() == "HighPerformanceCompute" and k.pending() is None
    res = k.backend.last_result()
    assert res["time"] and res["failed"] == []
    assert res["messages"][0]["MessageSeverity"] == "OK"


def test_settings_failed_message_after_reset(served):
    root, url, dbl = served
    dbl.update(fail_on_reset={"SubNumaCluster": "not supported with the installed DIMM population"})
    ks = knobs(root)
    ks["bios.SubNumaCluster"].apply("2-Way")
    ks["bios.ProcCStates"].apply("Disabled")
    reset(url)
    k = knobs(root)["bios.SubNumaCluster"]
    assert k.read() == "Disabled"          # the failed attribute kept its old value
    d = k.describe()
    assert d["last_apply"]["failed"] is True
    assert "DIMM population" in d["last_apply"]["messages"][0]["Message"]
    assert knobs(root)["bios.ProcCStates"].read() == "Disabled"
    assert knobs(root)["bios.ProcCStates"].describe()["last_apply"]["failed"] is False


def test_clear_pending_is_the_rollback(served):
    root, url, dbl = served
    k = knobs(root)["bios.ProcTurboMode"]
    k.apply("Disabled")
    assert k.pending() == "Disabled"
    k.clear_pending()
    assert k.pending() is None and dbl.state()["pending"] == {}
    reset(url)
    k.backend.invalidate()
    assert k.read() == "Enabled"


def test_patch_without_if_match_gets_428(served):
    _, url, _ = served
    r = requests.patch(f"{url}{bmc.SETTINGS}", json={"Attributes": {"ProcCStates": "Disabled"}},
                       timeout=5)
    assert r.status_code == 428
    assert "If-Match" in r.json()["error"]["message"]


def test_bmc_that_sends_no_etag_gives_a_clear_error(served):
    root, _, dbl = served
    dbl.update(send_etag=False)
    k = knobs(root)["bios.ProcCStates"]
    with pytest.raises(RedfishError, match="428"):
        k.apply("Disabled")
    assert dbl.state()["pending"] == {}


def test_stale_etag_412_is_retried_once_after_rereading(served):
    root, url, dbl = served
    cli = RedfishBios(url)
    calls = {"n": 0}
    real_get = cli._get_uncached

    def racing_get(path):
        doc, etag = real_get(path)
        if path == bmc.SETTINGS and calls["n"] == 0:
            calls["n"] += 1  # another client writes between our GET and our PATCH
            other = RedfishBios(url)
            other.set({"ProcTurboMode": "Disabled"})
        return doc, etag

    cli._get_uncached = racing_get
    cli.set({"ProcCStates": "Disabled"})
    assert dbl.state()["pending"] == {"ProcTurboMode": "Disabled", "ProcCStates": "Disabled"}


def test_persistent_412_is_an_error_not_a_blind_write(served):
    root, url, dbl = served
    cli = RedfishBios(url)
    real_get = cli._get_uncached

    def always_stale(path):
        doc, etag = real_get(path)
        if path == bmc.SETTINGS:
            RedfishBios(url).set({"MemoryRefreshRate": 1 + (dbl.state()["etag"] % 3)})
        return doc, etag

    cli._get_uncached = always_stale
    with pytest.raises(RedfishError, match="412"):
        cli.set({"ProcCStates": "Disabled"})
    assert "ProcCStates" not in dbl.state()["pending"]


def test_follows_the_settings_object_link(served):
    """Lenovo stages under /Bios/Pending: the client follows @Redfish.Settings, never builds it."""
    root, url, _ = served
    cli = RedfishBios(url)
    assert cli.settings_uri() == bmc.SETTINGS
    doc = cli.bios()
    doc["@Redfish.Settings"]["SettingsObject"]["@odata.id"] = "/redfish/v1/Systems/1/Bios/Pending"
    assert cli.settings_uri(doc) == "/redfish/v1/Systems/1/Bios/Pending"
    del doc["@Redfish.Settings"]
    with pytest.raises(KnobUnavailable, match="SettingsObject"):
        cli.settings_uri(doc)


def test_basic_auth_and_secret_stays_out_of_errors_and_logs(served, caplog):
    root, url, dbl = served
    dbl.update(auth={"user": "metaltune", "password": "s3cr3t-pw"})
    (root / "etc/metaltune/bmc.secret").write_text("wrong-pw\n")
    (root / "etc/metaltune/bmc.yaml").write_text(
        f"method: redfish\nurl: {url}\nusername: metaltune\npassword_file: /etc/metaltune/bmc.secret\n")
    caplog.set_level(logging.DEBUG)
    assert knobs(root) == {}  # 401: the provider contributes nothing
    with pytest.raises(RedfishError, match="401") as ei:
        biosk.open_backend(simhost.host(root)).current()
    assert "wrong-pw" not in str(ei.value)
    (root / "etc/metaltune/bmc.secret").write_text("s3cr3t-pw\n")
    ks = knobs(root)
    assert ks["bios.ProcCStates"].read() == "Enabled"
    assert "s3cr3t-pw" not in caplog.text and "wrong-pw" not in caplog.text


def test_unreachable_bmc_contributes_no_knobs(tmp_path):
    root = simhost.make(tmp_path / "h", pci=False)
    (root / "etc/metaltune/bmc.yaml").write_text("method: redfish\nurl: http://127.0.0.1:9\n")
    assert knobs(root) == {}
    with pytest.raises(KnobUnavailable, match="unreachable"):
        biosk.open_backend(simhost.host(root)).current()


def test_bad_bmc_config_is_bad_input(tmp_path):
    root = simhost.make(tmp_path / "h", pci=False)
    (root / "etc/metaltune/bmc.yaml").write_text("method: redfish\nurll: http://x\n")
    with pytest.raises(BadInput, match="bmc.yaml: field urll"):
        biosk.open_backend(simhost.host(root))


def test_sim_host_bmc_in_process(tmp_path):
    """A sim host's bmc.yaml points at sim-bmc://: the same Redfish code, no socket."""
    root = simhost.make(tmp_path / "h", pci=False)
    k = knobs(root)["bios.ProcCStates"]
    k.apply("Disabled")
    assert json.loads((root / "bmc/state.json").read_text())["pending"] == {"ProcCStates": "Disabled"}
