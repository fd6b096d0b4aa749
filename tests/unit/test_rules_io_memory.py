"""io-stall and memory-pressure: D-state and slowdowns in the windows of the I/O / faults."""

from __future__ import annotations

import pytest

from analyze_helpers import MAIN_PID, Trace, chains_of, silent, named_loop
from ingero.analyze.rules import io_stall, memory_pressure

DD = 8000


def base() -> Trace:
    return named_loop(30).name(DD, "dd", "dd", "dd if=/dev/zero of=/data/ckpt bs=1M")


def test_io_stall_fires_names_writer():
    tr = base().loop(0, 10).loop(10, 20, io_ms=30).loop(20, 30).block_io(DD, 10, 20, lat_ms=80)
    report = tr.explain()
    [chain] = chains_of(report, "io-stall")
    assert report.chains[0] is chain
    assert chain.severity == "HIGH"
    assert chain.culprits[0].pid == DD and chain.culprits[0].name == "dd"
    assert len(chain.evidence_windows) == 10
    assert chain.numbers["block_p99_ns"] == pytest.approx(80e6)
    assert chain.numbers["io_wait_share"] == pytest.approx(30 / 60.1, abs=0.02)
    assert "ionice -c 3 -p 8000   (idle-class I/O for dd)" in chain.fix
    assert chain.correlation is not None and chain.correlation < -0.9
    assert silent(report, "memory-pressure")
    assert silent(report, "cpu-contention")  # D state is not contention


def test_io_without_effect_on_the_loop_is_silent():
    # a slow disk in the same windows, but the loop neither blocks nor slows down
    tr = base().loop(0, 30).block_io(DD, 10, 20, lat_ms=80)
    assert silent(tr.explain(), "io-stall")


def test_io_just_below_threshold():
    # 1.5 ms of D state per 31.5 ms step = 4.8% < 5%; requests at 15 ms < 20 ms
    tr = base().loop(0, 10).loop(10, 20, io_ms=1.5).loop(20, 30).block_io(DD, 10, 20, lat_ms=15)
    assert 1.5 / 31.55 < io_stall.T.min_io_share
    assert silent(tr.explain(), "io-stall")


def test_memory_pressure_fires_and_io_stall_defers():
    tr = base().system(10, 20, swap_in_bytes=50_000_000, major_faults=800, mem_pct=97)
    tr.loop(0, 10).loop(10, 20, io_ms=25, faults=200).loop(20, 30).block_io(0, 10, 20, lat_ms=30)
    report = tr.explain()
    [chain] = chains_of(report, "memory-pressure")
    assert report.chains[0] is chain
    assert chain.severity == "HIGH"
    assert chain.numbers["swap_bytes"] == pytest.approx(10 * 50e6, rel=0.11)
    assert chain.numbers["major_faults"] >= 8000
    assert chain.numbers["faults_per_s_quiet"] == 0
    assert silent(report, "io-stall")
    assert silent(report, "cpu-contention")


def test_memory_pressure_from_own_faults_aligned_with_slowdown():
    # no swap: the loop's page faults jump 20x and it slows by a third in those windows
    tr = base().loop(0, 10, faults=10).loop(10, 20, faults=400, cpu_ms=40).loop(20, 30, faults=10)
    [chain] = chains_of(tr.explain(), "memory-pressure")
    assert chain.numbers["faults_per_s"] > 10 * chain.numbers["faults_per_s_quiet"]
    assert chain.numbers["throughput_drop"] > memory_pressure.T.min_drop


def test_memory_signals_without_effect_are_silent():
    # swap traffic on the host, but the loop runs at the same rate and never blocks
    tr = base().system(10, 20, swap_out_bytes=50_000_000).loop(0, 30)
    assert silent(tr.explain(), "memory-pressure")


def test_page_ins_are_memory_pressure_not_io_stall():
    # an evicted mmap: the loop copies from it, faults, and waits in D state for the
    # page-ins (its own block reads); the host shows ~60 major faults/s, no swap
    tr = base().system(0, 30, major_faults=60)
    tr.loop(0, 10, faults=50).loop(10, 30, faults=50, io_ms=120).block_io(MAIN_PID, 10, 30, lat_ms=30, kind="read")
    report = tr.explain()
    [chain] = chains_of(report, "memory-pressure")
    assert report.chains[0] is chain and chain.severity == "HIGH"
    assert any("took page faults while in D state" in r for r in chain.root)
    assert silent(report, "io-stall")


def test_d_state_without_faults_stays_io_stall():
    tr = base().system(0, 30, major_faults=60)
    tr.loop(0, 10).loop(10, 30, io_ms=120).block_io(MAIN_PID, 10, 30, lat_ms=30, kind="read")
    report = tr.explain()
    assert report.chains[0].rule_id == "io-stall"
    assert silent(report, "memory-pressure")


def _pressured() -> Trace:
    tr = base().system(10, 20, swap_in_bytes=50_000_000, major_faults=800, mem_pct=97)
    return tr.loop(0, 10).loop(10, 20, io_ms=25, faults=200).loop(20, 30)


def test_memory_pressure_names_the_process_holding_the_memory():
    hog = 9100
    tr = _pressured().name(hog, "memhog", "memhog", "/usr/bin/memhog 12g")
    tr.rss(hog, "memhog", 0, 30, 1 << 30, 12 << 30)  # grows 11 GiB
    tr.rss(MAIN_PID, "python3", 0, 30, 3 << 30, 3 << 30)  # larger than the hog at first, flat
    [chain] = chains_of(tr.explain(), "memory-pressure")
    assert chain.culprits[0].pid == hog
    assert any("memory held by memhog (PID 9100)" in r for r in chain.root)
    assert any(f.startswith("stop PID 9100 (memhog) or cap it: systemd-run --scope -p MemoryMax=<limit> "
                            "/usr/bin/memhog 12g") for f in chain.fix)
    assert not any("--sort=-rss" in f for f in chain.fix)


def test_memory_pressure_held_by_its_own_worker_says_so():
    worker = 5001
    tr = _pressured().name(worker, "python3 (train.py)", "pt_data_worker", "python3 train.py", ppid=MAIN_PID)
    tr.rss(worker, "pt_data_worker", 0, 30, 1 << 30, 9 << 30)
    [chain] = chains_of(tr.explain(), "memory-pressure")
    assert chain.culprits[0].name == "python3 (train.py), worker (child of PID 4242)"
    assert any(f.startswith("PID 5001 is the job itself (a worker)") for f in chain.fix)


def test_memory_pressure_without_process_memory_falls_back_to_ps():
    [chain] = chains_of(_pressured().explain(), "memory-pressure")
    assert chain.culprits == []
    assert any("--sort=-rss" in f for f in chain.fix)
