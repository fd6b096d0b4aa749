"""`ingero export --format perfetto`: decoded back with the perfetto package's protobuf classes,
the file holds exactly the store's selection, and every chain's arrows join a cause to a CUDA call
it delayed inside an evidence window.

The decoder (export_helpers.decode) reads the file as trace_processor does:
per packet sequence its defaults, interned strings and incremental clock.
trace_processor itself cannot check the file here: the perfetto wheel (0.59.1)
fetches trace_processor_shell from Google's servers at run time (its
prebuilts/manifests hold only URLs), which these machines cannot resolve, and no
registry package ships the binary.  Checked 2026-11-26: PyPI perfetto-cli 0.3.0,
perfetto-extras 0.3.4 and quick-perf-tracer 1.0.0 are pure-Python wheels that call
the same downloader or take a --tp-path; Debian bookworm (apt-cache search
perfetto, trace-processor) has none; npm has no ``perfetto`` package (404), and
its only perfetto-named entry, perftrace, writes Trace Event JSON.

The C encoder (ingero/export/_wire.c) and the numpy one must write the same bytes:
the tests below compare them on the whole pipeline and on random rows.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import pytest

from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.cli import main
from ingero.demo import scenarios
from ingero.export import flows
from ingero.export import threads
from ingero.export.threads import _clip_stack, _markers_c, _markers_numpy, _order, clip
from ingero.export.selection import select
from ingero.store.db import Store
from export_helpers import decode, make_db

# replays.py's cache serves this module and the other replay users on one worker
pytestmark = pytest.mark.xdist_group("replays")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return make_db(tmp_path_factory.mktemp("export") / "cpu.duckdb")


def _export(db: Path, out: Path, *extra: str) -> Path:
    assert main(["export", "--db", str(db), "--format", "perfetto", "-o", str(out), *extra]) == 0
    return out


def _thread_slices(d):
    return [s for s in d.slices if d.tracks[s.track].HasField("thread")]


def test_slices_per_op_equal_the_store(db: Path, tmp_path: Path) -> None:
    d = decode(_export(db, tmp_path / "t.pftrace"))
    con = duckdb.connect(str(db), read_only=True)
    want = Counter(dict(con.execute(
        "SELECT CASE WHEN op = 'sched_switch' THEN (CASE WHEN preempted THEN 'preempted' ELSE 'blocked' END) "
        "ELSE op END, count(*) FROM events GROUP BY ALL").fetchall()))
    got = Counter("preempted" if s.name.startswith("preempted by ") else s.name for s in _thread_slices(d))
    got.update(i.name for i in d.instants if i.name in ("page_fault", "block_io"))
    assert got == want
    # one thread track per traced thread, under its process track
    threads = {(t.thread.pid, t.thread.tid) for t in d.tracks.values() if t.HasField("thread")}
    assert threads == set(con.execute("SELECT DISTINCT pid, tid FROM events").fetchall())
    procs = {t.uuid: t.process.pid for t in d.tracks.values() if t.HasField("process")}
    assert all(procs[t.parent_uuid] == t.thread.pid for t in d.tracks.values() if t.HasField("thread"))
    # CUDA args: bytes/stream/ret as stored
    copies = sorted(s.args.get("bytes") for s in _thread_slices(d) if s.name == "cudaMemcpyAsync")
    assert copies == sorted(r[0] for r in con.execute(
        "SELECT bytes FROM events WHERE op = 'cudaMemcpyAsync'").fetchall())
    assert {s.args.get("ret") for s in _thread_slices(d) if s.name.startswith("cu")} <= {0, None}


def test_counter_tracks_hold_every_sample(tmp_path: Path) -> None:
    db = make_db(tmp_path / "c.duckdb")
    con = duckdb.connect(str(db))
    # the replay records no RSS or NVML samples: add some, one a second, as the samplers do
    con.execute("INSERT INTO process_memory (session_id, timestamp, pid, comm, rss_bytes) "
                "SELECT 1, ts, pid, 'python3', 1000000 * pid::BIGINT + ts // 1000000000 % 97 FROM "
                "(SELECT DISTINCT pid FROM events WHERE op LIKE 'cuda%'), "
                "range(1763800000000000000, 1763800030000000000, 1000000000) t(ts)")
    con.execute("UPDATE sessions SET rank = 3")  # as an imported trace's distributedInfo sets it
    con.execute("INSERT INTO gpu_metrics (session_id, timestamp, gpu, util_pct) "
                "SELECT 1, ts, 0, ts // 1000000000 % 100 FROM range(1763800000000000000, 1763800030000000000, "
                "1000000000) t(ts)")
    con.close()
    d = decode(_export(db, tmp_path / "t.pftrace"))
    con = duckdb.connect(str(db), read_only=True)
    by_name = {t.name: d.counters[u] for u, t in d.tracks.items() if t.HasField("counter")}
    # samples inside the selection: the session's events span (a last sample after the last event is out)
    end = con.execute("SELECT max(timestamp) FROM events").fetchall()[0][0]
    for name, sql in (("CPU %", "SELECT timestamp, cpu_pct FROM system_metrics"),
                      ("GPU 0 util %", "SELECT timestamp, util_pct FROM gpu_metrics"),
                      ("RSS", "SELECT timestamp, rss_bytes FROM process_memory")):
        want = con.execute(f"{sql} WHERE timestamp <= $end ORDER BY timestamp", {"end": end}).fetchall()
        assert len(want) >= 29 and by_name[name] == [(ts, float(v)) for ts, v in want], name
    procs = [t.process.process_name for t in d.tracks.values() if t.HasField("process")]
    assert procs and all(n.endswith(" rank 3") for n in procs)
    rss = next(t for t in d.tracks.values() if t.name == "RSS")
    assert d.tracks[rss.parent_uuid].process.pid == con.execute(
        "SELECT DISTINCT pid FROM events WHERE op LIKE 'cuda%'").fetchall()[0][0]


def test_off_cpu_slices_name_the_preempting_process(db: Path, tmp_path: Path) -> None:
    d = decode(_export(db, tmp_path / "t.pftrace"))
    con = duckdb.connect(str(db), read_only=True)
    want = Counter(dict(con.execute(
        "SELECT 'preempted by ' || n.name || ' (' || e.other_pid || ')', count(*) FROM events e "
        "JOIN process_names n ON n.pid = e.other_pid WHERE e.op = 'sched_switch' AND e.preempted "
        "GROUP BY ALL").fetchall()))
    assert want and all("cpu-hog" in k for k in want)
    assert Counter(s.name for s in _thread_slices(d) if s.name.startswith("preempted by ")) == want


def test_every_flow_joins_a_cause_to_a_cuda_call_in_an_evidence_window(db: Path, tmp_path: Path) -> None:
    d = decode(_export(db, tmp_path / "t.pftrace"))
    store = Store.open(db, read_only=True)
    chains = explain(store.con, Options()).chains
    store.close()
    assert chains[0].rule_id == "cpu-contention"
    windows = [w for c in chains for w in c.evidence_windows]
    sources = {f: s for s in d.slices + d.instants for f in s.flow_ids}
    ends = {f: i for i in d.instants for f in i.terminating}
    assert sources and set(sources) == set(ends)
    threads = _thread_slices(d)
    for fid, end in ends.items():
        effect = [s for s in threads if s.track == end.track and s.ts <= end.ts < s.end and s.name.startswith("cu")]
        assert len(effect) == 1, fid
        e = effect[0]
        assert any(e.ts < w.end_ns and e.end > w.start_ns for w in windows)
        cause = sources[fid]
        if cause.name.startswith("preempted by "):  # a preemption inside the call it delayed
            assert cause.track == e.track and e.ts <= cause.ts < e.end
        else:
            assert d.tracks[cause.track].parent_uuid  # a chain's marker slice
    # every chain has arrows, and a marker track with its title and severity
    markers = {s.name for s in d.slices if not d.tracks[s.track].HasField("thread")}
    assert {f"[{c.severity}] {c.title}" for c in chains} <= markers


@pytest.mark.parametrize("name", [n for n in scenarios.names() if scenarios.get(n).expected_rule])
def test_every_chain_of_every_scenario_has_arrows(name: str, tmp_path: Path) -> None:
    store = Store.open(make_db(tmp_path / "s.duckdb", name), read_only=True)
    sel = select(store.con, Options())
    chains = explain(store.con, Options()).chains
    arrows = flows.plan(store.con, chains, sel.params())
    store.close()
    assert chains and chains[0].rule_id == scenarios.get(name).expected_rule
    assert all(0 < n <= flows.MAX_FLOWS_PER_CHAIN for n in arrows.per_chain), list(zip(
        [c.rule_id for c in chains], arrows.per_chain))


def test_pid_and_since_narrow_the_selection(db: Path, tmp_path: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    loop = con.execute("SELECT pid FROM events WHERE op LIKE 'cuda%' LIMIT 1").fetchone()[0]
    end = con.execute("SELECT max(timestamp) + 1 FROM events").fetchone()[0]
    d = decode(_export(db, tmp_path / "p.pftrace", "--pid", str(loop), "--since", "10s"))
    want = con.execute("SELECT count(*) FROM events WHERE pid = $p AND timestamp >= $t AND op <> 'page_fault' "
                       "AND op <> 'block_io'", {"p": loop, "t": end - 10 * 10**9}).fetchone()[0]
    assert len(_thread_slices(d)) == want
    assert {t.thread.pid for t in d.tracks.values() if t.HasField("thread")} == {loop}


def test_file_is_private_and_never_overwritten_without_force(db: Path, tmp_path: Path, capsys) -> None:
    out = _export(db, tmp_path / "t.pftrace")
    assert stat.S_IMODE(out.stat().st_mode) in (0o600, 0o640)
    before = out.read_bytes()
    assert main(["export", "--db", str(db), "--format", "perfetto", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err and "--force" in err
    assert out.read_bytes() == before
    _export(db, out, "--force")
    assert sorted(os.listdir(tmp_path)) == ["t.pftrace"]


@pytest.mark.parametrize("args, message", [
    (["--format", "svg"], "unknown format 'svg'"),
    (["--format", "perfetto", "--pid", "999999"], "holds no events of PID 999999"),
    (["--format", "parquet", "--pid", "999999"], "holds no events of PID 999999"),
    (["--format", "perfetto", "--session", "77"], "no session 77"),
])
def test_bad_input_is_one_line_exit_2_and_no_file(db: Path, tmp_path: Path, capsys, args, message) -> None:
    out = tmp_path / "x"
    assert main(["export", "--db", str(db), "-o", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fmt", ["perfetto", "parquet"])
def test_unwritable_path_is_one_line_exit_2(db: Path, tmp_path: Path, capsys, fmt) -> None:
    for out in (tmp_path / "no" / "such" / "dir" / "x", Path("/proc/ingero-export-test")):
        assert main(["export", "--db", str(db), "--format", fmt, "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot write" in err, err
    assert os.listdir(tmp_path) == []


def test_bulk_clipping_equals_the_stack_walk() -> None:
    """Slices nest on a track: the array passes clip exactly as a stack of open slices does,
    at any depth (random intervals, some zero-length, some instants, some carried over)."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        n = int(rng.integers(1, 80))
        ts = rng.integers(0, 300, n)
        dur = rng.integers(0, 80, n) * (rng.random(n) < 0.9)
        order = np.lexsort((-dur, ts))
        ts, end = ts[order], (ts + dur)[order]
        is_slice = rng.random(n) < 0.8
        fixed = np.zeros(n, bool)
        want = _clip_stack(ts, end, is_slice, fixed)
        assert np.array_equal(clip(ts, end, is_slice, fixed)[is_slice], want[is_slice])


def test_cutting_into_windows_changes_nothing(db: Path, tmp_path: Path, monkeypatch) -> None:
    """Slices open at a window's end are carried into the next: one-second windows give the same
    slices, instants and arrows as windows of the whole session."""
    from ingero.export import perfetto

    def content(path: Path):
        d = decode(path)
        return (sorted((s.track, s.ts, s.end, s.name, tuple(sorted(s.args.items())), tuple(s.flow_ids))
                       for s in d.slices),
                sorted((i.track, i.ts, i.name, tuple(i.flow_ids), tuple(i.terminating)) for i in d.instants))

    whole = content(_export(db, tmp_path / "whole.pftrace"))
    monkeypatch.setattr(perfetto, "WINDOW_ROWS", 1)
    cut = content(_export(db, tmp_path / "cut.pftrace"))
    assert cut == whole and len(whole[0]) > 1000


def test_the_c_encoder_is_built() -> None:
    """setup.py builds it with the package (make setup installs gcc and the Python headers);
    without it the export falls back to numpy at ~1/3 of the speed."""
    assert threads._wire is not None


@pytest.mark.parametrize("window_rows", [1, 200_000])
def test_c_and_numpy_write_the_same_bytes(db: Path, tmp_path: Path, monkeypatch, window_rows: int) -> None:
    """The whole export, with slices carried across one-second windows and not: byte for byte."""
    from ingero.export import perfetto

    monkeypatch.setattr(perfetto, "WINDOW_ROWS", window_rows)
    c = _export(db, tmp_path / "c.pftrace").read_bytes()
    monkeypatch.setattr(threads, "_wire", None)
    py = _export(db, tmp_path / "numpy.pftrace").read_bytes()
    assert c == py and len(c) > 100_000


def test_c_markers_equal_the_numpy_markers_on_random_rows() -> None:
    """Clipping (as the stack walk), marker order, time deltas and the cut: random threads of nested
    and overlapping slices (some zero-length, some starting together), instants, delay marks."""
    if threads._wire is None:
        pytest.skip("the C encoder is not built (test_the_c_encoder_is_built fails)")
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 120))
        nthreads = int(rng.integers(1, 4))
        tidx = rng.integers(0, nthreads, n)
        ts = rng.integers(0, 400, n) + 1000
        dur = rng.integers(0, 90, n) * (rng.random(n) < 0.85)
        is_slice = rng.random(n) < 0.8
        end = np.where(is_slice, ts + dur, ts)
        fixed = np.zeros(n, bool)
        has_dly = is_slice & (rng.random(n) < 0.2)
        cutoff = int(rng.integers(1000, 1500)) if rng.random() < 0.5 else np.iinfo(np.int64).max
        order = _order(tidx, ts, dur)
        last_c, last_py = np.full(nthreads, 900), np.full(nthreads, 900)
        got = _markers_c(order, tidx, ts, end, is_slice, fixed, has_dly, cutoff, last_c)
        want = _markers_numpy(order, tidx, ts, end, is_slice, fixed, has_dly, cutoff, last_py)
        assert np.array_equal(got[0][is_slice], want[0][is_slice])
        for a, b in zip(got[1:], want[1:]):
            assert np.array_equal(a, b)
        assert np.array_equal(last_c, last_py)
        for k in range(nthreads):  # the clipping is the stack walk's
            rows = order[tidx[order] == k]
            stack = _clip_stack(ts[rows], end[rows], is_slice[rows], fixed[rows])
            assert np.array_equal(got[0][rows][is_slice[rows]], stack[is_slice[rows]])


def test_a_negative_duration_is_a_zero_length_slice(tmp_path: Path) -> None:
    """Clock skew between probes can store an end before the start: the slice ends where it
    begins (a sequence's incremental clock cannot run back), its neighbours are unchanged."""
    db = make_db(tmp_path / "neg.duckdb")
    con = duckdb.connect(str(db))
    ts = con.execute("SELECT min(timestamp) FROM events WHERE op = 'cudaStreamSync'").fetchone()[0]
    con.execute("UPDATE events SET duration_ns = -5000 WHERE op = 'cudaStreamSync' AND timestamp = $t", {"t": ts})
    lo, hi = con.execute("SELECT min(timestamp), max(timestamp + greatest(duration_ns, 0)) FROM events").fetchone()
    n = con.execute("SELECT count(*) FROM events WHERE op NOT IN ('page_fault', 'block_io')").fetchone()[0]
    con.close()
    d = decode(_export(db, tmp_path / "neg.pftrace"))
    slices = _thread_slices(d)
    assert len(slices) == n
    assert [(s.ts, s.end) for s in slices if s.ts == ts and s.name == "cudaStreamSync"] == [(ts, ts)]
    assert all(lo <= s.ts <= s.end <= hi for s in slices)


def test_interned_sets_without_the_matrix_write_the_same_bytes(db: Path, tmp_path: Path, monkeypatch) -> None:
    """Past _SENT_MATRIX_MAX (threads x names) which iids a sequence was sent is kept in sets:
    the same packets."""
    whole = _export(db, tmp_path / "matrix.pftrace").read_bytes()
    monkeypatch.setattr(threads, "_SENT_MATRIX_MAX", 0)
    assert _export(db, tmp_path / "sets.pftrace").read_bytes() == whole
