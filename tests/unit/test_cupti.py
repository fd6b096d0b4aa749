"""CUPTI's records -> device_activity (collect/cupti.py, cupti_inject.c): the ring, the clock, the join.

No eBPF and no GPU: the ring is written by hand or by the injection library
itself loaded into a small ctypes loop on the simulated runtime, whose CUPTI
stand-in (demos/simcupti) feeds it from the virtual device; the join runs
against a hand-made events table in DuckDB.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import prereqs
from ingero.collect import cupti, cupti_inject
from ingero.collect.nvtx_inject import compiler
from ingero.store.db import Store

REPO = Path(__file__).resolve().parents[2]
S = 1_000_000_000
US = 1_000
SID = 1
PID, TID = 4242, 4243
OFFSET = 1_700_000_000 * S  # events.timestamp = CLOCK_MONOTONIC + this
CUPTI_SKEW = 1_763_000_000 * S  # CUPTI's clock (CLOCK_REALTIME) = CLOCK_MONOTONIC + this


def rec(type_: int, **fields) -> np.ndarray:
    r = np.zeros(1, cupti.RECORD_DTYPE)
    r["type"] = type_
    for k, v in fields.items():
        r[k] = v
    return r


def name_recs(nid: int, text: str) -> np.ndarray:
    raw = text.encode()
    parts = [raw[i:i + cupti.NAME_PART] for i in range(0, len(raw), cupti.NAME_PART)] or [b""]
    out = np.zeros(len(parts), cupti.NAME_DTYPE)
    for i, p in enumerate(parts):
        out[i] = (cupti.REC_NAME, i, len(p), int(i == len(parts) - 1), 0, nid, 0, p)
    return out.view(cupti.RECORD_DTYPE)


def clock(mono: int) -> np.ndarray:
    return rec(cupti.REC_CLOCK, start=mono + CUPTI_SKEW, end=mono, bytes=100)


def api(cbid: int, corr: int, start_mono: int, end_mono: int, tid: int = TID, domain: int = 2) -> np.ndarray:
    return rec(cupti.REC_API, kind=domain, start=start_mono + CUPTI_SKEW, end=end_mono + CUPTI_SKEW, tid=tid,
               correlation=corr, name=(domain << 32) | cbid)


def kernel(corr: int, start_mono: int, end_mono: int, name_id: int = 0x1000, stream: int = 7) -> np.ndarray:
    return rec(cupti.REC_KERNEL, start=start_mono + CUPTI_SKEW, end=end_mono + CUPTI_SKEW, correlation=corr,
               name=name_id, stream=stream)


LAUNCH, MEMCPY = 211, 31  # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, cudaMemcpy_v3020


@pytest.fixture()
def store():
    s = Store.memory()
    yield s
    s.close()


def add_calls(store: Store, rows: list[tuple[str, int, int]], tid: int = TID) -> None:
    """events rows (op, CLOCK_MONOTONIC start, duration) of the traced thread."""
    import pyarrow as pa

    store.append("events", pa.Table.from_pylist([
        {"session_id": SID, "timestamp": t + OFFSET, "duration_ns": d, "pid": PID, "tid": tid, "op": op}
        for op, t, d in rows]))


def names() -> np.ndarray:
    return np.concatenate([name_recs((2 << 32) | LAUNCH, "cudaLaunchKernel_v7000"),
                           name_recs((2 << 32) | MEMCPY, "cudaMemcpy_v3020"),
                           name_recs(0x1000, "void at::native::vectorized_elementwise_kernel<4, "
                                             "at::native::FillFunctor<float>>(int, T2, T3)")])


# --- the mirror of cupti_ring.h ----------------------------------------------------

PARITY_C = r"""
#include <stddef.h>
#include <stdio.h>
#include "cupti_ring.h"
#define F(s, f) printf("%s.%s %zu %zu\n", #s, #f, offsetof(struct s, f), sizeof(((struct s *)0)->f))
int main(void) {
    printf("rec %zu name %zu ring %zu\n", sizeof(struct ingero_cupti_rec), sizeof(struct ingero_cupti_name),
           sizeof(struct ingero_cupti_ring));
    F(ingero_cupti_rec, type); F(ingero_cupti_rec, kind); F(ingero_cupti_rec, src); F(ingero_cupti_rec, dst);
    F(ingero_cupti_rec, device); F(ingero_cupti_rec, start); F(ingero_cupti_rec, end); F(ingero_cupti_rec, bytes);
    F(ingero_cupti_rec, name); F(ingero_cupti_rec, stream); F(ingero_cupti_rec, correlation);
    F(ingero_cupti_rec, tid); F(ingero_cupti_rec, context); F(ingero_cupti_rec, runtime_correlation);
    F(ingero_cupti_rec, pad);
    F(ingero_cupti_name, type); F(ingero_cupti_name, part); F(ingero_cupti_name, len); F(ingero_cupti_name, last);
    F(ingero_cupti_name, pad); F(ingero_cupti_name, id); F(ingero_cupti_name, pad2); F(ingero_cupti_name, text);
    F(ingero_cupti_ring, magic); F(ingero_cupti_ring, version); F(ingero_cupti_ring, rec_size);
    F(ingero_cupti_ring, capacity); F(ingero_cupti_ring, pid); F(ingero_cupti_ring, flags);
    F(ingero_cupti_ring, cupti_version); F(ingero_cupti_ring, head); F(ingero_cupti_ring, tail);
    F(ingero_cupti_ring, dropped); F(ingero_cupti_ring, cupti_records); F(ingero_cupti_ring, buffers);
    F(ingero_cupti_ring, handled_ns); F(ingero_cupti_ring, note);
    printf("magic %llx version %d header %d part %d\n", INGERO_CUPTI_MAGIC, INGERO_CUPTI_VERSION,
           INGERO_CUPTI_HEADER_BYTES, INGERO_CUPTI_NAME_PART);
    printf("types %d %d %d %d %d %d %d %d flags %d %d %d\n", CUPTI_REC_CLOCK, CUPTI_REC_KERNEL, CUPTI_REC_MEMCPY,
           CUPTI_REC_MEMSET, CUPTI_REC_SYNC, CUPTI_REC_API, CUPTI_REC_NAME, CUPTI_REC_DROPPED,
           CUPTI_RING_READY, CUPTI_RING_FAILED, CUPTI_RING_CLOSED);
    return 0;
}
"""


def test_the_python_mirror_matches_cupti_ring_h(tmp_path: Path) -> None:
    cc = prereqs.needs(compiler(), "a C compiler", "make setup installs gcc")
    src = tmp_path / "parity.c"
    src.write_text(PARITY_C)
    subprocess.run([cc, f"-I{cupti_inject.RING_HEADER.parent}", "-o", str(tmp_path / "parity"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "parity")], capture_output=True, text=True, check=True).stdout.splitlines()
    sizes = out[0].split()
    assert (int(sizes[1]), int(sizes[3])) == (cupti.RECORD_DTYPE.itemsize, cupti.NAME_DTYPE.itemsize)
    assert int(sizes[5]) <= cupti.HEADER_BYTES
    dtypes = {"ingero_cupti_rec": cupti.RECORD_DTYPE, "ingero_cupti_name": cupti.NAME_DTYPE,
              "ingero_cupti_ring": cupti.RING_HEADER_DTYPE}
    for line in out[1:-2]:
        field, off, size = line.split()
        struct, name = field.split(".")
        dt, at = dtypes[struct].fields[name]
        assert (at, dt.itemsize) == (int(off), int(size)), field
    magic = out[-2].split()
    assert int(magic[1], 16) == cupti.MAGIC and int(magic[3]) == cupti.VERSION
    assert int(magic[5]) == cupti.HEADER_BYTES and int(magic[7]) == cupti.NAME_PART
    types = [int(x) for x in out[-1].split()[1:9]]
    assert types == [cupti.REC_CLOCK, cupti.REC_KERNEL, cupti.REC_MEMCPY, cupti.REC_MEMSET, cupti.REC_SYNC,
                     cupti.REC_API, cupti.REC_NAME, cupti.REC_DROPPED]
    assert [int(x) for x in out[-1].split()[10:]] == [cupti.RING_READY, cupti.RING_FAILED, cupti.RING_CLOSED]


# --- names and the clock -------------------------------------------------------------

def test_cupti_call_names_map_to_the_ops_the_tracer_stores() -> None:
    assert cupti.op_for_call("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert cupti.op_for_call("cudaLaunchKernel_ptsz_v7000") == "cudaLaunchKernel"
    assert cupti.op_for_call("cudaMemcpyAsync_v3020") == "cudaMemcpyAsync"
    assert cupti.op_for_call("cudaStreamSynchronize_v3020") == "cudaStreamSync"
    assert cupti.op_for_call("cuMemcpyHtoD_v2") == "cuMemcpy"
    assert cupti.op_for_call("cuLaunchKernel") == "cuLaunchKernel"
    assert cupti.op_for_call("cudaMemset_v3020") is None  # not traced: no row to join


def test_the_clock_is_mapped_between_measured_pairs_to_the_nanosecond() -> None:
    p = cupti._Process()
    # two pairs 10 s apart; CUPTI's clock runs 1 µs fast over them (a slewed CLOCK_REALTIME)
    p.pairs_cupti += [CUPTI_SKEW + 5 * S, CUPTI_SKEW + 15 * S + 1_000]
    p.pairs_mono += [5 * S, 15 * S]
    t = np.array([CUPTI_SKEW + 5 * S, CUPTI_SKEW + 10 * S + 500, CUPTI_SKEW + 15 * S + 1_000,
                  CUPTI_SKEW + 20 * S + 1_000], np.uint64)
    assert p.to_mono(t).tolist() == [5 * S, 10 * S, 15 * S, 20 * S]  # past the last pair: its offset


# --- the join ------------------------------------------------------------------------------

def test_each_kernel_row_joins_the_launch_that_submitted_it(store: Store) -> None:
    t0 = 100 * S
    add_calls(store, [("cudaLaunchKernel", t0, 8 * US), ("cudaLaunchKernel", t0 + 20 * US, 8 * US)])
    j = cupti.DeviceJoin(SID, OFFSET)
    j.feed(PID, np.concatenate([names(), clock(t0 - S),
                                api(LAUNCH, 7, t0 + 1 * US, t0 + 6 * US), api(LAUNCH, 8, t0 + 21 * US, t0 + 27 * US),
                                kernel(7, t0 + 9 * US, t0 + 30 * US), kernel(8, t0 + 30 * US, t0 + 51 * US)]))
    assert j.take(store.con, now_mono=t0 + 1 * S) is None  # the calls' rows may not be stored yet
    rows = j.take(store.con, now_mono=t0 + 4 * S).to_pylist()
    assert [(r["kind"], r["correlation"], r["call_tid"], r["call_ns"], r["pid"]) for r in rows] == [
        ("kernel", 7, TID, t0 + OFFSET, PID), ("kernel", 8, TID, t0 + 20 * US + OFFSET, PID)]
    assert [(r["start_ns"] - OFFSET, r["end_ns"] - OFFSET) for r in rows] == [
        (t0 + 9 * US, t0 + 30 * US), (t0 + 30 * US, t0 + 51 * US)]
    assert rows[0]["name"].startswith("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor")
    assert j.joined == 2 and j.kinds == {"kernel": 2}


def test_a_call_the_tracer_did_not_record_keeps_cuptis_start(store: Store) -> None:
    t0 = 100 * S
    add_calls(store, [("cudaLaunchKernel", t0, 8 * US)], tid=TID + 1)  # another thread's launch
    j = cupti.DeviceJoin(SID, OFFSET)
    j.feed(PID, np.concatenate([names(), clock(t0), api(LAUNCH, 3, t0 + 1 * US, t0 + 6 * US),
                                kernel(3, t0 + 9 * US, t0 + 30 * US)]))
    (row,) = j.take(store.con, now_mono=t0 + 4 * S).to_pylist()
    assert (row["call_tid"], row["call_ns"]) == (TID, t0 + 1 * US + OFFSET) and j.joined == 0


def test_a_kernel_without_its_call_is_stored_without_one_at_the_end(store: Store) -> None:
    t0 = 100 * S
    j = cupti.DeviceJoin(SID, OFFSET)
    j.feed(PID, np.concatenate([names(), clock(t0), kernel(0, t0, t0 + 5 * US), kernel(99, t0, t0 + 5 * US)]))
    assert j.take(store.con, now_mono=t0 + 4 * S) is None  # its API record may still come
    rows = j.take(store.con, now_mono=t0 + 4 * S, final=True).to_pylist()
    assert [(r["correlation"], r["call_tid"], r["call_ns"]) for r in rows] == [(None, None, None), (99, None, None)]


def test_a_copy_joins_its_runtime_call_and_is_named_like_kineto(store: Store) -> None:
    t0 = 100 * S
    add_calls(store, [("cudaMemcpy", t0, 40 * US)])
    cp = rec(cupti.REC_MEMCPY, kind=1, src=1, dst=3, bytes=65536, start=t0 + 5 * US + CUPTI_SKEW,
             end=t0 + 30 * US + CUPTI_SKEW, correlation=55, runtime_correlation=5)
    j = cupti.DeviceJoin(SID, OFFSET)
    j.feed(PID, np.concatenate([names(), clock(t0), api(MEMCPY, 5, t0 + 1 * US, t0 + 39 * US), cp]))
    (row,) = j.take(store.con, now_mono=t0 + 4 * S).to_pylist()
    assert (row["kind"], row["copy_kind"], row["bytes"], row["name"]) == (
        "memcpy", "H2D", 65536, "Memcpy HtoD (Pageable -> Device)")
    assert (row["correlation"], row["call_ns"]) == (55, t0 + OFFSET)


def test_the_runtime_call_wins_over_the_driver_call_inside_it(store: Store) -> None:
    t0 = 100 * S
    add_calls(store, [("cudaLaunchKernel", t0, 10 * US)])
    j = cupti.DeviceJoin(SID, OFFSET)
    j.feed(PID, np.concatenate([names(), name_recs((1 << 32) | 307, "cuLaunchKernel"), clock(t0),
                                api(307, 9, t0 + 3 * US, t0 + 5 * US, domain=1),
                                api(LAUNCH, 9, t0 + 1 * US, t0 + 8 * US), kernel(9, t0 + 11 * US, t0 + 20 * US)]))
    (row,) = j.take(store.con, now_mono=t0 + 4 * S).to_pylist()
    assert row["call_ns"] == t0 + OFFSET and j.joined == 1


def test_host_waits_are_stored_as_sync_rows() -> None:
    t0 = 100 * S
    j = cupti.DeviceJoin(SID, OFFSET)
    j.feed(PID, np.concatenate([clock(t0), rec(cupti.REC_SYNC, kind=3, start=t0 + CUPTI_SKEW,
                                               end=t0 + 50 * US + CUPTI_SKEW, stream=7)]))
    store = Store.memory()
    try:
        (row,) = j.take(store.con, now_mono=t0, final=True).to_pylist()
    finally:
        store.close()
    assert (row["kind"], row["name"], row["bytes"], row["end_ns"] - row["start_ns"]) == ("sync", "Stream Sync",
                                                                                         None, 50 * US)


# --- the ring ---------------------------------------------------------------------------

def write_ring(path: Path, pid: int, capacity: int = 1024, head: int = 0, tail: int = 0,
               records: np.ndarray | None = None, magic: int = cupti.MAGIC) -> None:
    hdr = np.zeros(1, cupti.RING_HEADER_DTYPE)
    hdr["magic"], hdr["version"], hdr["rec_size"], hdr["capacity"] = magic, cupti.VERSION, 64, capacity
    hdr["pid"], hdr["head"], hdr["tail"], hdr["note"] = pid, head, tail, b"CUPTI (API version 130001): kernels"
    body = np.zeros(capacity, cupti.RECORD_DTYPE)
    if records is not None:
        for i, r in enumerate(records):
            body[(tail + i) % capacity] = r
    path.write_bytes(hdr.tobytes() + body.tobytes())


def test_a_ring_is_read_across_its_wrap_and_its_tail_stored(tmp_path: Path) -> None:
    recs = np.concatenate([kernel(c, c, c + 1) for c in range(1, 11)])
    path = tmp_path / "77.ring"
    write_ring(path, 77, head=1020 + 10, tail=1020, records=recs)
    ring = cupti.Ring(path, 77)
    got = ring.read()
    assert got["correlation"].tolist() == list(range(1, 11))
    assert ring.read().size == 0 and ring.header()["note"] == "CUPTI (API version 130001): kernels"
    ring.close()
    raw = np.frombuffer(path.read_bytes(), np.uint64, count=32)
    assert int(raw[128 // 8]) == 1030  # the writer sees the room


def test_a_ring_that_is_not_one_is_refused_and_a_head_out_of_range_read_as_nothing(tmp_path: Path) -> None:
    write_ring(tmp_path / "5.ring", 5, magic=1)
    write_ring(tmp_path / "6.ring", 7)  # its header names another process
    (tmp_path / "8.ring").write_bytes(b"\0" * 100)
    write_ring(tmp_path / "9.ring", 9, head=5000, tail=0)
    rings = cupti.Rings(tmp_path)
    rings.scan({5, 6, 8, 9})
    assert set(rings.rings) == {9} and rings.refused == {"5.ring", "6.ring", "8.ring"}
    assert rings.rings[9].read().size == 0 and rings.rings[9].corrupt == 1
    rings.close()


def test_a_ring_linked_elsewhere_is_refused_and_its_note_is_printable(tmp_path: Path) -> None:
    write_ring(tmp_path / "3.ring", 3)
    os.link(tmp_path / "3.ring", tmp_path / "other")  # the tracer would write into that file too
    write_ring(tmp_path / "4.ring", 4)
    raw = bytearray((tmp_path / "4.ring").read_bytes())
    raw[256:256 + 12] = b"ok\x1b[2Jbad\n\xff\0"
    (tmp_path / "4.ring").write_bytes(bytes(raw))
    rings = cupti.Rings(tmp_path)
    rings.scan({3, 4})
    assert set(rings.rings) == {4} and rings.refused == {"3.ring"}
    assert rings.rings[4].header()["note"] == "ok?[2Jbad??"
    rings.close()


def test_a_ring_is_opened_only_once_its_process_is_traced(tmp_path: Path) -> None:
    write_ring(tmp_path / "9.ring", 9)
    rings = cupti.Rings(tmp_path)
    rings.scan({1, 2})
    assert rings.rings == {}
    rings.scan({9})
    assert set(rings.rings) == {9}
    rings.close()


# --- the injection library ------------------------------------------------------------------

def test_the_injection_library_is_built_once_per_source_and_headers(tmp_path: Path) -> None:
    prereqs.needs(compiler(), "a C compiler", "make setup installs gcc")
    include = prereqs.needs(cupti_inject.find_headers(), "NVIDIA's CUPTI headers (cupti.h)",
                            "install the CUDA toolkit (/usr/local/cuda*/include)")
    built = cupti_inject.library(cache=tmp_path, include=include)
    assert built.why_not is None and built.path.name == cupti_inject.LIB_NAME
    assert oct(built.path.stat().st_mode & 0o777) == "0o644"
    mtime = built.path.stat().st_mtime_ns
    assert cupti_inject.library(cache=tmp_path, include=include).path.stat().st_mtime_ns == mtime  # cached
    nm = subprocess.run(["nm", "-D", "--defined-only", str(built.path)], capture_output=True, text=True).stdout
    assert [ln.split()[-1] for ln in nm.splitlines() if " T " in ln] == ["InitializeInjection"]


def test_without_cupti_headers_there_is_no_library_and_a_line_says_why(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cupti_inject, "find_headers", lambda: None)
    built = cupti_inject.library(cache=tmp_path)
    assert built.path is None and built.why_not.startswith("no CUPTI headers found")
    assert "INGERO_CUPTI_INCLUDE=DIR" in built.why_not and not list(tmp_path.iterdir())


def test_an_injection_already_set_is_left_alone_with_a_note(tmp_path: Path) -> None:
    lib, ring_dir, cupti_lib = tmp_path / "libingero_cupti.so", tmp_path / "rings", tmp_path / "libcupti.so.13"
    env, note = cupti_inject.command_env(lib, ring_dir, cupti_lib, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "CUDA_INJECTION64_PATH": str(lib), "INGERO_CUPTI_DIR": str(ring_dir),
                   "INGERO_CUPTI_LIB": str(cupti_lib)} and note is None
    env, note = cupti_inject.command_env(lib, ring_dir, cupti_lib, {"CUDA_INJECTION64_PATH": "/opt/nsys/libinj.so"})
    assert env is None and "already set (/opt/nsys/libinj.so)" in note
    env, _ = cupti_inject.command_env(lib, ring_dir, cupti_lib, {"INGERO_CUPTI_LIB": "/mine/libcupti.so"})
    assert env["INGERO_CUPTI_LIB"] == "/mine/libcupti.so"  # the user's own choice stays


LOOP = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
p = ctypes.c_void_p
lib.cudaLaunchKernel.argtypes = [p, Dim3, Dim3, ctypes.POINTER(p), ctypes.c_size_t, p]
lib.cudaMemcpy.argtypes = [p, p, ctypes.c_size_t, ctypes.c_int]
lib.cudaMemset.argtypes = [p, ctypes.c_int, ctypes.c_size_t]
dev = p(); lib.cudaMalloc(ctypes.byref(dev), 1 << 20)
host = ctypes.create_string_buffer(65536)
k = ctypes.cast(lib.simcudaTimedKernel, p)
us = ctypes.c_uint32(20); args = (p * 1)(ctypes.cast(ctypes.pointer(us), p))
for i in range(int(sys.argv[2])):
    lib.cudaMemcpy(dev, ctypes.addressof(host), 65536, 1)
    lib.cudaMemset(dev, 0, 4096)
    for j in range(10):
        lib.cudaLaunchKernel(k, Dim3(1, 1, 1), Dim3(1, 1, 1), args, 0, None)
    lib.cudaDeviceSynchronize()
"""


def run_injected(tmp_path: Path, steps: int, **env: str) -> dict:
    """The loop above on the simulated runtime with ingero's injection library loaded by it."""
    prereqs.needs(compiler(), "a C compiler", "make setup installs gcc")
    simcuda = prereqs.needs_simcuda()
    stand_in = prereqs.needs((simcuda.parent / "libcupti.so").exists() and simcuda.parent / "libcupti.so",
                             "the CUPTI stand-in (demos/build/libcupti.so)",
                             "make -C demos with the CUDA toolkit's cupti.h")
    include = prereqs.needs(cupti_inject.find_headers(), "NVIDIA's CUPTI headers", "install the CUDA toolkit")
    built = cupti_inject.library(cache=tmp_path / "cache", include=include)
    rings = tmp_path / "rings"
    rings.mkdir()
    loop = tmp_path / "loop.py"
    loop.write_text(LOOP)
    run_env = {**os.environ, "CUDA_INJECTION64_PATH": str(built.path), "INGERO_CUPTI_DIR": str(rings),
               "INGERO_CUPTI_LIB": str(stand_in), **env}
    proc = subprocess.run([sys.executable, str(loop), str(simcuda), str(steps)], env=run_env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (ring_path,) = rings.iterdir()
    ring = cupti.Ring(ring_path, int(ring_path.stem))
    recs, head = ring.read(), ring.header()
    ring.close()
    t = recs["type"]
    api = recs[t == cupti.REC_API]
    return {"head": head, "kernels": int((t == cupti.REC_KERNEL).sum()), "memcpys": int((t == cupti.REC_MEMCPY).sum()),
            "memsets": int((t == cupti.REC_MEMSET).sum()), "syncs": int((t == cupti.REC_SYNC).sum()),
            "api": sorted(int(x) & 0xFFFFFFFF for x in api["name"]), "clocks": int((t == cupti.REC_CLOCK).sum()),
            "recs": recs}


@pytest.mark.parametrize("select", ["cupti", "filtered here"])
def test_the_injection_library_hands_every_record_over_through_the_ring(tmp_path: Path, select: str) -> None:
    # 30 steps: one copy, one memset, 10 kernels and a device sync each; the API records are of the
    # calls that submit or wait (CUPTI selects them, or an older CUPTI gives all and the library filters)
    got = run_injected(tmp_path, 30, **({"SIMCUPTI_NO_SELECT": "1"} if select != "cupti" else {}))
    h = got["head"]
    assert h["flags"] & cupti.RING_READY and h["flags"] & cupti.RING_CLOSED and h["dropped"] == 0
    assert (got["kernels"], got["memcpys"], got["memsets"], got["syncs"]) == (300, 30, 30, 30)
    # cudaMemcpy 31, cudaMemset 49, cudaDeviceSynchronize 165, cudaLaunchKernel 211 (cudaMalloc: not asked for)
    assert got["api"] == sorted([31] * 30 + [49] * 30 + [165] * 30 + [211] * 300)
    assert got["clocks"] >= 2
    assert ("(calls filtered here)" in h["note"]) == (select != "cupti")


def test_the_ring_maps_onto_the_events_clock_within_the_bracket(tmp_path: Path) -> None:
    """The stand-in stamps with CLOCK_REALTIME, as CUPTI does: mapped back, every kernel lies
    between its launch's API record and the run's end, on CLOCK_MONOTONIC."""
    got = run_injected(tmp_path, 5)
    recs = got["recs"]
    p = cupti._Process()
    clocks = recs[recs["type"] == cupti.REC_CLOCK]
    p.pairs_cupti += clocks["start"].astype(np.int64).tolist()
    p.pairs_mono += clocks["end"].astype(np.int64).tolist()
    assert clocks["bytes"].max() < 1_000_000  # brackets under a millisecond, even on a loaded VM
    k = recs[recs["type"] == cupti.REC_KERNEL]
    a = recs[recs["type"] == cupti.REC_API]
    api_start = dict(zip(a["correlation"].tolist(), p.to_mono(a["start"]).tolist()))
    starts = p.to_mono(k["start"])
    assert all(s >= api_start[c] for s, c in zip(starts.tolist(), k["correlation"].tolist()))
    # CLOCK_REALTIME vs CLOCK_MONOTONIC here: the mapped times are monotonic ones (boot-relative)
    import time

    assert 0 < int(starts.max()) <= time.monotonic_ns()
