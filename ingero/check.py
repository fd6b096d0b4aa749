"""Readiness report: can `ingero trace` run on this machine, and if not, what to do.

Each check is a small function returning a Check; ``required`` checks decide
the exit code (trace cannot run without them), the others are informative.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from ingero.events import ops

# The tracepoints the tracer attaches, as tracefs paths (the one table: ingero/events/ops.py).
TRACEPOINTS = tuple(tp.replace(":", "/") for tp, _op in ops.TRACEPOINTS)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def check_root() -> Check:
    ok = os.geteuid() == 0
    return Check("root", ok, "running as root" if ok else f"running as uid {os.geteuid()}",
                 "run with sudo: eBPF needs root")


def check_kernel() -> Check:
    release = platform.release()
    major, minor = (int(x) for x in release.split(".")[:2])
    # the newest BPF features the programs use: task storage (5.11), the
    # record ring's fetch-and-add (atomics with a result, 5.12)
    ok = (major, minor) >= (5, 12)
    return Check("kernel", ok, f"Linux {release}", "ingero needs Linux >= 5.12 (BPF atomics, task storage)")


def check_btf() -> Check:
    ok = Path("/sys/kernel/btf/vmlinux").exists()
    return Check("BTF", ok, "/sys/kernel/btf/vmlinux present" if ok else "no /sys/kernel/btf/vmlinux",
                 "a kernel built with CONFIG_DEBUG_INFO_BTF=y", required=False)


def check_tracepoints() -> Check:
    from ingero.collect.kheaders import ensure_tracefs
    from ingero.errors import IngeroError

    try:
        mounted = ensure_tracefs() if os.geteuid() == 0 else None
    except IngeroError as exc:
        return Check("tracepoints", False, exc.message, exc.hint or "")
    base = None
    for p in (Path("/sys/kernel/tracing/events"), Path("/sys/kernel/debug/tracing/events")):
        try:
            if p.exists():
                base = p
                break
        except PermissionError:  # tracefs is root's only (mode 700)
            return Check("tracepoints", False, f"skipped: {p.parent} (where they are listed) is readable by root only",
                         "run with sudo")
    if base is None:
        return Check("tracepoints", False, "tracefs not mounted", "run as root (ingero mounts tracefs itself)")
    missing = [tp for tp in TRACEPOINTS if not (base / tp).exists()]
    detail = f"{len(TRACEPOINTS) - len(missing)}/{len(TRACEPOINTS)} present"
    if mounted:
        detail += f" ({mounted})"
    if missing:
        detail += "; missing " + ", ".join(missing)
    return Check("tracepoints", not missing, detail, "a kernel with sched, exceptions and block tracepoints")


def check_uprobes() -> Check:
    ok = Path("/sys/bus/event_source/devices/uprobe").exists()
    return Check("uprobes", ok, "uprobe PMU present" if ok else "no uprobe support",
                 "a kernel with CONFIG_UPROBE_EVENTS=y")


def check_bcc() -> Check:
    try:
        import bcc
    except ImportError as exc:
        return Check("BCC", False, f"not importable ({exc})",
                     "apt-get install python3-bpfcc (or `make setup`); the PyPI package `bcc` is unrelated")
    version = getattr(bcc, "__version__", "unknown version")
    return Check("BCC", True, f"bcc {version} ({Path(bcc.__file__).parent})")


def check_headers() -> Check:
    from ingero.collect.kheaders import find_kernel_headers
    from ingero.errors import IngeroError

    try:
        kh = find_kernel_headers(build=os.geteuid() == 0)
    except IngeroError as exc:
        return Check("kernel headers", False, exc.message, exc.hint or "")
    return Check("kernel headers", True, kh.how.removeprefix("kernel headers: "))


def check_bpf_load() -> Check:
    """Compile and load a tiny tracepoint program: the real proof that tracing can work."""
    if os.geteuid() != 0:
        return Check("BPF load", False, "skipped (not root)", "run with sudo")
    bcc = check_bcc()
    if not bcc.ok:
        return Check("BPF load", False, f"skipped: BCC {bcc.detail}", bcc.fix)
    try:
        from bcc import BPF

        from ingero.collect.kheaders import ensure_tracefs, find_kernel_headers

        ensure_tracefs()
        find_kernel_headers().export()
        b = BPF(text=b"TRACEPOINT_PROBE(sched, sched_switch) { return 0; }")
        b.cleanup()
    except Exception as exc:  # any compile/verifier/attach failure is the answer
        line = next((ln for ln in str(exc).splitlines() if "error" in ln.lower()),
                    str(exc).splitlines()[0] if str(exc) else repr(exc))
        return Check("BPF load", False, line.strip(), "see `ingero check` lines above (headers, BCC, root)")
    return Check("BPF load", True, "a sched_switch tracepoint program compiled, loaded and attached")


def check_cuda_libs() -> Check:
    try:
        from ingero.collect import libs
    except ImportError:
        return Check("CUDA libraries", False, "library discovery unavailable", required=False)
    places = libs.default_places()
    found = libs.find_cuda_libraries(places=places)
    unseen = _not_searched(places.unreadable)
    if not found:
        return Check("CUDA libraries", False, "no libcudart/libcuda/libnccl found" + unseen,
                     "install your CUDA stack, or pass --cuda-lib / --pid to `ingero trace`"
                     + ("; run as root to search everywhere" if unseen else ""), required=False)
    return Check("CUDA libraries", True, "; ".join(libs.describe(lib) for lib in found) + unseen, required=False)


def _not_searched(unreadable: tuple[Path, ...], proc: Path = Path("/proc")) -> str:
    """What this user could not search for CUDA libraries (nothing as root), as the end of a line:
    directories it may not enter, and processes of other users whose maps it may not read."""
    hidden = 0
    if os.geteuid() != 0:
        for name in os.listdir(proc):
            if name.isdigit():
                try:
                    open(proc / name / "maps", "rb").close()
                except PermissionError:
                    hidden += 1
                except OSError:  # exited meanwhile
                    pass
    what = [str(d) for d in unreadable]
    if hidden:
        what.append(f"the memory maps of {hidden:,} processes of other users")
    if not what:
        return ""
    return f"; not searched as uid {os.geteuid()}: {', '.join(what)} (reading them needs root)"


def check_process(pid: int) -> Check:
    """`check --pid`: what of CUDA one process maps, and whether its calls can be traced."""
    from ingero.collect import libs, targets

    targets.check_pids([pid])
    found, stripped = libs.process_runtimes(pid)
    name = f"process {pid}"
    if stripped:
        return Check(name, False, " | ".join(stripped), required=False)  # each line says its fix
    if not found:
        return Check(name, False,
                     "maps no CUDA runtime, driver or NCCL (libcudart, libcuda, libnccl, or a runtime linked in)",
                     "if it uses CUDA later (dlopen), `ingero trace --pid` attaches then; "
                     "reading another user's maps needs root", required=False)
    return Check(name, True, "; ".join(libs.describe(lib) for lib in found), required=False)


def check_nvidia() -> Check:
    try:
        from ingero.sample import gpu
    except ImportError:
        return Check("NVIDIA driver", False, "GPU sampler unavailable", required=False)
    summary = gpu.driver_summary()
    ok = not summary.lower().startswith("no ")
    return Check("NVIDIA driver", ok, summary, "GPU metrics are optional; host and CUDA-call tracing work without",
                 required=False)


def check_db(db_path: Path) -> Check:
    try:
        exists = db_path.exists()
    except PermissionError:  # in a directory this user may not enter
        return Check("database", False, f"{db_path} (cannot be reached as uid {os.geteuid()}: permission denied)",
                     "pass --db PATH in a directory you can write, or run as root")
    probe = db_path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    writable = os.access(db_path if exists else probe, os.W_OK)
    state = "exists" if exists else "will be created"
    return Check("database", writable, f"{db_path} ({state}{'' if writable else ', not writable'})",
                 "pass --db PATH in a writable directory")


def check_compiler() -> Check:
    from ingero.collect.nvtx_inject import compiler

    cc = compiler() or shutil.which("gcc")
    return Check("C compiler", cc is not None, cc or "none",
                 "apt-get install gcc (trace --cmd builds its NVTX injection library with it, unless --no-nvtx; "
                 "the demo builds its simulated CUDA runtime)", required=False)


CHECKS: tuple[Callable[[], Check], ...] = (
    check_root, check_kernel, check_btf, check_tracepoints, check_uprobes, check_bcc,
    check_headers, check_bpf_load, check_cuda_libs, check_nvidia, check_compiler,
)


def run_checks(db_path: Path, pids: Iterable[int] = ()) -> list[Check]:
    # first: a pid that does not exist is the user's error (exit 2)
    processes = [check_process(pid) for pid in pids]
    results = []
    for fn in CHECKS:
        try:
            results.append(fn())
        except PermissionError as exc:  # what a user other than root may not read: say what, not a repr
            results.append(Check(fn.__name__.removeprefix("check_"), False, _unreadable(exc),
                                 "run as root: sudo ingero check"))
        except Exception as exc:  # a check that crashes is reported, never hides the others
            results.append(Check(fn.__name__.removeprefix("check_"), False, f"check failed: {exc!r}"))
    results.append(check_db(db_path))
    return results + processes


def _unreadable(exc: OSError) -> str:
    what = exc.filename if exc.filename else "a file it needs"
    return f"could not read {what} as uid {os.geteuid()} (permission denied): reading it needs root"


def can_trace(results: list[Check]) -> bool:
    return all(c.ok for c in results if c.required)


def as_dict(results: list[Check]) -> dict:
    return {"ready": can_trace(results), "checks": [asdict(c) for c in results]}
