"""Safety benchmark on a simulated host: what a transaction costs per change (journal writes with
fsync + read back + watchdog), and how long from an incident to the restored state.

    .venv/bin/python benchmarks/bench_safety.py [--reps N]

Prints one table. Numbers depend on the disk's fsync latency (synchronous=FULL) and the load.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from safety import Journal, Policy, Transaction, anchor  # noqa: E402
from safety import monitors as mon  # noqa: E402
from tuner.host import open_host  # noqa: E402
from tuner.knobs.registry import discover  # noqa: E402
from tuner.sim.hostinit import init_host  # noqa: E402
from tuner.sim.inject import inject  # noqa: E402
from tuner.sim.workload import SimWorkload  # noqa: E402

POLICY = Policy.from_dict({"rules": [{"knob": "gpu*"}]}, "bench")
ROWS: list[tuple[str, str, str, str]] = []


def ms(xs: list[float]) -> tuple[str, str]:
    xs = sorted(xs)
    return f"{statistics.median(xs) * 1e3:8.1f}", f"{xs[int(0.9 * (len(xs) - 1))] * 1e3:8.1f}"


def row(what: str, xs: list[float], note: str = "") -> None:
    med, p90 = ms(xs)
    ROWS.append((what, med, p90, note))
    print(f"  {what}: {med.strip()} ms", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-safety-"))
    root = init_host(tmp / "host")
    host = open_host("sim", root)
    knobs = discover(host, providers=["gpu"])
    pl, lc, mc = knobs["gpu0.power_limit_w"], knobs["gpu0.locked_clocks_mhz"], knobs["gpu0.locked_mem_clocks_mhz"]
    vals = [600, 700]

    # 1. the knob alone: validate, write, read back (what any tool pays)
    xs = []
    for i in range(a.reps * 2):
        t0 = time.perf_counter()
        pl.apply(vals[i % 2])
        xs.append(time.perf_counter() - t0)
    row("knob.apply alone (write + read back), 1 knob", xs)
    raw = statistics.median(xs)

    # 2. one journal commit (synchronous=FULL, rollback journal: journal write + db write + fsyncs)
    j = Journal(tmp / "state" / "journal.db")
    tid = j.begin_txn("bench", None, [{"knob": "x", "identity": "x", "effect": "now", "before": 1,
                                       "after": 2}], [], time.time() + 60, 60)
    xs = []
    for _ in range(a.reps * 2):
        t0 = time.perf_counter()
        j.set_watchdog(tid, _)  # a real one-row update, committed
        xs.append(time.perf_counter() - t0)
    row("journal commit (synchronous=FULL, rollback journal)", xs)
    xs, rec = [], anchor.read(j.anchor_path)
    for _ in range(a.reps * 2):
        t0 = time.perf_counter()
        anchor.write(j.anchor_path, rec)  # what begin_txn and finish_rollback add after their commit
        xs.append(time.perf_counter() - t0)
    row("journal anchor rewrite (file + folder fsync)", xs, "begin, and a rollback")

    # 3. whole transactions: begin (baseline, intent, apply, read back) + confirm
    def txn_time(changes_list, **kw) -> list[float]:
        out = []
        for i in range(a.reps):
            ch = changes_list[i % 2]
            t0 = time.perf_counter()
            t = Transaction(j, knobs, ch, policy=POLICY, probation_s=60, poll_interval_s=None, **kw)
            t.begin()
            t.confirm()
            out.append(time.perf_counter() - t0)
        return out

    one = [{"gpu0.power_limit_w": 600}, {"gpu0.power_limit_w": 700}]
    three = [{"gpu0.power_limit_w": 600, "gpu0.locked_clocks_mhz": [1500, 1500],
              "gpu0.locked_mem_clocks_mhz": [2201, 2201]},
             {"gpu0.power_limit_w": 700, "gpu0.locked_clocks_mhz": [1200, 1200],
              "gpu0.locked_mem_clocks_mhz": [3201, 3201]}]
    for label, chs, kw in (("1 knob, no watchdog", one, {"watchdog": "none"}),
                           ("1 knob, watchdog=thread", one, {"watchdog": "thread"}),
                           ("1 knob, watchdog=process (fork)", one, {}),
                           ("3 knobs, watchdog=process (fork)", three, {})):
        xs = txn_time(chs, **kw)
        n = len(chs[0])
        per = [(x - n * raw) / n for x in xs]
        row(f"transaction {label}: total", xs)
        row(f"transaction {label}: overhead per change", per, "total/n - knob.apply")
    spawn = ("tuner.ops.safety:watchdog_knobs", {"backend": "sim", "sim_root": str(root)})
    xs = []
    for i in range(max(3, a.reps // 5)):
        t0 = time.perf_counter()
        t = Transaction(j, knobs, one[i % 2], policy=POLICY, probation_s=60, poll_interval_s=None,
                        knob_factory=spawn)
        t.begin()
        t.confirm()
        xs.append(time.perf_counter() - t0)
    row("transaction 1 knob, watchdog=process (spawn + rebuild knobs)", xs)
    pl.apply(700), lc.apply(None), mc.apply(None)

    # 4. incident -> restored (monitor thread polling every 0.1 s)
    # the incumbent: 600 W at a pinned 1500 MHz runs cool on the sim's H200 (its 700 W default
    # is already at the HW thermal slowdown, which the monitors do not blame on a change)
    wl = SimWorkload(root)
    pl.apply(600), lc.apply([1500, 1500])
    change = {"gpu0.power_limit_w": 550, "gpu0.locked_clocks_mhz": [1305, 1305]}

    def restored() -> bool:
        return pl.read() == 600 and lc.read() == [1500, 1500]

    reps = max(3, a.reps // 4)
    for event, args in (("xid", ["79"]), ("ecc-dbe", []), ("thermal", []), ("pcie-replay", ["100"]),
                        ("aer-fatal", []), ("hang", [])):
        xs = []
        for _ in range(reps):
            canary = mon.CanaryMonitor(lambda: wl.canary(timeout_s=20), expected=True, timeout_s=0.5,
                                       interval_s=0.1, mode="process")
            t = Transaction(j, knobs, change, policy=POLICY, probation_s=60,
                            monitors=mon.standard(host.nvml, root, canary=canary), key=None)
            t.key = f"{event}-{time.time()}"
            wl.canary()  # sensors as the incumbent leaves them
            t.begin()
            time.sleep(0.3)  # a few canary runs at the new setting (the sim's 700 W default runs hot)
            t0 = time.perf_counter()
            inject(root, event, args)
            while not restored():
                time.sleep(0.002)
                if time.perf_counter() - t0 > 10:
                    import faulthandler
                    faulthandler.dump_traceback(all_threads=True)
                    raise SystemExit(f"{event}: not restored; incidents {t.incidents}, "
                                     f"state {j.txn_state(t.id)}")
            xs.append(time.perf_counter() - t0)
            t.rollback("bench")
            if event == "thermal":
                inject(root, "clear", [])
        row(f"incident -> restored: {event} {' '.join(args)}".rstrip(), xs,
            "canary timeout 0.5 s" if event == "hang" else "poll 0.1 s")

    # 5. deadline and caller death: the watchdog alone
    xs = []
    for _ in range(reps):
        t = Transaction(j, knobs, change, policy=POLICY, probation_s=0.2, poll_interval_s=None).begin()
        while not restored():
            time.sleep(0.002)
        xs.append(time.time() - t.deadline)
        t.rollback("bench")
    row("probation deadline -> restored (forked watchdog)", xs)
    xs = []
    state = tmp / "state"
    for _ in range(reps):
        code = textwrap.dedent(f"""
            import time
            from safety import Journal, Transaction, Policy
            from tuner.host import open_host
            from tuner.knobs.registry import discover
            knobs = discover(open_host("sim", {str(root)!r}), providers=["gpu"])
            Transaction(Journal({str(state / 'journal.db')!r}), knobs, {change!r},
                        policy=Policy.from_dict({{"rules": [{{"knob": "gpu*"}}]}}), probation_s=60).begin()
            print("applied", flush=True)
            time.sleep(60)
        """)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        assert p.stdout.readline().strip() == "applied"
        t0 = time.perf_counter()
        p.send_signal(signal.SIGKILL)
        while not restored():
            time.sleep(0.002)
        xs.append(time.perf_counter() - t0)
        p.wait()
    row("caller SIGKILLed in probation -> restored (forked watchdog)", xs)

    w = max(len(r[0]) for r in ROWS)
    print(f"\nsafety benchmark: simulated H200, {a.reps} reps, journal synchronous=FULL (rollback journal), "
          f"load avg {os.getloadavg()[0]:.1f}")
    print(f"{'measure'.ljust(w)}  {'median ms':>9}  {'p90 ms':>8}  note")
    for what, med, p90, note in ROWS:
        print(f"{what.ljust(w)}  {med:>9}  {p90:>8}  {note}")
    host.close()


if __name__ == "__main__":
    main()
