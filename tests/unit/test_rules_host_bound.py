"""host-bound (and launch-bound's side of the split) on hand-made call streams.

The loops are played against test_device_infer's one-queue device model, so
where the device idles is known: host work after a sync (inline loading,
bookkeeping) leaves nothing queued; host work between launches does not.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from analyze_helpers import MAIN_PID, SESSION, Trace, chains_of, silent
from test_device_infer import Host

from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.analyze.rules import host_bound

STEPS = 3000  # ~5.7 s: explain's windows are whole seconds
WINDOW_S = 1
WORKERS = (5001, 5002)


def loop(*, load_us: float, kernels: int = 50, kernel_us: float = 20, host_us: float = 50,
         sleep: bool = False, steps: int = STEPS, gap_us: float = 5, tail_us: float = 0,
         tail_asleep: bool = False) -> Host:
    """The issue's loop: load a batch inline (CPU), copy it, launch, sync, bookkeeping (CPU);
    ``tail_us`` more between the last launch and the sync: on the CPU (logging), or
    ``tail_asleep`` (waiting for a batch, the step's work queued)."""
    h = Host()
    h.trace.name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py --workers 0")
    for _ in range(steps):
        h.host(load_us)
        h.copy_async(10)
        for _ in range(kernels):
            h.launch(kernel_us)
            h.host(gap_us)
        if tail_asleep:
            h.trace.switch(h.t, MAIN_PID, h.tid, tail_us * 1000, "sleep", runq=5_000)
        h.host(tail_us)
        h.sync(sleep=sleep)
        h.host(host_us)
    return h


def report(h: Host, samples: list | None = None, frames: list | None = None):
    store = h.trace.store()
    if samples:
        store.append("events", pa.Table.from_pylist(samples))
        store.append("stacks", pa.Table.from_pylist(frames))
    return explain(store.con, Options(window_s=WINDOW_S))


def with_workers(h: Host) -> Host:
    seconds = (h.t - h.first) / 1e9 + 1
    for pid in WORKERS:
        h.trace.name(pid, "python3 (train.py)", "pt_data_worker", "python3 train.py", ppid=MAIN_PID)
        h.trace.worker(pid, 0, seconds, oncpu=0.3)
    return h


@pytest.mark.parametrize("sleep", [False, True], ids=["spin", "block"])
def test_inline_loading_fires_and_is_not_launch_bound(sleep):
    # 800 µs of loading + 50 µs of bookkeeping per ~1.9 ms step, device busy ~1 ms of it
    rep = report(loop(load_us=800, sleep=sleep))
    [chain] = chains_of(rep, "host-bound")
    assert rep.chains[0] is chain
    assert chain.severity == "HIGH"
    assert silent(rep, "launch-bound")
    n = chain.numbers
    assert n["inline_loading"] == 1.0 and n["workers"] == 0
    # idle host work per step: the load, the bookkeeping and the loop's own Python gaps
    assert n["host_idle_ms_per_step"] == pytest.approx(0.85, abs=0.03)
    assert n["host_idle_share"] == pytest.approx(0.85 / n["step_ms_mean"], abs=0.02)
    assert n["device_busy_share"] == pytest.approx(1.0 / n["step_ms_mean"], abs=0.05)
    assert n["launch_idle_share"] < 0.05
    assert any("inline data loading" in line for line in chain.root)
    # one batch takes 0.85 ms, the rest of the step ~1.05 ms: ceil(0.81) + 1 = 2 workers
    assert chain.fix[0].startswith("DataLoader(num_workers=2, persistent_workers=True, pin_memory=True)")
    # explain's one accounting: that time over the loop's whole wall clock (edge windows too)
    assert len(chain.evidence_windows) == chain.windows_total
    assert 0.3 < chain.share <= n["host_idle_share"]


@pytest.mark.parametrize("sleep", [False, True], ids=["spin", "block"])
def test_host_work_after_the_last_launch_is_host_bound_not_launch_bound(sleep):
    # launched every 10 µs, then 1 ms of logging before the sync: the queue runs dry ~400 µs
    # into it, and the device idles through the rest, the loop on the CPU
    rep = report(loop(load_us=20, kernels=40, host_us=0, tail_us=1000, sleep=sleep))
    [chain] = chains_of(rep, "host-bound")
    assert rep.chains[0] is chain
    assert silent(rep, "launch-bound")
    n = chain.numbers
    # the tail the point leaves idle: 1 ms less what the point spills past the launches
    assert 0.3 < n["host_tail_share"] <= n["host_idle_share"]
    assert n["inline_loading"] == 0.0
    assert any("after its last launch, before its sync" in line for line in chain.root)
    assert chain.fix[0].startswith("the work between the step's last launch and its sync runs with the GPU done")


def test_a_wait_for_data_after_the_last_launch_is_not_host_work():
    # (reviewed) 15 µs of Python between launches, and the 1 ms before the sync asleep (a batch
    # not ready): no host work there
    rep = report(loop(load_us=20, kernels=40, host_us=0, gap_us=15, tail_us=1000, tail_asleep=True))
    for chain in chains_of(rep, "host-bound"):
        assert chain.numbers["host_tail_share"] == 0.0
        assert not any("after its last launch, before its sync" in line for line in chain.root)


def test_just_below_threshold_does_not_fire():
    # 200 µs of idle host work per ~1.3 ms step: 16% < 20%
    rep = report(loop(load_us=150))
    assert silent(rep, "host-bound")
    assert silent(rep)


def test_just_above_threshold_is_medium():
    # 350 µs per ~1.4 ms step: ~24%
    [chain] = chains_of(report(loop(load_us=300)), "host-bound")
    assert chain.severity == "MEDIUM"
    assert host_bound.T.min_host_idle_share <= chain.numbers["host_idle_share"] < host_bound.T.high_host_idle_share


def test_workers_and_a_busy_device_do_not_fire():
    # the look-alike: the same loop fed by two workers, 200 µs kernels (device ~10 ms per step)
    h = with_workers(loop(load_us=0, kernel_us=200, steps=60))
    rep = report(h)
    assert silent(rep, "host-bound")
    assert [c for c in rep.chains if c.severity in ("HIGH", "MEDIUM")] == []


def test_host_work_with_workers_is_not_called_inline_loading():
    # 800 µs of Python after the sync with workers feeding the loop: host-bound, but not loading
    h = Host()
    h.trace.name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    for _ in range(STEPS):
        h.copy_async(10)
        for _ in range(50):
            h.launch(20)
            h.host(5)
        h.sync()
        h.host(850)
    [chain] = chains_of(report(with_workers(h)), "host-bound")
    assert chain.numbers["inline_loading"] == 0.0 and chain.numbers["workers"] == 2
    assert not any("num_workers" in f for f in chain.fix)


def test_launch_bound_when_launches_starve_the_device():
    # 400 launches of 5 µs kernels 28 µs apart, 1 ms of Python while they run: launch pacing
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py").system(0, 20)
    rep = tr.loop(0, 20, launches=400, launch_us=8, launch_gap_us=20, device_ms=2, cpu_ms=1).explain()
    assert [c.rule_id for c in rep.chains] == ["launch-bound"]
    # the sync never waits and follows 1 ms of Python: nothing shows how long the kernels ran,
    # only that they fit between the launches; the device is taken busy for the middle of that
    # (analyze/device/__init__.py), and the rest of the launch window is idle the launches leave, but for the
    # 1 ms after the last launch (of the ~12.2 ms step), which is the host's
    assert rep.device.busy_share == pytest.approx(0.5, abs=0.01)
    assert rep.chains[0].numbers["launch_idle_share"] == pytest.approx(0.5 - 1 / 12.2, abs=0.01)


def _samples(h: Host, every_ns: int = 10_000_000) -> tuple[list, list]:
    """cpu_sample rows at every_ns over the run: in the loader when nothing is queued."""
    frames = []
    for sid, rows in ((1, [("train.py", 113, "cpu_work", "h.update(view[:n])"),
                           ("train.py", 301, "main", "cpu_work(decode_work, scratch)")]),
                      (2, [("train.py", 330, "main", "check(lib.cudaLaunchKernel(kernel_ptr, grid, block))")])):
        for depth, (file, line, fn, src) in enumerate(rows):
            frames.append({"stack_id": sid, "depth": depth, "frame_kind": "python", "function": fn,
                           "module": file, "file": f"/src/{file}", "line": line, "source": src})
    samples = []
    for k, ts in enumerate(range(h.first, h.t, every_ns)):
        stack = 1 if k % 4 else 2  # 3 in 4 in the loader
        samples.append({"session_id": SESSION, "timestamp": ts, "duration_ns": every_ns, "pid": MAIN_PID,
                        "tid": h.tid, "op": "cpu_sample", "stack_id": stack, "in_call": None,
                        "queued": stack == 2, "cpu": 0})
    return samples, frames


def test_sampled_lines_name_the_loader_line():
    h = loop(load_us=800)
    rep = report(h, *_samples(h, every_ns=1_000_003))
    [chain] = chains_of(rep, "host-bound")
    top = [c for c in chain.contributing if "%" in c and "train.py" in c]
    assert top and ("train.py:113  cpu_work: h.update(view[:n])  "
                    "← train.py:301 main: cpu_work(decode_work, scratch)") in top[0]
    assert chain.numbers["samples_outside_cuda"] > 0


def test_sampled_lines_say_nothing_of_an_unreadable_frame():
    """An [unreadable] caller is left out of the line; an [unreadable] innermost frame gives no line
    (its caller would be named instead of the line that ran)."""
    h = loop(load_us=800)
    samples, frames = _samples(h, every_ns=1_000_003)
    for f in frames:
        if f["stack_id"] == 1 and f["depth"] == 1:  # the loader line's caller
            f.update(function="[unreadable]", module=None, file=None, line=None, source=None)
        if f["stack_id"] == 2 and f["depth"] == 0:  # the launch line
            f.update(function="[unreadable]", module=None, file=None, line=None, source=None)
    [chain] = chains_of(report(h, samples, frames), "host-bound")
    lines = [c for c in chain.contributing if "%" in c and ".py" in c]
    assert lines and "train.py:113  cpu_work: h.update(view[:n])" in lines[0]
    assert not any("unreadable" in c or "None" in c or "?" in c for c in chain.contributing)
    assert not any("train.py:330" in c for c in chain.contributing)
