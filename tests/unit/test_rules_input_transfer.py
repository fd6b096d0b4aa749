"""input-bound and transfer-bound: waits outside CUDA calls; time inside pageable copies."""

from __future__ import annotations

import pytest

from analyze_helpers import MAIN_PID, S, Trace, chains_of, silent, named_loop
from ingero.analyze.rules import input_bound, transfer_bound


def base() -> Trace:
    return named_loop(30)


def with_workers(tr: Trace, n: int, oncpu: float, **kw) -> Trace:
    for k in range(n):
        tr.name(5000 + k, "python3 (train.py)", "pt_data_worker", "python3 train.py")
        tr.worker(5000 + k, 0, 30, oncpu=oncpu, **kw)
    return tr


def test_input_bound_fires_names_workers_and_sizes_fix():
    tr = with_workers(base(), 1, 0.95).loop(0, 30, wait_ms=60)
    report = tr.explain()
    [chain] = chains_of(report, "input-bound")
    assert report.chains[0] is chain
    assert chain.severity == "HIGH"
    # 60 ms of a 90 ms step waiting for the batch
    assert chain.numbers["input_wait_share"] == pytest.approx(60 / 90.1, abs=0.02)
    assert chain.numbers["workers"] == 1
    assert chain.culprits[0].pid == 5000
    # 1 CPU-bound worker (95% of a core) on 2 cores, the loop mostly asleep: room for one more
    assert chain.fix[0].startswith("DataLoader(num_workers=2, pin_memory=True, persistent_workers=True")
    assert silent(report, "cpu-contention")


def test_input_bound_with_saturated_cpus_says_more_workers_will_not_help():
    tr = with_workers(base(), 2, 0.97).loop(0, 30, wait_ms=60)
    [chain] = chains_of(tr.explain(), "input-bound")
    assert "more will not help" in chain.fix[0]
    assert chain.fix[1].startswith("make each sample cheaper")


def test_input_bound_suggests_more_workers_with_spare_cores():
    tr = with_workers(base(), 1, 0.95).loop(0, 30, wait_ms=60)
    tr.ncpu = 8
    [chain] = chains_of(tr.explain(), "input-bound")
    # needs 1/(1-0.67) = 3x the batches: 3 workers
    assert chain.fix[0].startswith("DataLoader(num_workers=3,")


def test_input_bound_just_below_threshold():
    # 5 ms wait of a 35 ms step = 14% < 20%; and GPU-bound (sync wait larger)
    tr = with_workers(base(), 2, 0.3).loop(0, 30, wait_ms=5, device_ms=30)
    assert silent(tr.explain(), "input-bound")


def test_input_bound_ignores_sleep_inside_syncs():
    tr = with_workers(base(), 2, 0.3).loop(0, 30, device_ms=120)
    assert silent(tr.explain(), "input-bound")


def test_serial_loop_waiting_as_long_as_its_sync_is_input_bound_in_every_window():
    # wait for the batch (24 ms, nothing queued: the device idles), then launch and sync;
    # the sync waits ~25 ms for the kernels, a little longer than the wait for data.
    # A rule requiring the data wait to exceed the sync wait found no window here.
    tr = with_workers(base(), 1, 0.95).loop(0, 30, wait_ms=24, device_ms=30.5)
    [chain] = chains_of(tr.explain(), "input-bound")
    # 31 one-second windows (the last step ends after 30 s), first and last left out
    assert chain.windows_total == 29
    assert len(chain.evidence_windows) == 29
    assert chain.numbers["sync_wait_share"] > chain.numbers["input_wait_share"]
    # 24 ms of a 24 + 0.02 + 1.24 + 4 + 25.27 ms step
    assert chain.numbers["input_wait_share"] == pytest.approx(24 / 54.55, abs=0.01)
    assert chain.numbers["queued_wait_share"] == 0
    assert chain.severity == "HIGH"


def test_overlapped_loop_whose_kernels_outlast_the_wait_is_gpu_bound():
    # launch (40 ms of kernels), wait 20 ms for the batch while they run, sync 14.7 ms:
    # the wait is hidden behind the device work, faster data would not speed it up
    tr = with_workers(base(), 1, 0.95).loop(0, 30, wait_ms=20, device_ms=40, overlap=True)
    report = tr.explain()
    assert silent(report, "input-bound")
    assert silent(report)


def test_overlapped_loop_waiting_longer_than_its_kernels_is_input_bound():
    # 20 ms of kernels queued, then 40 ms waiting for the batch: the device runs dry in
    # the wait, the sync after it returns at once
    tr = with_workers(base(), 1, 0.95).loop(0, 30, wait_ms=40, device_ms=20, overlap=True)
    [chain] = chains_of(tr.explain(), "input-bound")
    assert len(chain.evidence_windows) == chain.windows_total == 29
    # 40 ms of a 0.02 + 1.24 + 40 + 4 + 0.025 ms step, all of it with kernels queued
    assert chain.numbers["input_wait_share"] == pytest.approx(40 / 45.3, abs=0.01)
    assert chain.numbers["queued_wait_share"] == chain.numbers["input_wait_share"]
    # the syncs' call time (15 µs + 10 µs run-queue wait each): a spinning sync shows it too
    assert chain.numbers["sync_wait_share"] == pytest.approx(0.025 / 45.3, abs=1e-4)
    assert chain.severity == "HIGH"
    assert chain.effect[0] == ("GPU idle while the loop waits: the kernels queued before the wait finished before "
                               "the batch came (88.3% of wall clock; the syncs of those windows waited 0.1%)")


@pytest.mark.parametrize("sync_ms, fires", [(1.0, True), (3.0, False)])
def test_queued_wait_counts_only_with_a_short_sync_after_it(sync_ms, fires):
    # overlapped, 20 ms wait; the kernels outlast launches + wait + 4 ms of Python by sync_ms:
    # the sync waits sync_ms, 5% (device dry in the wait: jitter) or 15% of the wait
    device_ms = 0.02 + 40 * 0.031 + 20 + 4 + sync_ms
    assert (sync_ms / 20 <= input_bound.T.max_queued_sync_ratio) == fires
    tr = with_workers(base(), 1, 0.95).loop(0, 30, wait_ms=20, device_ms=device_ms, overlap=True)
    chains = chains_of(tr.explain(), "input-bound")
    assert len(chains) == int(fires)


def test_input_bound_with_starved_workers_defers_to_contention():
    tr = with_workers(base(), 2, 0.2, wait=0.6).loop(0, 30, wait_ms=60)
    [chain] = chains_of(tr.explain(), "input-bound")
    assert chain.severity == "MEDIUM"
    assert any("see cpu-contention" in c for c in chain.contributing)


def test_transfer_bound_pageable_fires():
    tr = base().loop(0, 30, copy_op="cudaMemcpy", copy_bytes=64 << 20, copy_ms=25)
    [chain] = chains_of(tr.explain(), "transfer-bound")
    assert chain.severity == "HIGH"
    assert chain.title.endswith("(pageable memory)")
    assert chain.numbers["bandwidth_bytes_per_s"] == pytest.approx((64 << 20) / 0.025, rel=0.01)
    assert chain.numbers["copy_share"] == pytest.approx(25 / 55.1, abs=0.02)
    assert chain.numbers["pinned_allocs"] == 0
    assert any("pin_memory=True" in f for f in chain.fix)
    report = tr.explain()
    assert silent(report, "input-bound")  # sleeping inside a copy is not waiting for data
    assert silent(report, "cpu-contention")


def test_transfer_bound_with_pinned_memory_says_overlap():
    tr = base().loop(0, 30, copy_op="cudaMemcpy", copy_bytes=512 << 20, copy_ms=25)
    tr.ev(tr.events[0]["timestamp"], "cudaMallocHost", MAIN_PID, MAIN_PID, 1000, bytes=512 << 20)
    [chain] = chains_of(tr.explain(), "transfer-bound")
    assert "pageable" not in chain.title
    assert chain.fix[0].startswith("overlap copies with compute")


def test_copy_slowed_by_preemption_is_not_a_transfer_problem():
    # 25 ms cudaMemcpyAsync calls, 24 ms of which the thread was runnable but off CPU:
    # on CPU the copy took 1 ms (64 MiB at 64 GB/s): contention, not the bus
    tr = base().name(7000, "stress", "stress", "stress --cpu 2").competitor(7000, "stress", 0, 30)
    tr.loop(0, 30, copy_op="cudaMemcpyAsync", copy_bytes=64 << 20, copy_ms=25, copy_preempt_ms=24,
            preempt_by=7000)
    report = tr.explain()
    assert silent(report, "transfer-bound")
    assert chains_of(report, "cpu-contention") != []


def test_pinned_allocation_outside_the_analysed_range_counts():
    # buffers pinned at start-up, before the range explain looks at
    tr = base().loop(0, 30, copy_op="cudaMemcpy", copy_bytes=512 << 20, copy_ms=25)
    tr.ev(tr.events[0]["timestamp"] - 5 * S, "cudaMallocHost", MAIN_PID, MAIN_PID, 1000, bytes=512 << 20)
    first = tr.events[0]["timestamp"]
    [chain] = chains_of(tr.explain(from_ns=first), "transfer-bound")
    assert chain.numbers["pinned_allocs"] == 1
    assert "pageable" not in chain.title
    assert not any("no cudaMallocHost" in r for r in chain.root)


def test_transfer_bound_just_below_threshold():
    # 5 ms copies in a 35 ms step = 14% < 20%
    tr = base().loop(0, 30, copy_op="cudaMemcpy", copy_bytes=16 << 20, copy_ms=5)
    assert 5 / 35.1 < transfer_bound.T.min_copy_share
    assert silent(tr.explain(), "transfer-bound")


def test_pinned_async_copies_are_healthy():
    tr = base().loop(0, 30, copy_op="cudaMemcpyAsync", copy_bytes=64 << 20, copy_ms=0.02)
    assert silent(tr.explain())
    assert input_bound.T.min_wait_share > 0


def test_input_bound_counts_only_its_own_children_as_workers():
    # two traced helpers: a child of the loop's process (its DataLoader worker) and an
    # unrelated traced process with a different parent
    tr = base().loop(0, 30, wait_ms=60)
    tr.name(5000, "python3 (train.py)", "pt_data_worker", "python3 train.py", ppid=MAIN_PID)
    tr.worker(5000, 0, 30, oncpu=0.95)
    tr.name(6000, "python3 (other.py)", "python3", "python3 other.py", ppid=1)
    tr.worker(6000, 0, 30, oncpu=0.5)
    [chain] = chains_of(tr.explain(), "input-bound")
    assert chain.numbers["workers"] == 1
    assert [c.pid for c in chain.culprits] == [5000]
    assert chain.culprits[0].name == "python3 (train.py), worker (child of PID 4242)"
    assert any("1 DataLoader worker process of PID 4242 used" in r for r in chain.root)


def test_without_clean_windows_effects_compare_least_and_most_affected_quarters():
    # the loop always waits for data (>= 20% of every window), four times longer in the second half
    tr = with_workers(base(), 1, 0.95).loop(0, 15, wait_ms=30).loop(15, 30, wait_ms=120)
    [chain] = chains_of(tr.explain(), "input-bound")
    assert chain.correlation is None
    assert any(e.startswith("CUDA ops/s") and "quarter of windows with the most waiting for data" in e
               for e in chain.effect)
    # pageable copies in every window, three times longer in the second half
    tr = base().loop(0, 15, copy_op="cudaMemcpy", copy_bytes=64 << 20, copy_ms=25)
    tr.loop(15, 30, copy_op="cudaMemcpy", copy_bytes=64 << 20, copy_ms=75)
    [chain] = chains_of(tr.explain(), "transfer-bound")
    assert chain.effect[1].startswith("no clean window to compare with (copies in")
    assert any("quarter of windows with the most copy time" in e for e in chain.effect)
    assert not any(e.startswith("present in") for e in chain.effect)
