"""A checkpoint saved inside the step: its CPU side is the save's (io-stall), not host work.

The loops are played against test_device_infer's one-queue device model (as in
test_rules_host_bound), so where the device idles is known.
"""

from __future__ import annotations

import pytest
from analyze_helpers import MAIN_PID, chains_of, silent
from test_device_infer import Host

from ingero.analyze import saves
from ingero.analyze.context import Options
from ingero.analyze.explain import explain

STEPS = 2400
MS = 1_000_000


def _fsync(h: Host, ms: float, mib: int = 0) -> None:
    """The loop blocks ``ms`` in fsync (D state), its writeback issued as block I/O of its own."""
    h.trace.ev(h.t, "sched_switch", MAIN_PID, h.tid, ms * MS, kind="io", preempted=False, other_pid=0,
               runq_ns=10_000, syscall="fsync", fd_target="/ckpt/model.pt.tmp")
    for k in range(mib // 8):
        h.trace.ev(h.t + k * 1000, "block_io", MAIN_PID, MAIN_PID, ms * MS / 2, kind="write", bytes=8 << 20,
                   other_pid=259)
    h.t += int(ms * MS)


def loop(*, load_us: float = 50, save_every: int = 0, save_cpu_ms: float = 0, fsync_ms: float = 0,
         steps: int = STEPS) -> Host:
    """Load (CPU), copy, 20 kernels of 150 µs, sync, bookkeeping; every ``save_every`` steps a
    save: ``save_cpu_ms`` writing on CPU, then an fsync of ``fsync_ms``."""
    h = Host()
    h.trace.name(MAIN_PID, "python3 (pretrain.py)", "python3", "python3 pretrain.py")
    for i in range(1, steps + 1):
        h.host(load_us)
        h.copy_async(10)
        for _ in range(20):
            h.launch(150)
            h.host(5)
        h.sync(sleep=True)
        h.host(30)
        if save_every and i % save_every == 0:
            h.host(save_cpu_ms * 1000)
            _fsync(h, fsync_ms, mib=128)
    return h


def test_on_cpu_by_window_is_the_gap_less_its_off_cpu_intervals():
    wns, t0 = 1_000, 0
    got = saves.on_cpu_by_window(500, 2_600, [(700, 1_200), (2_000, 2_100)], t0, wns)
    # [500,700) in w0; (1200,2000) in w1; [2100,2600) in w2
    assert got == {0: 200, 1: 800, 2: 500}
    assert saves.on_cpu_by_window(0, 100, [(0, 100)], t0, wns) == {}


def test_a_checkpoint_in_the_step_is_an_io_stall_with_its_writes_not_host_bound():
    # every 60 steps: 250 ms of write() on CPU, then 120 ms in fsync
    store = loop(save_every=60, save_cpu_ms=250, fsync_ms=120).trace.store()
    rep = explain(store.con, Options(window_s=1))
    # 39 of the 40 saves (the last comes after the loop's last call: it delays no step), each its
    # 250 ms on CPU less the ordinary gap after a sync (the next step's load and the bookkeeping)
    [(cpu_ns, n)] = store.con.execute("SELECT sum(cpu_ns), sum(n) FROM ing_save").fetchall()
    assert n == pytest.approx(STEPS // 60 - 1)
    assert cpu_ns == pytest.approx((STEPS // 60 - 1) * (250 - 0.08) * MS, rel=1e-3)
    [chain] = chains_of(rep, "io-stall")
    assert rep.chains[0] is chain and chain.severity == "HIGH"
    assert chain.culprits[0].pid == MAIN_PID
    # its evidence: the windows that hold a fsync (a save's CPU can fall in the window before)
    assert 0.8 * cpu_ns <= chain.numbers["save_cpu_ns"] <= cpu_ns
    assert any(" steps that saved: " in e and "blocked in its flushes" in e for e in chain.effect)
    assert any(f.startswith("fsync inside the step waits") for f in chain.fix)
    assert silent(rep, "host-bound")


def test_inline_loading_beside_a_per_step_log_fsync_stays_host_bound():
    # the look-alike: every step fsyncs a small log (0.3 ms) and builds its batch inline on CPU
    # (3 ms): no gap is an ordinary one, so none of the CPU is counted as a save
    h = Host()
    h.trace.name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py --workers 0")
    for _ in range(1500):
        h.host(3000)
        h.copy_async(10)
        for _ in range(20):
            h.launch(50)
            h.host(5)
        h.sync(sleep=True)
        _fsync(h, 0.3)
    store = h.trace.store()
    rep = explain(store.con, Options(window_s=1))
    [chain] = chains_of(rep, "host-bound")
    assert rep.chains[0] is chain and chain.severity == "HIGH"
    assert chain.numbers["host_idle_ms_per_step"] == pytest.approx(3.0, abs=0.1)
    assert store.con.execute("SELECT count(*) FROM events WHERE syscall = 'fsync'").fetchone()[0] == 1500
    assert store.con.execute("SELECT count(*) FROM ing_save").fetchone()[0] == 0
    io = chains_of(rep, "io-stall")
    assert not io or io[0].numbers["save_cpu_ns"] == 0



def test_the_loop_blocked_in_its_own_flush_is_named_before_the_kernel_thread_issuing_for_it():
    # msync's writeback and the replaced file's discards go out through kblockd: more bytes than
    # the loop's own requests, yet the loop's save is the stall
    h = loop(save_every=60, save_cpu_ms=250, fsync_ms=120)
    kblockd = 58
    h.trace.name(kblockd, "kworker/1:1H-kblockd", "kworker/1:1H-kblockd")
    for k in range(0, int((h.t - h.first) / MS), 20):
        h.trace.ev(h.first + k * MS, "block_io", kblockd, kblockd, 30 * MS, kind="discard", bytes=64 << 20,
                   other_pid=259)
    rep = explain(h.trace.store().con, Options(window_s=1))
    [chain] = chains_of(rep, "io-stall")
    assert chain.root[0].startswith(f"python3 (pretrain.py) (PID {MAIN_PID}) issued "), chain.root
    assert any(c.startswith(f"kworker/1:1H-kblockd (PID {kblockd}): ") for c in chain.contributing), chain.contributing
    assert [c.pid for c in chain.culprits] == [MAIN_PID]
