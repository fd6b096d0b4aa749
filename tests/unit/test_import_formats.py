"""Every torch.profiler trace format since PyTorch 1.8 gives the same store as today's.

One run (three training steps of a process with a main and an autograd thread:
data loading, operators launching kernels, a pageable copy, a memset, a sync)
is written by ``write_run`` in the shapes torch.profiler wrote over the years,
as Kineto's ChromeTraceLogger printed them and as HTA and TensorBoard's plugin
read them (made here, from Kineto's printing code, not copied from any file):

- ``new`` (PyTorch 2.x): categories cpu_op / user_annotation / cuda_runtime /
  kernel / gpu_memcpy / gpu_memset, numeric pids and tids, device rows on
  pid = device, tid = stream, 'External id', ts in µs relative to
  baseTimeNanoseconds (written after the events), with ns fractions;
- ``1.8``: Operator (CPU operators and record_function ranges alike: the steps
  are only ProfilerStep#N operators), Runtime, Kernel, Memcpy, Memset, tids as
  strings ("4242"), device rows on tid "stream 7", calls and device rows
  linked by 'correlation' with a lowercase 'external id', ts whole epoch µs,
  a 'Trace' span on pid "Spans", instants on pid "Traces", a last instant with
  pid "" and tid "", flow arrows of cat 'async';
- ``1.9``: cpu_op for every operator (steps too), the capitalised GPU
  categories, numeric tids, device tid the stream number;
- ``1.8-pids``: 1.8 with the pids as strings too;
- ``1.8-no-correlation``: 1.8 without correlation ids: device rows link to the
  calls that submitted them by external id only.

The real traces (tests/data/kineto) are rewritten into the 1.8 shape as well.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

import kineto_truth as truth
from ingero.analyze.device import imported
from ingero.importer import import_trace
from ingero.store.db import Store

PID, MAIN, AUTOGRAD = 4242, 4242, 4250
STREAM, DEVICE = 7, 0
EPOCH_NS = 1_717_000_000_000_000_000
BASE_NS = 1_716_999_999_123_456_789  # baseTimeNanoseconds of the new shape: ts get ns fractions


def _run() -> list[dict]:
    """The run as abstract events, times in ns (whole µs, which every shape can write)."""
    us = 1000
    ev: list[dict] = []
    corr = 100
    ext = 1
    t = EPOCH_NS
    for step in range(3):
        s0 = t
        ev.append(dict(kind="annotation", name=f"ProfilerStep#{step + 1}", tid=MAIN, t=s0, dur=990 * us, ext=ext))
        ext += 1
        ev.append(dict(kind="annotation", name="enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                       tid=MAIN, t=s0 + 5 * us, dur=300 * us, ext=ext))
        ext += 1
        ev.append(dict(kind="python", name="train.py(42): main", tid=MAIN, t=s0 + 2 * us, dur=900 * us, ext=0))
        # a copy of the batch (pageable), then two operators launching 1 and 2 kernels
        op_t = s0 + 320 * us
        ev.append(dict(kind="op", name="aten::copy_", tid=MAIN, t=op_t, dur=60 * us, ext=ext))
        ev.append(dict(kind="call", name="cudaMemcpyAsync", tid=MAIN, t=op_t + 5 * us, dur=40 * us, ext=ext, corr=corr))
        ev.append(dict(kind="memcpy", name="Memcpy HtoD (Pageable -> Device)", t=op_t + 10 * us, dur=30 * us,
                       ext=ext, corr=corr, bytes=1 << 20))
        corr, ext = corr + 1, ext + 1
        op_t += 80 * us
        ev.append(dict(kind="op", name="aten::addmm", tid=MAIN, t=op_t, dur=50 * us, ext=ext))
        for k in range(2):
            ev.append(dict(kind="call", name="cudaLaunchKernel", tid=MAIN, t=op_t + (5 + 20 * k) * us, dur=8 * us,
                           ext=ext, corr=corr))
            ev.append(dict(kind="kernel", name=f"void gemm_kernel_{k}<float>(float*, int)",
                           t=op_t + (20 + 150 * k) * us, dur=140 * us, ext=ext, corr=corr))
            corr += 1
        ext += 1
        op_t += 70 * us
        ev.append(dict(kind="op", name="aten::zero_", tid=AUTOGRAD, t=op_t, dur=20 * us, ext=ext))
        ev.append(dict(kind="call", name="cudaMemsetAsync", tid=AUTOGRAD, t=op_t + 2 * us, dur=6 * us, ext=ext,
                       corr=corr))
        ev.append(dict(kind="memset", name="Memset (Device)", t=op_t + 400 * us, dur=4 * us, ext=ext, corr=corr,
                       bytes=4096))
        corr, ext = corr + 1, ext + 1
        ev.append(dict(kind="call", name="cudaStreamSynchronize", tid=MAIN, t=op_t + 30 * us, dur=390 * us, ext=0,
                       corr=corr))
        corr += 1
        t = s0 + 1000 * us
    return ev


NEW_CATS = {"annotation": "user_annotation", "op": "cpu_op", "python": "python_function", "call": "cuda_runtime",
            "kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
OLD_CATS = {"annotation": "Operator", "op": "Operator", "python": "python_function", "call": "Runtime",
            "kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset"}
V19_CATS = {**OLD_CATS, "annotation": "cpu_op", "op": "cpu_op"}
SHAPES = ("new", "1.8", "1.9", "1.8-pids", "1.8-no-correlation")


def write_run(shape: str, path: Path) -> Path:
    old = shape != "new"
    cats = NEW_CATS if shape == "new" else V19_CATS if shape == "1.9" else OLD_CATS
    correlated = shape != "1.8-no-correlation"
    str_tid = shape.startswith("1.8")
    pid: object = str(PID) if shape == "1.8-pids" else PID

    def ts(ns: int) -> object:
        return ns // 1000 if old else round((ns - BASE_NS) / 1000, 3)

    def dur(ns: int) -> object:
        return ns // 1000 if old else ns / 1000

    events: list[dict] = []
    for e in _run():
        on_device = e["kind"] in ("kernel", "memcpy", "memset")
        x = {"ph": "X", "cat": cats[e["kind"]], "name": e["name"], "ts": ts(e["t"]), "dur": dur(e["dur"])}
        if on_device:
            x["pid"] = DEVICE
            x["tid"] = f"stream {STREAM}" if str_tid else STREAM
            args = {"queued": 0, "device": DEVICE, "context": 1, "stream": STREAM}
            if shape == "1.8-no-correlation":
                del args["stream"]  # the stream then comes from the tid ("stream 7")
        else:
            x["pid"] = pid
            x["tid"] = str(e["tid"]) if str_tid else e["tid"]
            args = {}
        if e["kind"] in ("call", "kernel", "memcpy", "memset"):
            if correlated:
                args["correlation"] = e["corr"]
            if e["ext"]:
                args["external id" if old else "External id"] = e["ext"]
            if e["kind"] == "call":
                args["cbid"] = 211
        elif e["ext"]:
            args["External id"] = e["ext"]
            if old:
                args.update({"Trace name": "PyTorch Profiler", "Trace iteration": 0})
        if "bytes" in e:
            args["bytes"] = e["bytes"]
        x["args"] = args
        events.append(x)
        if e["kind"] == "call" and e["name"] != "cudaStreamSynchronize":  # the flow arrow to its device row
            start = {"ph": "s", "id": e["corr"], "pid": x["pid"], "tid": x["tid"], "ts": x["ts"],
                     "cat": "async" if old else "ac2g", "name": "launch" if old else "ac2g"}
            events.append(start)
    meta_events = [
        {"name": "process_name", "ph": "M", "ts": ts(EPOCH_NS), "pid": pid, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_name", "ph": "M", "ts": ts(EPOCH_NS), "pid": DEVICE, "tid": 0, "args": {"name": "GPU 0"}},
        {"name": "thread_name", "ph": "M", "ts": ts(EPOCH_NS), "pid": pid, "tid": events[0]["tid"],
         "args": {"name": "thread 0 (python3)"}},
    ]
    trace: dict = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}]}
    if old:
        end = EPOCH_NS + 3_000_000_000
        events += [
            {"ph": "X", "cat": "Trace", "ts": ts(EPOCH_NS), "dur": dur(end - EPOCH_NS), "pid": "Spans",
             "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
            {"name": "process_sort_index", "ph": "M", "ts": ts(EPOCH_NS), "pid": "Spans", "tid": 0,
             "args": {"sort_index": 536870912}},
            {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
             "tid": "Trace PyTorch Profiler", "ts": ts(EPOCH_NS)},
            {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": ts(end)},
        ]
        trace["traceEvents"] = meta_events + events
    else:
        trace["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 1}
        trace["traceEvents"] = meta_events + events
        trace["traceName"] = "run.pt.trace.json"
        trace["baseTimeNanoseconds"] = BASE_NS  # after the events, as Kineto 2.x writes it
    path.write_text(json.dumps(trace, indent=1))
    return path


def _device(store: Store, sid: int, *, correlation: bool = True) -> list[tuple]:
    cols = "device, stream, kind, copy_kind, bytes, start_ns, end_ns, name, call_tid, call_ns"
    cols += ", correlation" if correlation else ""
    return store.con.execute(f"SELECT {cols} FROM device_activity WHERE session_id = $s ORDER BY ALL",
                             {"s": sid}).fetchall()


def _events(store: Store, sid: int) -> list[tuple]:
    return store.con.execute("""SELECT timestamp, duration_ns, pid, tid, op, kind, bytes, stream FROM events
                                WHERE session_id = $s ORDER BY ALL""", {"s": sid}).fetchall()


def _spans(store: Store, sid: int) -> list[tuple]:
    return store.con.execute("SELECT pid, tid, start_ns, end_ns, name, category FROM spans WHERE session_id = $s "
                             "ORDER BY ALL", {"s": sid}).fetchall()


def _steps(store: Store, sid: int) -> list[tuple]:
    st = imported.steps(store.con, sid)
    return [(s.number, s.start_ns, s.end_ns, s.dataloader_ns, s.device_busy_ns) for s in st.steps]


def _busy(store: Store, sid: int) -> tuple:
    d = imported.device(store.con, sid)
    return d.span_start_ns, d.span_end_ns, d.span_source, d.busy_ns, d.activities, d.busy_share


@pytest.fixture(scope="module")
def imported_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("formats")
    store = Store.memory()
    results = {shape: import_trace(store, write_run(shape, tmp / f"{shape}.json")) for shape in SHAPES}
    yield store, results
    store.close()


def test_the_run_as_written_today(imported_runs):
    """The reference itself: 3 steps of 1 ms minus 10 µs, 12 device rows, the copy's bytes on its call."""
    store, results = imported_runs
    r = results["new"]
    assert (r.calls, r.device) == (12, 12) and r.pids == [PID] and r.skipped == {}
    assert [s[0] for s in _steps(store, r.session_id)] == [1, 2, 3]
    assert all(s[2] - s[1] == 990_000 for s in _steps(store, r.session_id))
    copies = [e for e in _events(store, r.session_id) if e[4] == "cudaMemcpyAsync"]
    assert [(e[5], e[6], e[7]) for e in copies] == [("H2D", 1 << 20, STREAM)] * 3
    dev = _device(store, r.session_id)
    assert all(d[8] in (MAIN, AUTOGRAD) and d[9] is not None for d in dev)  # every row knows its call
    assert {d[0] for d in dev} == {DEVICE} and {d[1] for d in dev} == {STREAM}


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "new"])
def test_old_shapes_give_the_same_device_activity_steps_and_busy_share(imported_runs, shape):
    store, results = imported_runs
    new, old = results["new"].session_id, results[shape].session_id
    linked = shape != "1.8-no-correlation"
    assert _device(store, old, correlation=linked) == _device(store, new, correlation=linked)
    assert _steps(store, old) == _steps(store, new)
    assert _busy(store, old) == _busy(store, new)
    assert _events(store, old) == _events(store, new)
    assert _spans(store, old) == _spans(store, new)  # categories too: Operator split into cpu_op / user_annotation
    r = results[shape]
    assert (r.calls, r.device, r.spans, r.pids, r.skipped) == (12, 12, results["new"].spans, [PID], {})


def test_the_1_8_shape_counts_what_it_does_not_use(imported_runs):
    r = imported_runs[1]["1.8"]
    assert r.unused["Trace events"] == 1
    assert r.unused["instant events: Iteration Start: PyTorch Profiler"] == 1
    assert r.unused["instant events: Record Window End"] == 1
    assert r.unused["flow arrows: async"] == 12
    assert r.unused["CUDA calls without an op name: cudaMemsetAsync"] == 3


def test_without_correlation_the_kth_device_row_of_an_external_id_is_its_kth_launch(imported_runs):
    """addmm (one external id) launched two kernels: each is tied to its own launch, in order."""
    store, results = imported_runs
    sid = results["1.8-no-correlation"].session_id
    rows = store.con.execute("""SELECT d.name, d.call_ns, d.correlation FROM device_activity d
                                WHERE d.session_id = $s AND d.kind = 'kernel' ORDER BY d.start_ns""",
                             {"s": sid}).fetchall()
    launches = [e[0] for e in _events(store, sid) if e[4] == "cudaLaunchKernel"]
    assert [r[1] for r in rows] == launches and len(rows) == 6
    assert [r[0][:18] for r in rows[:2]] == ["void gemm_kernel_0", "void gemm_kernel_1"]
    assert all(r[2] is None for r in rows)  # the trace had no correlation id: none is made up


def _old_shape(trace: dict) -> dict:
    """A real (PyTorch 2.x) trace rewritten as PyTorch 1.8 wrote it, times unchanged."""
    old = {"Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
    to_old = {v: k for k, v in old.items()}
    out = copy.deepcopy(trace)
    device_cats = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
    for e in out["traceEvents"]:
        cat = e.get("cat")
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if cat in ("cpu_op", "user_annotation"):
            e["cat"] = "Operator"
        elif cat in to_old:
            e["cat"] = to_old[cat]
        elif cat == "gpu_user_annotation":
            e["cat"] = "gpu_user_Annotation"
        elif cat in ("ac2g",):
            e["cat"] = "async"
        if isinstance(e.get("tid"), int):
            e["tid"] = f"stream {e['tid']}" if cat in device_cats else str(e["tid"])
        if cat in ("cuda_runtime", *device_cats) and "External id" in args:
            args["external id"] = args.pop("External id")
    return out


@pytest.mark.parametrize("name", ["v100_rank0.pt.trace.json.gz", "alexnet_a100.json.gz"])
def test_a_real_trace_in_the_1_8_shape_gives_the_same_store(name, tmp_path):
    trace = truth.load(name)
    path = tmp_path / "old.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(_old_shape(trace), f)
    store = Store.memory()
    new = import_trace(store, truth.DATA / name).session_id
    old = import_trace(store, path).session_id
    assert _device(store, old) == _device(store, new)
    assert _events(store, old) == _events(store, new)
    assert _busy(store, old) == _busy(store, new)
    a, b = imported.device(store.con, new), imported.device(store.con, old)
    assert a == b
    if name.startswith("v100"):  # steps marked: the share is over the steps' span, as the truth takes it
        assert _steps(store, old) == _steps(store, new) and len(_steps(store, new)) == 5
        assert b.busy_share == pytest.approx(truth.busy_share(trace), abs=1e-6)  # the truth rounds ts*1000 itself
    # the spans, named and timed alike; Operator is split back into operators and PyTorch's ranges
    strip = lambda rows: [r[:5] for r in rows]  # noqa: E731
    assert strip(_spans(store, old)) == strip(_spans(store, new))
    cats = dict(store.con.execute("""SELECT category, count(*) FROM spans WHERE session_id = $s
                                     AND (starts_with(name, 'ProfilerStep#') OR starts_with(name, 'aten::'))
                                     GROUP BY ALL""", {"s": old}).fetchall())
    cats_new = dict(store.con.execute("""SELECT category, count(*) FROM spans WHERE session_id = $s
                                         AND (starts_with(name, 'ProfilerStep#') OR starts_with(name, 'aten::'))
                                         GROUP BY ALL""", {"s": new}).fetchall())
    assert cats == cats_new and set(cats) <= {"cpu_op", "user_annotation"}
