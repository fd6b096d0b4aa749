"""NVTX: records -> spans rows (pairing on hand-made records), and the injection library's build and env."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

import prereqs
from ingero.collect import decode, nvtx, nvtx_inject
from ingero.errors import IngeroError
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, NVTX_DTYPE, NVTX_TEXT_DTYPE, NVTX_TEXT_PART

OFFSET = 1_000_000_000
PID = 5


def rng(op: Op, ts: int, *, tid: int = PID, pid: int = PID, id: int = 0, text: str | bytes = "") -> np.ndarray:
    """A range record, preceded by its text records as bpf/nvtx.bpf.c claims them."""
    raw = text.encode() if isinstance(text, str) else text
    raw = raw[:64]
    buf = raw + b"\0" * (2 * NVTX_TEXT_PART - len(raw))
    out = []
    for part in range(2 if len(raw) > NVTX_TEXT_PART else 1 if raw else 0):
        x = np.zeros(1, NVTX_TEXT_DTYPE)
        x["op"], x["part"], x["tid"], x["pid"], x["ts_ns"] = int(Op.NVTX_TEXT), part, tid, pid, ts
        chunk = buf[NVTX_TEXT_PART * part:NVTX_TEXT_PART * (part + 1)]
        x["text"] = np.frombuffer(chunk[:24], "S1")
        x["text2"] = np.frombuffer(chunk[24:], "S1")
        out.append(x.view(EVENT_DTYPE))
    r = np.zeros(1, NVTX_DTYPE)
    r["op"], r["tid"], r["pid"], r["ts_ns"], r["id"], r["text_len"] = int(op), tid, pid, ts, id, len(raw)
    out.append(r.view(EVENT_DTYPE))
    return np.concatenate(out)


def other(op: Op, ts: int, *, pid: int = PID, tid: int = PID) -> np.ndarray:
    r = np.zeros(1, EVENT_DTYPE)
    r["op"], r["pid"], r["tid"], r["ts_ns"], r["stack_id"] = int(op), pid, tid, ts, -1
    return r


def batch(*recs: np.ndarray) -> np.ndarray:
    """As the session hands a flush over: regrouped by storage_order (ops apart, runs reversed)."""
    return decode.storage_order(np.concatenate(recs))


def spans(table) -> list[tuple]:
    if table is None:
        return []
    return sorted((r["tid"], r["start_ns"] - OFFSET, r["end_ns"] - OFFSET, r["name"]) for r in table.to_pylist())


def test_push_pop_nest_per_thread_and_leave_only_other_records() -> None:
    s = nvtx.NvtxSpans(session_id=3, offset_ns=OFFSET)
    recs = batch(rng(Op.NVTX_PUSH, 10, text="step"), rng(Op.NVTX_PUSH, 20, text="forward"),
                 other(Op.CUDA_LAUNCH_KERNEL, 25), rng(Op.NVTX_PUSH, 22, tid=6, text="loader"),
                 rng(Op.NVTX_POP, 30), rng(Op.NVTX_POP, 40), rng(Op.NVTX_POP, 41, tid=6))
    rest, table = s.take(recs)
    assert [Op(o) for o in rest["op"]] == [Op.CUDA_LAUNCH_KERNEL]
    assert spans(table) == [(5, 10, 40, "step"), (5, 20, 30, "forward"), (6, 22, 41, "loader")]
    row = table.to_pylist()[0]
    assert (row["session_id"], row["pid"], row["category"]) == (3, PID, "nvtx")


def test_ranges_span_flushes_and_domains_have_their_own_stacks() -> None:
    s = nvtx.NvtxSpans(session_id=1, offset_ns=OFFSET)
    _, t1 = s.take(batch(rng(Op.NVTX_PUSH, 10, text="a"), rng(Op.NVTX_PUSH, 11, id=0xD0, text="in_domain")))
    assert t1 is None
    _, t2 = s.take(batch(rng(Op.NVTX_POP, 20), rng(Op.NVTX_POP, 21, id=0xD0)))
    assert spans(t2) == [(5, 10, 20, "a"), (5, 11, 21, "in_domain")]


def test_start_end_pair_by_id_on_the_starting_thread() -> None:
    s = nvtx.NvtxSpans(session_id=1, offset_ns=OFFSET)
    _, t = s.take(batch(rng(Op.NVTX_START, 10, id=1, text="epoch"), rng(Op.NVTX_START, 12, id=2, text="io"),
                        rng(Op.NVTX_END, 30, tid=9, id=1), rng(Op.NVTX_END, 31, id=2)))
    assert spans(t) == [(5, 10, 30, "epoch"), (5, 12, 31, "io")]


def test_long_messages_are_joined_from_both_parts_and_cut_at_64_bytes() -> None:
    s = nvtx.NvtxSpans(session_id=1, offset_ns=OFFSET)
    name = "x" * 40 + "é" * 20  # 80 bytes; byte 64 is inside a 2-byte character
    _, t = s.take(batch(rng(Op.NVTX_PUSH, 10, text=name), rng(Op.NVTX_POP, 20),
                        rng(Op.NVTX_PUSH, 30, text="y" * NVTX_TEXT_PART), rng(Op.NVTX_POP, 40),
                        rng(Op.NVTX_PUSH, 50), rng(Op.NVTX_POP, 60)))
    got = [r[3] for r in spans(t)]
    assert got == ["x" * 40 + "é" * 12, "y" * NVTX_TEXT_PART, ""]


def test_unmatched_pops_and_ends_are_counted_not_stored() -> None:
    s = nvtx.NvtxSpans(session_id=1, offset_ns=OFFSET)
    _, t = s.take(batch(rng(Op.NVTX_POP, 10), rng(Op.NVTX_END, 11, id=7)))
    assert t is None and s.unmatched == 2


def test_open_ranges_end_at_their_process_exit_or_at_the_trace_end() -> None:
    s = nvtx.NvtxSpans(session_id=1, offset_ns=OFFSET)
    s.take(batch(rng(Op.NVTX_PUSH, 10, text="dies"), rng(Op.NVTX_START, 11, id=4, text="dies_too"),
                 rng(Op.NVTX_PUSH, 12, pid=8, tid=8, text="lives")))
    rest, t = s.take(batch(other(Op.PROC_EXIT, 50), other(Op.CUDA_LAUNCH_KERNEL, 49, pid=8, tid=8)))
    assert len(rest) == 2  # the exit and the launch stay events rows
    assert spans(t) == [(5, 10, 50, "dies"), (5, 11, 50, "dies_too")]
    assert spans(s.finish(90)) == [(8, 12, 90, "lives")]
    assert (s.ended_at_exit, s.ended_at_stop, s.spans) == (2, 1, 3)
    assert s.finish(100) is None


def test_a_batch_without_nvtx_records_passes_through_untouched() -> None:
    s = nvtx.NvtxSpans(session_id=1, offset_ns=OFFSET)
    recs = batch(other(Op.CUDA_LAUNCH_KERNEL, 1), other(Op.PROC_EXIT, 2))
    rest, t = s.take(recs)
    assert rest is recs and t is None


def test_text_whose_range_record_was_lost_is_forgotten() -> None:
    s = nvtx.NvtxSpans(session_id=1, offset_ns=OFFSET)
    lost = rng(Op.NVTX_PUSH, 10, text="lost")[:1]  # its range record never came (full ring)
    s.take(batch(lost, rng(Op.NVTX_PUSH, 5, tid=6, text="keep")))
    for ts in (20, 30, 40):
        s.take(batch(rng(Op.NVTX_PUSH, ts, tid=7), rng(Op.NVTX_POP, ts + 1, tid=7)))
    assert s._text == {}


# ---------------------------------------------------------------- the library


def test_library_is_built_once_per_source_into_a_readable_cache(tmp_path: Path) -> None:
    prereqs.needs(nvtx_inject.compiler(), "a C compiler", "make setup installs gcc")
    lib = nvtx_inject.library(cache=tmp_path)
    assert lib.name == nvtx_inject.LIB_NAME and oct(lib.stat().st_mode & 0o777) == "0o644"
    assert oct(lib.parent.stat().st_mode & 0o777) == "0o755"
    mtime = lib.stat().st_mtime_ns
    assert nvtx_inject.library(cache=tmp_path) == lib and lib.stat().st_mtime_ns == mtime  # cached
    names = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in names.splitlines()}
    assert set(nvtx_inject.PROBED) | {"InitializeInjectionNvtx2"} <= exported
    changed = tmp_path / "other.c"
    changed.write_text(nvtx_inject.SOURCE.read_text() + "\n/* changed */\n")
    assert nvtx_inject.library(cache=tmp_path, source=changed).parent != lib.parent  # keyed by the source


def test_library_fills_nvtx_tables_and_returns_nvtx_levels(tmp_path: Path) -> None:
    """The injection through NVTX's own export table: a fake of the application's side
    (nvtxTypes.h's GetModuleFunctionTable) handed to InitializeInjectionNvtx2."""
    prereqs.needs(nvtx_inject.compiler(), "a C compiler", "make setup installs gcc")
    lib = ctypes.CDLL(str(nvtx_inject.library(cache=tmp_path)))
    core = (ctypes.c_void_p * 17)()  # NVTX_CBID_CORE_SIZE + 1 slots
    core2 = (ctypes.c_void_p * 17)()
    tables = {1: core, 5: core2}
    slot_ptrs = {m: (ctypes.c_void_p * 17)(*[ctypes.addressof(t) + 8 * i for i in range(17)])
                 for m, t in tables.items()}

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint))
    def get_module_function_table(module, out_table, out_size):
        if module not in tables:
            return 0
        out_table[0] = ctypes.addressof(slot_ptrs[module])
        out_size[0] = 16
        return 1

    class Callbacks(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_size_t), ("get", ctypes.c_void_p)]

    cb = Callbacks(ctypes.sizeof(Callbacks), ctypes.cast(get_module_function_table, ctypes.c_void_p))

    @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
    def get_export_table(eid):
        return ctypes.addressof(cb) if eid == 1 else None

    assert lib.InitializeInjectionNvtx2(get_export_table) == 1
    push_a = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p)(core[9])  # NVTX_CBID_CORE_RangePushA
    pop = ctypes.CFUNCTYPE(ctypes.c_int)(core[11])  # RangePop
    start_a = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_char_p)(core[5])  # RangeStartA
    create = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(core2[12])  # DomainCreateA
    register = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(core2[10])  # RegisterStringA
    assert [push_a(b"a"), push_a(b"b"), pop(), pop(), pop()] == [0, 1, 1, 0, -1]
    assert [start_a(b"x"), start_a(b"y")] == [1, 2]
    assert create(b"NVTX")  # non-NULL: the domain counts as enabled
    assert ctypes.string_at(register(None, b"step")) == b"step"  # a registered string reads as a char *
    assert not core[3] and not core[10]  # marks and wide variants stay unset (no-ops)


def test_no_compiler_is_one_line_with_the_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(IngeroError) as exc:
        nvtx_inject.library(cache=tmp_path)
    assert "C compiler" in exc.value.message and "--no-nvtx" in exc.value.hint
    assert not list(tmp_path.rglob("*.so"))


def test_command_env_names_the_library_unless_the_user_chose_another(tmp_path: Path) -> None:
    lib = tmp_path / nvtx_inject.LIB_NAME
    env, note = nvtx_inject.command_env(lib, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", nvtx_inject.ENV: str(lib)} and note is None
    env, note = nvtx_inject.command_env(lib, {nvtx_inject.ENV: "/opt/nsys/libToolsInjection64.so"})
    assert env is None and "/opt/nsys/libToolsInjection64.so" in note
    env, _ = nvtx_inject.command_env(lib, {nvtx_inject.ENV: str(lib)})  # ours already: as is
    assert env == {nvtx_inject.ENV: str(lib)}
