"""Compile, load and attach bpf/ingero.bpf.c: the only module that imports bcc.

``load_program(settings)`` compiles the one BPF object with ``src_file=``
and ``-D`` cflags (never by editing the text), turning compiler and verifier
failures into an IngeroError that quotes their key line.
``Program.attach_library(lib)`` attaches every probe of the table in
probes.py to one library file, once per file identity, and keeps a record of
every attempt (ok or error) for the ``probes`` table.  The probes are
uprobe_multi links (one per BPF program and file) where the kernel has them,
BCC's perf-event uprobes otherwise: see LinkedProbes.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ingero.collect import entry_cost, probes
from ingero.collect.bpfmaps import discard
from ingero.collect.kheaders import ensure_tracefs, find_kernel_headers
from ingero.errors import IngeroError
from ingero.events.ops import LAUNCH_OP_CODES, OP_NAMES, TRACEPOINTS, Op
from ingero.events.records import PROC_STAT_DTYPE, Counter, SwitchCount

MAIN_SOURCE = "ingero.bpf.c"
# ~2 s of records at 1 M records/s (64 bytes each).  bench_ingest at 1 M/s:
# 64 MiB dropped 1-3 records in 4 M (commit stalls on this shared VM's disk), 128 MiB none.
DEFAULT_RING_MB = 128
RING_MAPS = ("ring", "ring_pos")  # bpf/ingero.bpf.c: the record ring and its positions


def bpf_dir() -> Path:
    """Where bpf/*.c live: INGERO_BPF_DIR, else the source tree next to the package."""
    env = os.environ.get("INGERO_BPF_DIR")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [here.parents[2] / "bpf", here.parents[1] / "bpf"]
    for c in candidates:
        if (c / MAIN_SOURCE).exists():
            return c
    raise IngeroError(
        f"BPF sources ({MAIN_SOURCE}) not found (looked in {', '.join(map(str, candidates))})",
        "reinstall ingero, or set INGERO_BPF_DIR to the directory holding ingero.bpf.c",
    )


@dataclass(frozen=True)
class BpfSettings:
    """Everything that changes what is compiled; each becomes a -D flag."""

    ring_bytes: int = DEFAULT_RING_MB << 20
    trace_all_cuda: bool = True  # default mode: any process calling CUDA becomes a target
    target_comm: str | None = None
    stack: bool = False
    # Read each launch's stream from user memory (`trace --streams`): ~200 ns of
    # the traced job's wall time per launch here (bpf/cuda.bpf.c), so off by default.
    launch_streams: bool = False
    # With --stack: sample the traced threads' CPU at this rate (bpf/sample.bpf.c; 0: off).
    # 99 Hz: off the kernel's 100/250/1000 Hz ticks, so samples do not lock step with them.
    sample_hz: int = 99
    bench_pid: int | None = None  # compile only the ingest benchmark generator
    bench_burst: int | None = None
    empty: bool = False  # every program returns at once (overhead floor)
    # bpf/attach.bpf.c: stop a process that opens a CUDA / NCCL library until its probes are
    # in (ingero/collect/holds.py resumes it).  Only a tracer that runs a Holder turns it on.
    holds: bool = False

    @property
    def samples(self) -> bool:
        """The CPU sampler is compiled and attached (--stack, a rate, not the benchmark)."""
        return self.stack and self.sample_hz > 0 and self.bench_pid is None

    def cflags(self, src: Path) -> list[str]:
        pages = self.ring_bytes // mmap.PAGESIZE
        flags = [f"-I{src}", f"-DRING_PAGES={pages}", f"-DTRACE_ALL_CUDA={int(self.trace_all_cuda)}"]
        if self.target_comm:
            flags.append(f'-DTARGET_COMM="{_c_string(self.target_comm[:15])}"')
        if self.holds and self.bench_pid is None:
            flags.append("-DINGERO_HOLDS")
        if self.stack:
            flags.append("-DINGERO_STACK")
        if self.samples:
            flags += ["-DINGERO_SAMPLE", f"-DSAMPLE_PERIOD_NS={1_000_000_000 // self.sample_hz}"]
        if self.launch_streams:
            flags.append("-DLAUNCH_STREAMS=1")
        if self.bench_pid is not None:
            flags += ["-DINGERO_BENCH", f"-DBENCH_PID={self.bench_pid}"]
            if self.bench_burst:
                flags.append(f"-DBENCH_BURST={self.bench_burst}")
        if self.empty:
            flags.append("-DINGERO_EMPTY")
        return flags


def recursion_misses(fdinfo: str) -> int:
    """``recursion_misses`` of a BPF program's /proc/PID/fdinfo text (0 where the kernel has none).

    A tracepoint or kprobe program does not run on a CPU where another BPF
    program, or a bpf() syscall updating a map, is under way (the kernel's
    per-CPU bpf_prog_active guard; counted since Linux 6.7).  A skipped
    sched_switch may lose an off-CPU row, a skipped uprobe a call: losses no
    ring-buffer counter sees.
    """
    for line in fdinfo.splitlines():
        if line.startswith("recursion_misses:"):
            return int(line.split()[1])
    return 0


def _c_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def ring_bytes_from_mb(mb: int) -> int:
    """--ring-mb -> bytes, checked: the kernel wants a power-of-two number of pages."""
    size = int(mb) << 20
    if mb <= 0 or size & (size - 1):
        raise IngeroError(f"--ring-mb {mb} is not a power of two", "use 16, 32, 64, 128 or 256")
    return size


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def compiled_source(settings: BpfSettings) -> tuple[list[tuple[Path, str]], list[str]]:
    """([(file, text)], cflags) as compiled: the main file, then every local file it includes.

    What --print-bpf shows.
    """
    src = bpf_dir()
    files: list[tuple[Path, str]] = [(src / MAIN_SOURCE, _source_text(src, settings))]
    seen = {MAIN_SOURCE}
    # files behind an #ifdef these settings leave off
    if not settings.stack:
        seen.add("stack.h")
    if not settings.samples:
        seen.add("sample.bpf.c")
    if settings.bench_pid is None:
        seen.add("bench.bpf.c")
    else:
        seen.update({"cuda.bpf.c", "nccl.bpf.c", "nvtx.bpf.c", "sched.bpf.c", "mm.bpf.c", "blockio.bpf.c"})
    if not settings.holds or settings.bench_pid is not None:
        seen.update({"attach.h", "attach.bpf.c"})
    i = 0
    while i < len(files):
        for name in _LOCAL_INCLUDE.findall(files[i][1]):
            if name not in seen and (src / name).exists():
                seen.add(name)
                files.append((src / name, (src / name).read_text()))
        i += 1
    return files, settings.cflags(src)


def _source_text(src: Path, settings: BpfSettings) -> str:
    if settings.stack:
        # stack.h touches maps, and BCC only rewrites map calls in the main
        # file, so --stack compiles the main file with stack.h inlined.
        from ingero.collect.stacks import bpf_text

        return bpf_text(src / MAIN_SOURCE)
    return (src / MAIN_SOURCE).read_text()


@dataclass
class AttachRecord:
    """One row of the probes table."""

    target: str
    symbol: str
    op: str | None
    probe_kind: str
    attached: bool
    error: str | None = None


_KEY_LINE = re.compile(r"error:|unknown opcode|invalid|R\d+ |not allowed|too large|Permission denied", re.I)


def _key_line(log: str, fallback: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in lines:
        if "error:" in ln:
            return ln
    for ln in reversed(lines):
        if _KEY_LINE.search(ln) and not ln.startswith("HINT"):
            return ln
    return fallback


class _CaptureStderr:
    """BCC prints compiler and verifier output on fd 2 from C++: capture it to quote it."""

    def __enter__(self) -> "_CaptureStderr":
        self._tmp = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._tmp.fileno(), 2)
        self.text = ""
        return self

    def __exit__(self, *exc: Any) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._tmp.seek(0)
        self.text = self._tmp.read().decode(errors="replace")
        self._tmp.close()


_ATTACH_UPROBE: Any = None


def _libbcc_attach_uprobe() -> Any:
    """libbcc's bpf_attach_uprobe with its real prototype: seven arguments, the last the
    ref_ctr_offset.  BCC's Python binding (0.26) declares six, so the kernel is handed
    whatever the stack holds there (0x6 on this box; dmesg: "ref_ctr_offset mismatch ...
    old 0x6 new 0x0"), and the kernel keeps one ref_ctr_offset per probed offset: every
    later probe at that offset that passes another value is refused, the overhead
    budget's uprobe_multi links (which pass 0) among them."""
    global _ATTACH_UPROBE
    if _ATTACH_UPROBE is None:
        from bcc import libbcc

        f = libbcc.lib["bpf_attach_uprobe"]  # a new function object: BCC's own binding is left as it is
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulonglong,
                      ctypes.c_int, ctypes.c_uint32]
        _ATTACH_UPROBE = f
    return _ATTACH_UPROBE


def attach_uprobe(bpf: Any, path: str | os.PathLike, fn: str, ret: bool, sym: str | None = None,
                  addr: int | None = None) -> None:
    """What BPF.attach_uprobe / attach_uretprobe do (resolve, check the quota, load the
    program, attach a perf-event uprobe, keep its fd for BCC's cleanup), with
    ref_ctr_offset 0: ingero's probes and links then agree at every offset.
    ``sym`` or ``addr`` (an address BCC turns into the file offset, for a runtime
    linked into a program).  Raises Exception, as BCC does, on failure."""
    from bcc import BPF

    real, off = bpf._check_path_symbol(os.fsencode(path), (sym or "").encode(), addr, -1)
    bpf._check_probe_quota(1)
    prog = bpf.load_func(fn.encode(), BPF.KPROBE)
    ev_name = bpf._get_uprobe_evname(b"r" if ret else b"p", real, off, -1)
    fd = _libbcc_attach_uprobe()(prog.fd, 1 if ret else 0, ev_name, real, off, -1, 0)
    if fd < 0:
        raise Exception(f"Failed to attach BPF to {'uretprobe' if ret else 'uprobe'}")
    bpf._add_uprobe_fd(ev_name, fd)


# bpf/ingero.bpf.c's attach points under INGERO_HOLDS (bpf/attach.bpf.c): no records of their own
HOLD_TRACEPOINTS = ("syscalls:sys_enter_openat", "syscalls:sys_exit_openat", "syscalls:sys_enter_open",
                    "syscalls:sys_exit_open", "syscalls:sys_enter_mmap", "syscalls:sys_enter_execve",
                    "syscalls:sys_exit_execve",
                    "task:task_newtask")


def holds_supported(tracefs: Path = Path("/sys/kernel/tracing")) -> str | None:
    """Why this kernel cannot hold (None: it can): the syscall tracepoints (CONFIG_FTRACE_SYSCALLS)."""
    for tp in HOLD_TRACEPOINTS:
        if not (tracefs / "events" / tp.replace(":", "/")).is_dir():
            return f"no {tp} tracepoint in this kernel"
    return None


# INGERO_UPROBE_MULTI=0: every uprobe as a BCC perf event, as on a kernel without uprobe_multi
# (the fallback, for comparing the two and for tests of BCC's path).
UPROBE_MULTI_ENV = "INGERO_UPROBE_MULTI"


class Program:
    """The loaded BPF object: attach probes, read its maps."""

    def __init__(self, bpf: Any, settings: BpfSettings):
        self.bpf = bpf
        self.settings = settings
        self.records: list[AttachRecord] = []
        self._attached_ids: set[tuple[int, int, str]] = set()
        self.switchable: LinkedProbes | None = None  # the overhead budget's launch probes
        # what one traced call costs its thread here, by entry kind, once calibrated (session.py,
        # budget.py), and the kinds of the launch entries linked (LinkedProbes.take)
        self.call_costs = entry_cost.CallCosts()
        # Every other uprobe: linked and never switched (see LinkedProbes for why links)
        self.links: LinkedProbes | None = None
        if os.environ.get(UPROBE_MULTI_ENV, "1") != "0":
            self.links = LinkedProbes(self, None, refusal_note=None)
            self.links.attach()
        self.tracepoints = list(TRACEPOINTS) if settings.bench_pid is None else []
        if settings.holds and settings.bench_pid is None:
            self.tracepoints += [(tp, None) for tp in HOLD_TRACEPOINTS]
        for tp, op in self.tracepoints:
            self.records.append(AttachRecord("kernel", tp, op, "tracepoint", True))
        # attach_library runs on the trace's thread and on the holder's (holds.py)
        self._attach_lock = threading.RLock()

    # -- attaching ---------------------------------------------------------

    @property
    def call_cost_ns(self) -> float | None:
        """What one traced launch costs its thread (ns); None before the calibration, or without one."""
        return self.call_costs.ns

    def attach_library(self, path: Path, kind: str, identity: tuple[int, int], exported: Iterable[str],
                       addresses: Mapping[str, int] | None = None) -> tuple[int, int]:
        """Attach every probe of the table to one library file; (ok, failed).  Once per identity and kind.

        ``addresses``: a runtime linked into a program, whose functions are local
        symbols (static_runtime.py): attached at these addresses, not by name."""
        with self._attach_lock:
            return self._attach_library(path, kind, identity, exported, addresses)

    def is_attached(self, identity: tuple[int, int], kind: str) -> bool:
        return (*identity, kind) in self._attached_ids

    def _attach_library(self, path: Path, kind: str, identity: tuple[int, int], exported: Iterable[str],
                        addresses: Mapping[str, int] | None) -> tuple[int, int]:
        key = (*identity, kind)  # NVIDIA's libnccl is two: NCCL by name, its linked-in runtime by address
        if key in self._attached_ids:
            return 0, 0
        self._attached_ids.add(key)
        ok = failed = 0
        no_return: set[str] = set()
        plan = probes.plan_library(str(path), kind, frozenset(exported))
        taken = self.switchable.take(str(path), plan, addresses) if self.switchable is not None else set()
        if self.links is not None:
            taken |= self.links.take(str(path), [a for a in plan if a not in taken], addresses)
        for a in plan:
            if a.probe_kind == "uprobe" and a.symbol in no_return:
                # An entry without its return would leave call state that never
                # ends: the symbol is skipped whole rather than half-traced.
                failed += 1
                self.records.append(AttachRecord(a.path, a.symbol, OP_NAMES[a.op], a.probe_kind, False,
                                                 "skipped: its return probe could not be attached"))
                continue
            if a in taken:  # linked (LinkedProbes); what the kernel refused to link BCC attaches below
                ok += 1
                self.records.append(AttachRecord(a.path, a.symbol, OP_NAMES[a.op], a.probe_kind, True))
                continue
            try:
                attach_uprobe(self.bpf, a.path, a.fn, a.probe_kind == "uretprobe",
                              sym=a.symbol if addresses is None else None,
                              addr=None if addresses is None else addresses[a.symbol])
            except Exception as exc:  # BCC raises bare Exception for every attach failure
                failed += 1
                if a.probe_kind == "uretprobe":
                    no_return.add(a.symbol)
                self.records.append(AttachRecord(a.path, a.symbol, OP_NAMES[a.op], a.probe_kind, False, str(exc)))
                continue
            ok += 1
            self.records.append(AttachRecord(a.path, a.symbol, OP_NAMES[a.op], a.probe_kind, True))
            # BCC just added the probe's perf event under its event name (dicts keep insertion order)
        return ok, failed

    def switchable_probes(self, ops: Iterable[int]) -> "LinkedProbes":
        """The probes of ``ops`` made switchable (one set per program; budget.py)."""
        if self.switchable is None:
            self.switchable = LinkedProbes(self, ops)
        return self.switchable

    def link_refusal(self, path: str | os.PathLike) -> str | None:
        """Why ``path``'s probes are BCC perf events rather than links, or None (linked, or not attached)."""
        if self.links is None:
            return f"{UPROBE_MULTI_ENV}=0"
        return self.links.refused_why.get(str(path))

    def program_fds(self) -> dict[str, list[int]]:
        """Every loaded BPF program's fds by name: BCC's, and the copies loaded for links."""
        out: dict[str, list[int]] = {}
        for name, fn in list(self.bpf.funcs.items()):
            out.setdefault(name.decode(), []).append(fn.fd)
        for linked in (self.links, self.switchable):
            if linked is not None:
                for name, fd in linked.prog_fds().items():
                    out.setdefault(name, []).append(fd)
        return out
    def attach_cpu_sampler(self) -> None:
        """The cpu_sample program on a software cpu-clock event of every CPU, at settings.sample_hz."""
        from bcc import PerfSWConfig, PerfType

        what = f"cpu-clock@{self.settings.sample_hz}Hz"
        try:
            self.bpf.attach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK,
                                       fn_name=b"cpu_sample", sample_freq=self.settings.sample_hz, cpu=-1)
        except Exception as exc:  # BCC raises bare Exception; stacks of CUDA calls still work without it
            self.records.append(AttachRecord("kernel", what, OP_NAMES[Op.CPU_SAMPLE], "perf_event", False, str(exc)))
            return
        self.records.append(AttachRecord("kernel", what, OP_NAMES[Op.CPU_SAMPLE], "perf_event", True))

    def uprobe_count(self) -> int:
        return int(self.bpf.num_open_uprobes())

    # -- maps ----------------------------------------------------------------

    def ring_fds(self) -> tuple[int, int]:
        """fds of the record ring's slot array and positions array (ringbuf.RingReader)."""
        return tuple(int(self.bpf[name].map_fd) for name in RING_MAPS)  # type: ignore[return-value]

    def add_targets(self, pids: Iterable[int]) -> None:
        t = self.bpf["targets"]
        for pid in pids:
            t[t.Key(pid)] = t.Leaf(1)

    def remove_targets(self, pids: Iterable[int]) -> None:
        t = self.bpf["targets"]
        for pid in pids:
            discard(t, t.Key(pid))

    def targets(self) -> set[int]:
        return {k.value for k in self.bpf["targets"].keys()}

    def counters(self) -> np.ndarray:
        """Per-counter totals summed over CPUs (index = Counter)."""
        table = self.bpf["counters"]
        out = np.zeros(int(Counter.MAX), dtype=np.int64)
        for i in range(int(Counter.MAX)):
            out[i] = sum(table[ctypes.c_int(i)])
        return out

    def probe_misses(self) -> int:
        """Runs of our programs the kernel skipped, summed over them (see recursion_misses)."""
        total = 0
        for fds in self.program_fds().values():
            for fd in fds:
                try:
                    total += recursion_misses(Path(f"/proc/self/fdinfo/{fd}").read_text())
                except OSError:
                    continue
        return total

    def proc_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """(tgids, PROC_STAT_DTYPE totals) of every process seen switching on this host."""
        table = self.bpf["proc_stats"]
        keys: list[int] = []
        vals: list[bytes] = []
        for k, v in table.items():
            keys.append(k.value)
            vals.append(ctypes.string_at(ctypes.addressof(v), PROC_STAT_DTYPE.itemsize))
        arr = np.frombuffer(b"".join(vals), dtype=PROC_STAT_DTYPE) if vals else np.empty(0, PROC_STAT_DTYPE)
        return np.array(keys, dtype=np.int64), arr

    def forget_procs(self, pids: Iterable[int]) -> None:
        table = self.bpf["proc_stats"]
        for pid in pids:
            discard(table, table.Key(pid))

    # -- the overhead budget's maps (budget.py) ------------------------------

    def set_budget_flags(self, flags: int) -> None:
        """enum ingero_budget_flag bits the programs read (BudgetFlag)."""
        table = self.bpf["budget_cfg"]
        table[ctypes.c_int(0)] = ctypes.c_uint32(int(flags))

    def switch_counts(self) -> list[tuple[int, SwitchCount]]:
        """(tid, totals) of every thread whose off-CPU intervals the budget counted."""
        table = self.bpf["switch_counts"]
        return [(k.value,
                 SwitchCount.from_buffer_copy(ctypes.string_at(ctypes.addressof(v), ctypes.sizeof(SwitchCount))))
                for k, v in table.items()]

    def forget_switch_counts(self, tids: Iterable[int]) -> None:
        table = self.bpf["switch_counts"]
        for tid in tids:
            discard(table, table.Key(tid))

    def tracepoint_fds(self) -> list[int]:
        """fds of the programs that run on kernel events (tracepoints, the CPU sampler), not on calls."""
        return [fd for name, fds in self.program_fds().items()
                if name.startswith("tracepoint__") or name == "cpu_sample" for fd in fds]

    def attach_bench(self) -> None:
        """Nothing: the benchmark tracepoint is auto-attached by BCC (TRACEPOINT_PROBE)."""

    def close(self, wait: bool = False) -> None:
        """Detach everything.  Uprobes are closed by a background process (see _close_in_background),
        or here, returning once every probe is detached, with ``wait`` (bench_attach)."""
        fds = list(self.bpf.uprobe_fds.values()) + list(self.bpf.tracepoint_fds.values())
        for linked in (self.switchable, self.links):
            if linked is not None:
                fds += linked.release()
        # BCC's own detach path, minus the detach: it also gives the probes
        # back to BCC's per-process quota (_num_open_probes, ~1000), which a
        # plain clear() never did, so a process loading again and again
        # (a harness, a library user) was refused after ~20 loads.
        for name in list(self.bpf.uprobe_fds):
            self.bpf._del_uprobe_fd(name)
        self.bpf.tracepoint_fds.clear()
        if fds:
            close_fds(fds) if wait else _close_in_background(fds)
        self.bpf.cleanup()  # maps and programs: only references dropped now (the sampler's perf events closed)


# ---- uprobes as uprobe_multi links ---------------------------------------------------
#
# A perf-event uprobe (what BCC attaches) detaches in one RCU grace period per
# probe, one probe at a time (the kernel's event_mutex): ~0.1 s each on a quiet
# box, 0.6-0.8 s each on this loaded one (measured: 8 launch probes of one
# library, 5.6 s), so those cannot be switched once a second, and a tracer of
# three libraries (108 probes) left ~10 s of detaching behind it, host-wide,
# which the next tracer's attaches queued behind.  A uprobe_multi link (Linux
# 6.6) attaches one program to many offsets of one file in one bpf() call and
# detaches them all with one grace period, and links close in parallel:
# measured here, two links (the launch entries and their returns) attach in
# 10-15 ms of wall time and 0.3 ms of CPU, and close in 0.13-0.19 s of wall
# time, 0.4 ms of CPU, whose wait only the closing thread sees; libcudart.so.13's
# 38 probes: 4.0-4.3 s to close as perf events, 0.06-0.08 s as its 13 links.
# The breakpoints leave the traced processes at the start of the close; the
# wait is for probes still running.

_NR_BPF = 321  # x86-64
_BPF_LINK_CREATE = 28
_BPF_PROG_TYPE_KPROBE = 2
_BPF_TRACE_UPROBE_MULTI = 48
_BPF_F_UPROBE_MULTI_RETURN = 1
# Between closing the entry links and the return links: a call whose entry ran
# just before the entries went keeps its return (its row is whole); only a call
# still inside after this long (a launch blocked on a full queue) loses its
# return, and its state is then dropped as stale by the thread's next traced
# call (bpf/cuda.bpf.c call_begin).
RETURN_GRACE_S = 0.005
RETURN_PROBE_FN = probes.RETURN_FN  # does nothing for a thread with no call state: the calibration's probe


@functools.lru_cache(maxsize=8)
def _mapped_path(stem: str) -> str:
    """Path of the first file mapped into this process whose name contains ``stem`` (cached: what
    is mapped stays mapped; a stem not mapped yet raises and is looked up again next time)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and stem in Path(parts[5]).name:
            return parts[5]
    raise OSError(f"{stem} is not mapped")


def _bpf_link_uprobe_multi(prog_fd: int, path: str, offsets: list[int], ret: bool, pid: int = 0) -> int:
    """bpf(BPF_LINK_CREATE, uprobe_multi): the link fd; OSError when the kernel refuses."""
    attr = (ctypes.c_ubyte * 128)()
    base = ctypes.addressof(attr)
    c_path = ctypes.create_string_buffer(path.encode())
    c_offs = (ctypes.c_uint64 * len(offsets))(*offsets)
    # union bpf_attr.link_create: prog_fd u32 @0, target_fd @4, attach_type @8, flags @12,
    # uprobe_multi {path u64 @16, offsets @24, ref_ctr_offsets @32, cookies @40, cnt u32 @48, flags @52, pid @56}
    ctypes.c_uint32.from_address(base).value = prog_fd
    ctypes.c_uint32.from_address(base + 8).value = _BPF_TRACE_UPROBE_MULTI
    ctypes.c_uint64.from_address(base + 16).value = ctypes.addressof(c_path)
    ctypes.c_uint64.from_address(base + 24).value = ctypes.addressof(c_offs)
    ctypes.c_uint32.from_address(base + 48).value = len(offsets)
    ctypes.c_uint32.from_address(base + 52).value = _BPF_F_UPROBE_MULTI_RETURN if ret else 0
    ctypes.c_uint32.from_address(base + 56).value = pid  # 0: every process
    fd = _libc().syscall(_NR_BPF, _BPF_LINK_CREATE, attr, 64)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"uprobe_multi link on {path}: {os.strerror(err)}")
    return int(fd)


_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.syscall.restype = ctypes.c_long
    return _LIBC


def _close_later(first: list[int], then: list[int], done: Any = None, gap_s: float = RETURN_GRACE_S) -> None:
    """Close ``first`` at once and ``then`` gap_s later, each on its own thread (each close
    waits a grace period); ``done`` (a threading.Event) is set when all are closed."""
    import threading

    def close(fd: int) -> None:
        try:
            os.close(fd)
        except OSError:
            pass

    def run() -> None:
        threads = [threading.Thread(target=close, args=(fd,), daemon=True) for fd in first]
        for t in threads:
            t.start()
        if then:
            time.sleep(gap_s)
        more = [threading.Thread(target=close, args=(fd,), daemon=True) for fd in then]
        for t in more:
            t.start()
        for t in threads + more:
            t.join()
        if done is not None:
            done.set()

    threading.Thread(target=run, name="ingero-detach", daemon=True).start()


def _quiet_close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _close_links(links: Mapping[tuple[str, str, str], int]) -> None:
    """Close links keyed (path, fn, probe_kind): the entries first, the returns RETURN_GRACE_S later."""
    _close_later([fd for k, fd in links.items() if k[2] == "uprobe"],
                 [fd for k, fd in links.items() if k[2] == "uretprobe"])


class LinkedProbes:
    """Per-call uprobes as uprobe_multi links, one per (file, BPF program, entry or return),
    instead of BCC's perf events (see above).

    Two sets per program: every probe, linked as its library is attached and
    unlinked when the program closes (Program.links), and the overhead budget's
    launch probes, switched on and off (Program.switchable, budget.py).
    ``take()`` (from attach_library) adds a library's probes of ``ops`` (None:
    any), linked at once when the set is attached; ``attach()`` links every
    group, returns first; ``detach()`` unlinks the entries, then the returns.
    What the kernel refuses to link (before Linux 6.6; see take) is left to BCC.
    Safe to call from the tracer's thread and the budget's cycling thread.
    """

    def __init__(self, program: "Program", ops: Iterable[int] | None,
                 refusal_note: str | None = ("overhead budget: {path}'s launch probes cannot be switched, "
                                             "each of its calls is traced ({why})")):
        import threading

        self.program = program
        self.ops = None if ops is None else frozenset(int(o) for o in ops)
        self.refusal_note = refusal_note
        self.attached = False
        self.closed = False  # released: nothing is linked again (a budget cycle racing the close)
        self.lock = threading.RLock()
        # (file, fn, probe_kind) -> file offsets; the file is "/proc/self/fd/N" of an fd held
        # open (self._files): a library replaced at its path (an upgrade) is another file, and a
        # re-link (the budget's cycles) reaches the file the offsets were read from
        self._groups: dict[tuple[str, str, str], set[int]] = {}
        self._files: list[int] = []
        self._progs: dict[str, int] = {}  # program name -> fd loaded for uprobe_multi
        self._links: dict[tuple[str, str, str], int] = {}
        self.notes: list[str] = []  # for the trace's notes (budget.py passes them on)
        # libraries whose probes of these ops BCC attached instead (never switched): the kernel's reason
        self.refused_why: dict[str, str] = {}

    def take(self, path: str, plan: list[Any], addresses: Mapping[str, int] | None) -> set[Any]:
        """The attachments of ``plan`` (probes.Attachment, all on ``path``) this set links from
        now on, linked at once when it is attached; none when they cannot be (a note says why):
        BCC attaches them.

        Every group is linked once here to know: a uprobe_multi link is refused (EINVAL) where
        another tracer's BCC uprobe sits at the same offset with a garbage ref_ctr_offset
        (BCC's own attach_uprobe: see attach_uprobe above; ingero's own pass 0).
        """
        mine = [a for a in plan if self.ops is None or a.op in self.ops]
        if not mine:
            return set()
        bpf = self.program.bpf
        file_fd = None
        try:
            with self.lock:
                if self.closed:
                    return set()
                # the file as it is now: its symbols are read, and its probes linked, through this fd
                file_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                held = f"/proc/self/fd/{file_fd}"
                groups: dict[tuple[str, str, str], set[int]] = {}
                for a in mine:
                    _, off = bpf._check_path_symbol(held.encode(),
                                                    b"" if addresses is not None else a.symbol.encode(),
                                                    None if addresses is None else addresses[a.symbol], -1)
                    groups.setdefault((held, a.fn, a.probe_kind), set()).add(int(off))
                    if a.probe_kind == "uprobe" and a.op in LAUNCH_OP_CODES:
                        self.program.call_costs.note_launch_entry(os.pread(file_fd, 8, int(off)))
                links: dict[tuple[str, str, str], int] = {}
                try:
                    for kind in ("uretprobe", "uprobe"):  # returns first
                        for key, offs in groups.items():
                            if key[2] == kind:
                                links[key] = _bpf_link_uprobe_multi(self._prog_fd(key[1]), key[0], sorted(offs),
                                                                    kind == "uretprobe")
                except OSError:
                    _close_links(links)
                    raise
                self._files.append(file_fd)
                self._groups.update(groups)  # a new fd: never a key already there
                if self.attached:
                    self._links.update(links)
                else:
                    _close_links(links)
        except Exception as exc:  # BCC raises bare Exception for a symbol it cannot resolve
            if file_fd is not None and file_fd not in self._files:
                _quiet_close(file_fd)
            self.refused_why[path] = str(exc)
            if self.refusal_note is not None:
                self.notes.append(self.refusal_note.format(path=path, why=exc))
            return set()
        return set(mine)

    def switchable(self) -> bool:
        """Whether detaching means anything: some library's probes were taken."""
        with self.lock:
            return bool(self._groups)

    def _link_missing(self) -> None:
        for kind in ("uretprobe", "uprobe"):  # returns first: a call entering in between keeps its return
            for key, offs in self._groups.items():
                if key[2] == kind and key not in self._links:
                    self._links[key] = _bpf_link_uprobe_multi(self._prog_fd(key[1]), key[0], sorted(offs),
                                                              kind == "uretprobe")

    def attach(self) -> None:
        with self.lock:
            if self.attached or self.closed:
                return
            try:
                self._link_missing()
            except OSError:
                self._unlink()
                raise
            self.attached = True

    def detach(self) -> tuple[int, int]:
        """Unlink: the entries now (each close then waits a grace period: this thread only),
        the returns RETURN_GRACE_S later, in the background.

        Returns (wall clock ns just before the entry closes, just after them):
        the kernel removes the breakpoints at the start of a close, then waits,
        so the first is when the probes went (to within the instant it takes
        to enter the syscall), and no row of these ops starts after the second.
        """
        import threading

        with self.lock:
            if not self.attached:
                now = time.time_ns()
                return now, now
            self.attached = False
            links, self._links = self._links, {}
        # The breakpoint leaves the text only once no link holds the offset: the returns must
        # not wait for the entries' grace period (0.1-0.7 s here), only RETURN_GRACE_S.  The
        # hot launch entry is closed on this thread (no thread start between the clock and it).
        entries = sorted((k for k in links if k[2] == "uprobe"), key=lambda k: "launch_kernel" not in k[1])
        returns = [fd for k, fd in links.items() if k[2] == "uretprobe"]

        def close_returns() -> None:
            time.sleep(RETURN_GRACE_S)
            for fd in returns:
                threading.Thread(target=_quiet_close, args=(fd,), daemon=True).start()

        at = time.time_ns()
        threads = [threading.Thread(target=close_returns, daemon=True)]
        threads += [threading.Thread(target=_quiet_close, args=(links[k],), daemon=True) for k in entries[1:]]
        for t in threads:
            t.start()
        if entries:
            _quiet_close(links[entries[0]])
        for t in threads:
            t.join()
        done = time.time_ns()
        return at, done

    def _unlink(self) -> None:
        links, self._links = self._links, {}
        _close_links(links)

    def _prog_fd(self, fn: str) -> int:
        fd = self._progs.get(fn)
        if fd is None:
            from bcc import libbcc

            lib, mod, name = libbcc.lib, self.program.bpf.module, fn.encode()
            fd = lib.bcc_func_load(mod, _BPF_PROG_TYPE_KPROBE, name, lib.bpf_function_start(mod, name),
                                   lib.bpf_function_size(mod, name), lib.bpf_module_license(mod),
                                   lib.bpf_module_kern_version(mod), 0, None, 0, None, _BPF_TRACE_UPROBE_MULTI)
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"loading {fn} for uprobe_multi: {os.strerror(err)}")
            self._progs[fn] = fd
        return fd

    def _libc_symbol(self, symbol: str) -> tuple[str, int]:
        """(path, file offset) of a libc function mapped in this process."""
        path, off = self.program.bpf._check_path_symbol(_mapped_path("libc.so").encode(), symbol.encode(), None, -1)
        return path.decode(), int(off)

    def libc_entry(self, symbol: str, n: int = 8) -> bytes:
        """The first ``n`` bytes of a libc function as the file holds them (entry_cost.entry_kind)."""
        path, off = self._libc_symbol(symbol)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, n, off)
        finally:
            os.close(fd)

    def calibrate_ns(self, symbol: str = "getppid", args: tuple = (), calls: int = 2000,
                     rounds: int = 3) -> tuple[float, float]:
        """(ns of this thread's CPU one probed call costs, calibration wall seconds).

        Links ``cuda_return`` (which does nothing for a thread with no call
        state) as entry and return probe on libc's ``symbol``, for this process
        only, and times ``calls`` ctypes calls of it with ``args``, with and
        without the probes, best of ``rounds``: the uprobe trap and return, as
        the traced threads pay them, in their CPU time (thread_time counts the
        kernel's part too).  What the trap costs depends on the function's
        first instruction (entry_cost.py).
        """
        t0 = time.monotonic()
        path, off = self._libc_symbol(symbol)
        fn = getattr(_libc(), symbol)

        def best() -> float:
            out = []
            for _ in range(rounds):
                c = time.thread_time_ns()
                for _ in range(calls):
                    fn(*args)
                out.append((time.thread_time_ns() - c) / calls)
            return min(out)

        plain = best()
        prog = self._prog_fd(RETURN_PROBE_FN)
        ret = _bpf_link_uprobe_multi(prog, path, [off], True, os.getpid())
        try:
            ent = _bpf_link_uprobe_multi(prog, path, [off], False, os.getpid())
        except OSError:
            _close_later([ret], [])
            raise
        try:
            probed = best()
        finally:
            _close_later([ent], [ret])
        return max(0.0, probed - plain), time.monotonic() - t0

    def prog_fds(self) -> dict[str, int]:
        """The programs loaded for links, by name."""
        with self.lock:
            return dict(self._progs)

    def release(self) -> list[int]:
        """Every fd still held (links, programs), for the program's closer; the set is unusable after."""
        with self.lock:
            fds = list(self._links.values()) + list(self._progs.values()) + self._files
            self._links, self._progs, self._files = {}, {}, []
            self.attached = False
            self.closed = True
        return fds


# Closing one uprobe perf fd takes ~0.1 s here (the kernel waits for a grace
# period per probe, one at a time: measured 7.2 s for 76 probes, from one or
# 64 threads alike), and tracepoint detaches queue behind them; a uprobe_multi
# link waits one grace period too, but links closed on threads of their own
# wait together.  So a detached grandchild inherits every fd and closes them
# on threads (close_fds) while ingero exits at once; the probes stay attached
# (unread) a little longer.  The parent's own close of an fd the child still
# holds only drops a reference.
def close_fds(fds: list[int]) -> None:
    """Close probe fds, each on a thread of its own (_close_later); returns when every detach is done."""
    import threading

    done = threading.Event()
    _close_later(fds, [], done)
    done.wait()


def _close_in_background(fds: list[int]) -> None:
    # The last close of each fd pays for the detach: the grandchild waits
    # (EOF on a pipe) until this process has dropped its copies.
    gate_r, gate_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            for std in (0, 1, 2):
                os.dup2(devnull, std)
            keep = sorted(set(fds) | {gate_r})
            low = 3
            for fd in keep:  # close every other inherited fd (pipes, the database)
                if fd > low:
                    os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, 65536)
            while os.read(gate_r, 1):
                pass
            close_fds(fds)
        finally:
            os._exit(0)
    os.close(gate_r)
    os.waitpid(pid, 0)
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    os.close(gate_w)


def load_program(settings: BpfSettings) -> Program:
    """Compile and load the object (tracepoints attach on load); IngeroError on failure."""
    ensure_tracefs()
    find_kernel_headers().export()
    try:
        from bcc import BPF
    except ImportError as exc:
        raise IngeroError(f"BCC is not importable ({exc})", "install python3-bpfcc (or run `make setup`)") from None
    src = bpf_dir()
    cflags = settings.cflags(src)
    kwargs: dict[str, Any] = {"cflags": cflags}
    if settings.stack:
        kwargs["text"] = _source_text(src, settings).encode()
    else:
        kwargs["src_file"] = str(src / MAIN_SOURCE).encode()
    with _CaptureStderr() as cap:
        try:
            bpf = BPF(**kwargs)
        except Exception as exc:
            failure: Exception | None = exc
        else:
            failure = None
    if failure is not None:
        raise load_error(str(failure), cap.text, src)
    program = Program(bpf, settings)
    if settings.samples:
        program.attach_cpu_sampler()
    return program


# BCC's exception for a program the kernel refused: "Failed to load BPF program b'NAME': REASON"
_FAILED_PROGRAM = re.compile(r"Failed to load BPF program b?'?([\w.]+)")


def load_error(bcc_message: str, log: str, src: Path) -> IngeroError:
    """One line for a failed compile or load: the stage, the program, the key log line, and what to do."""
    key = _key_line(log, bcc_message)
    headers = os.environ.get("BCC_KERNEL_SOURCE") or "the running kernel's"
    custom = os.environ.get("INGERO_BPF_DIR")
    where = (f"INGERO_BPF_DIR={custom} chose these sources: unset it to use the installed ones, or fix them; "
             if custom else "")
    if "compile" in bcc_message.lower():
        return IngeroError(
            f"BPF compile failed ({src / MAIN_SOURCE}, kernel headers {headers}): {key}",
            f"{where}`ingero check` checks the kernel headers; `ingero trace --print-bpf` shows the program and flags",
        )
    prog = _FAILED_PROGRAM.search(bcc_message)
    return IngeroError(
        f"BPF load failed: the kernel verifier refused {prog.group(1) if prog else 'a program'}: {key}",
        f"{where}`ingero check` checks the kernel (BTF, version); report it with `ingero trace --print-bpf` output",
    )
