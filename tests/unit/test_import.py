"""ingero import on the four real Kineto traces: every event stored or counted, the tracer's op names."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import kineto_truth as truth
from ingero.importer import import_trace, load, raw
from ingero.store.db import Store


@pytest.fixture(scope="module")
def imported():
    store = Store.memory()
    results = {name: import_trace(store, truth.DATA / name) for name in truth.TRACES}
    yield store, results
    store.close()


def _q(store, sql, **params):
    return store.con.execute(sql, params).fetchall()


@pytest.mark.parametrize("name", truth.TRACES)
def test_every_event_is_stored_or_counted(imported, name):
    store, results = imported
    r = results[name]
    trace = truth.load(name)
    ev = trace["traceEvents"]
    n_names = len({e["pid"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"
                   and e["pid"] in r.pids})  # stored in process_names
    assert n_names == 1
    assert r.calls + r.device + r.spans + sum(r.unused.values()) + n_names == len(ev)
    c = Counter(e.get("cat") for e in ev if e.get("ph") == "X")
    assert r.device == c["kernel"] + c["gpu_memcpy"] + c["gpu_memset"]
    assert r.spans == c["cpu_op"] + c["user_annotation"]
    got = dict(_q(store, "SELECT op, count(*) FROM events WHERE session_id = $s GROUP BY op", s=r.session_id))
    calls = Counter(e["name"] for e in ev if e.get("ph") == "X" and e.get("cat") == "cuda_runtime")
    expected: Counter = Counter()
    for symbol, n in calls.items():
        op = load.op_for(symbol)
        if op is None:
            assert r.unused[f"CUDA calls without an op name: {symbol}"] == n
        else:
            expected[op] += n
    assert got == dict(expected)
    assert _q(store, "SELECT count(*) FROM device_activity WHERE session_id = $s", s=r.session_id)[0][0] == r.device
    assert _q(store, "SELECT count(*) FROM spans WHERE session_id = $s", s=r.session_id)[0][0] == r.spans


def test_op_names_are_the_tracers():
    assert load.op_for("cudaStreamSynchronize") == "cudaStreamSync"
    assert load.op_for("cudaDeviceSynchronize") == "cudaDeviceSync"
    assert load.op_for("cudaEventSynchronize") == "cudaEventSync"
    assert load.op_for("cudaLaunchKernelExC") == "cudaLaunchKernel"
    assert load.op_for("cudaMemcpyAsync_ptsz") == "cudaMemcpyAsync"
    assert load.op_for("cudaHostAlloc") == "cudaMallocHost"
    assert load.op_for("cuMemAlloc") == "cuMemAlloc" and load.op_for("cuMemAlloc_v2") == "cuMemAlloc"
    assert load.op_for("cuCtxSynchronize") == "cuCtxSynchronize"
    assert load.op_for("cudaEventQuery") is None and load.op_for("cudaMemsetAsync") is None


def test_session_rows_carry_rank_world_size_devices_and_source(imported):
    store, results = imported
    rows = {r[0]: r[1:] for r in _q(store, """SELECT imported_from, rank, world_size, device_properties, status,
                                                     import_unused, events FROM sessions""")}
    v100 = rows[str((truth.DATA / "v100_rank0.pt.trace.json.gz").resolve())]
    assert v100[:2] == (0, 1) and v100[3] == "closed"
    assert json.loads(v100[2])[0]["name"] == "Tesla V100-SXM2-32GB"
    assert json.loads(v100[4])["CUDA calls without an op name: cudaEventQuery"] == 2413
    assert v100[5] == results["v100_rank0.pt.trace.json.gz"].calls
    nccl = rows[str((truth.DATA / "a100_nccl_rank0.json.gz").resolve())]
    assert nccl[:2] == (0, 2)
    sampled = rows[str((truth.DATA / "sampled_rank0_ws128.json.gz").resolve())]
    assert sampled[:3] == (0, 128, None)  # no deviceProperties in that trace
    alex = rows[str((truth.DATA / "alexnet_a100.json.gz").resolve())]
    assert alex[:2] == (0, None)  # distributedInfo has the rank only
    names = dict(_q(store, "SELECT pid, name FROM process_names"))
    assert names[2910249] == "python3.10" and 0 not in names  # the device 'processes' are not named


def test_copies_carry_bytes_direction_and_stream_from_the_device_activity(imported):
    store, results = imported
    sid = results["alexnet_a100.json.gz"].session_id
    rows = _q(store, """SELECT e.kind, e.bytes, e.stream, d.copy_kind, d.bytes, d.stream, d.name
                        FROM events e JOIN device_activity d ON d.session_id = e.session_id
                             AND d.call_tid = e.tid AND d.call_ns = e.timestamp
                        WHERE e.session_id = $s AND e.op = 'cudaMemcpyAsync'""", s=sid)
    assert len(rows) == 16
    assert all(r[0] == r[3] == "H2D" and r[1] == r[4] > 0 and r[2] == r[5] for r in rows)
    assert all(r[6].startswith("Memcpy HtoD") for r in rows)
    # stream syncs carry the stream of the trace's device-side sync marker; device syncs none
    syncs = dict(_q(store, """SELECT op, count(stream) FROM events WHERE session_id = $s
                              AND op IN ('cudaStreamSync', 'cudaDeviceSync') GROUP BY op""", s=sid))
    assert syncs == {"cudaStreamSync": 16, "cudaDeviceSync": 0}


def test_base_time_after_the_events_is_applied(imported):
    """a100_nccl: ts are relative to baseTimeNanoseconds, a key written after traceEvents."""
    store, results = imported
    r = results["a100_nccl_rank0.json.gz"]
    assert r.started_ns == 1711964646000000000 + 4458676416788066  # the earliest event (a cpu_op), in ns
    trace = truth.load("a100_nccl_rank0.json.gz")
    first_kernel = min(truth.ns(trace, e["ts"]) for e in trace["traceEvents"] if e.get("cat") == "kernel")
    got = _q(store, "SELECT min(start_ns) FROM device_activity WHERE session_id = $s", s=r.session_id)[0][0]
    assert abs(got - first_kernel) < 1000  # the fast path reads ts as a double: sub-µs


@pytest.mark.parametrize("name", ["alexnet_a100.json.gz", "sampled_rank0_ws128.json.gz", "a100_nccl_rank0.json.gz"])
def test_fast_and_streaming_paths_stage_the_same_rows(name):
    store = Store.memory()
    con = store.con
    meta_fast = raw.stage(con, truth.DATA / name, fast=True)
    fast = con.execute("SELECT ph, cat, name, pid, tid, round(ts::DOUBLE, 1), round(dur::DOUBLE, 3), correlation, "
                       "device, stream, bytes, arg_name FROM _imp_raw ORDER BY ALL").fetchall()
    meta_slow = raw.stage(con, truth.DATA / name, fast=False)
    slow = con.execute("SELECT ph, cat, name, pid, tid, round(ts::DOUBLE, 1), round(dur::DOUBLE, 3), correlation, "
                       "device, stream, bytes, arg_name FROM _imp_raw ORDER BY ALL").fetchall()
    assert len(fast) == len(truth.load(name)["traceEvents"])
    assert meta_fast.keys() == meta_slow.keys() and meta_fast.get("baseTimeNanoseconds") == meta_slow.get(
        "baseTimeNanoseconds")
    assert fast == slow


def test_calls_only_keeps_calls_and_spans_and_drops_the_device_timeline():
    store = Store.memory()
    r = import_trace(store, truth.DATA / "v100_rank0.pt.trace.json.gz", calls_only=True)
    assert r.device == 0 and r.calls == 5951
    assert _q(store, "SELECT count(*) FROM device_activity")[0][0] == 0
    assert r.unused["kernel (device timeline dropped: --calls-only)"] == 4350
    # the copies still carry what the tracer would have read from the call's arguments
    assert _q(store, "SELECT count(*), count(bytes), count(kind) FROM events WHERE op = 'cudaMemcpyAsync'")[0] == (
        1600, 1600, 1600)


TORCH = truth.DATA.parent  # tests/data: torch_cpu_workers{0,2}.json.gz, made by make_torch_traces.py


def test_cpu_only_torch_traces_give_steps_and_data_loading():
    """Recorded with the CPU-only torch: no CUDA call, no device; 5 steps; data loading marked."""
    store = Store.memory()
    w0 = import_trace(store, TORCH / "torch_cpu_workers0.json.gz")
    w2 = import_trace(store, TORCH / "torch_cpu_workers2.json.gz")
    from ingero.analyze.device import imported

    for r in (w0, w2):
        assert (r.calls, r.device) == (0, 0) and r.spans > 0
        assert imported.device(store.con, r.session_id) is None
    s0, s2 = imported.steps(store.con, w0.session_id), imported.steps(store.con, w2.session_id)
    assert [s.number for s in s0.steps] == [s.number for s in s2.steps] == [2, 3, 4, 5, 6]
    # num_workers=0: the main process builds every batch (8 items of ~1 ms) inside the step
    assert all(s.dataloader_share > 0.3 for s in s0.steps)
    assert s2.dataloader_ms_median < s0.dataloader_ms_median
    names = dict(store.con.execute("""SELECT session_id, any_value(name) FROM spans
                                      WHERE starts_with(name, 'enumerate(DataLoader)') GROUP BY ALL""").fetchall())
    assert names[w0.session_id].endswith("_SingleProcessDataLoaderIter.__next__")
    assert names[w2.session_id].endswith("_MultiProcessingDataLoaderIter.__next__")


@pytest.mark.parametrize("name", ["alexnet_a100.json.gz", "sampled_rank0_ws128.json.gz", "a100_nccl_rank0.json.gz"])
def test_the_array_reaches_duckdb_in_pieces_of_whole_events(name, monkeypatch):
    """A large trace goes to DuckDB's reader in bounded pieces cut between events (DuckDB holds
    a whole array in memory); small pieces here give the same rows as the streaming reader."""
    monkeypatch.setattr(raw, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(raw, "PIECE_BYTES", 50_000)
    monkeypatch.setattr(raw, "TAIL_WINDOW", 64 << 10)
    cut = []
    pieces = raw._pieces
    monkeypatch.setattr(raw, "_pieces", lambda *a: (cut.append(p) or p for p in pieces(*a)))
    sql = ("SELECT ph, cat, name, pid, tid, round(ts::DOUBLE, 1), round(dur::DOUBLE, 3), correlation, "
           "device, stream, bytes, arg_name FROM _imp_raw ORDER BY ALL")
    store = Store.memory()
    meta = raw._stage_fast(store.con, truth.DATA / name)
    assert meta is not None and len(cut) >= 3  # the fast path itself, not the fallback
    fast = store.con.execute(sql).fetchall()
    raw.stage(store.con, truth.DATA / name, fast=False)
    assert fast == store.con.execute(sql).fetchall()
