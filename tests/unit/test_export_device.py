"""`ingero export --format perfetto`: the device's tracks (export/device_tracks.py), decoded back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa

from analyze_helpers import MAIN_PID, SESSION, T0, US, Trace
from export_helpers import decode
from ingero.cli import main
from ingero.store.db import Store

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"


def traced_with_device(path: Path) -> Path:
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.loop(0, 2, launches=20, launch_us=6, launch_gap_us=25, device_ms=2, cpu_ms=2)
    store = tr.store(path)
    launches = sorted(e["timestamp"] for e in tr.events if e["op"] == "cudaLaunchKernel")
    rows = []
    for i, t in enumerate(launches):
        # stream 7: back to back, the second of each pair rounded 2 ns into the first
        rows.append({"session_id": SESSION, "pid": MAIN_PID, "device": 0, "stream": 7, "kind": "kernel",
                     "start_ns": t + 10 * US - (2 if i % 2 else 0), "end_ns": t + 20 * US,
                     "name": "gemm" if i % 2 else "relu", "correlation": i + 1})
    rows.append({"session_id": SESSION, "pid": MAIN_PID, "device": 0, "stream": 9, "kind": "memcpy",
                 "copy_kind": "H2D", "bytes": 4096, "start_ns": T0 + 100, "end_ns": T0 + 5000,
                 "name": "Memcpy HtoD (Pinned -> Device)"})
    rows.append({"session_id": SESSION, "pid": MAIN_PID, "device": 0, "stream": 7, "kind": "sync",
                 "start_ns": T0, "end_ns": T0 + 10**9, "name": "Stream Sync"})  # a host wait: not drawn
    store.append("device_activity", pa.Table.from_pylist(rows))
    store.close()
    return path


def test_each_stream_of_a_process_is_a_track_of_what_the_device_ran(tmp_path: Path, capsys) -> None:
    db = traced_with_device(tmp_path / "t.duckdb")
    out = tmp_path / "t.pftrace"
    assert main(["export", "--db", str(db), "--format", "perfetto", "-o", str(out)]) == 0
    kernels = Store.open(db).con.execute("SELECT count(*) FROM device_activity WHERE kind = 'kernel'").fetchone()[0]
    assert f"{kernels + 1:,} device slices" in capsys.readouterr().out
    d = decode(out)
    gpu = {u: t for u, t in d.tracks.items() if getattr(t, "name", "").startswith("GPU ")}
    procs = {u: t for u, t in d.tracks.items() if t.HasField("process") and not t.HasField("thread")}
    assert sorted(t.name for t in gpu.values()) == ["GPU 0 stream 7", "GPU 0 stream 9"]
    assert all(procs[t.parent_uuid].process.pid == MAIN_PID for t in gpu.values())
    slices = [s for s in d.slices if s.track in gpu]
    assert Counter(s.name for s in slices) == {"relu": kernels - kernels // 2, "gemm": kernels // 2,
                                               "Memcpy HtoD (Pinned -> Device)": 1}
    by_track: dict[int, list] = {}
    for s in sorted(slices, key=lambda s: (s.track, s.ts)):
        by_track.setdefault(s.track, []).append(s)
    for track in by_track.values():  # the 2 ns of rounding: clipped, so the slices do not cross
        assert all(a.end <= b.ts for a, b in zip(track, track[1:]))


def test_an_imported_traces_timeline_gets_device_tracks(tmp_path: Path) -> None:
    db, out = tmp_path / "i.duckdb", tmp_path / "i.pftrace"
    assert main(["import", "--db", str(db), str(KINETO / "alexnet_a100.json.gz")]) == 0
    assert main(["export", "--db", str(db), "--format", "perfetto", "-o", str(out)]) == 0
    con = Store.open(db).con
    rows = con.execute("SELECT count(*) FROM device_activity WHERE kind <> 'sync'").fetchone()[0]
    d = decode(out)
    gpu = {u for u, t in d.tracks.items() if getattr(t, "name", "").startswith("GPU ")}
    assert gpu and len([s for s in d.slices if s.track in gpu]) == rows
