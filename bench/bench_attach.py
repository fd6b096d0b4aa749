"""What attaching the CUDA probes costs: uprobe_multi links against BCC's perf events, and holds.

Every CUDA / NCCL library this host has (LibraryWatcher's discovery, as
`ingero trace` finds them) is attached by one loaded program, then detached;
the two kinds of probe alternate, round by round (loader.UPROBE_MULTI_ENV
chooses).  Reported per kind, best and worst of the rounds, wall seconds:

* attach: Program.attach_library over every library;
* detach: Program.close(wait=True), until the kernel has removed every probe
  (`ingero trace` hands this to a background process, but the kernel does the
  same work host-wide, and the next tracer's attaches wait behind it);
* next attach: a second program's attach started while the first one's
  probes are being detached (a test suite, or a daemon restarted).

* holds (``--holds``, bpf/attach.bpf.c, ingero/collect/holds.py): how long a
  thread that dlopens a CUDA / NCCL library nobody had mapped is held by a
  running ``ingero trace`` (default mode), as that thread sees it: its
  dlopen's wall time with holds, against the same dlopen under a tracer run
  with ``--no-hold``, on fresh copies (new inodes) of each library, one
  process per copy; and as the holder measured it (the kernel's stop to the
  SIGCONT, from the trace's attach lines).  ``--load N``: N busy processes
  beside it (a box whose threads wait for a CPU).

    python -m bench.bench_attach [--rounds 3] [--holds-only | --no-holds] [--load N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ingero.collect.libs import LibraryWatcher
from ingero.collect.loader import UPROBE_MULTI_ENV, BpfSettings, load_program

KINDS = {"links": "1", "perf events": "0"}


def _attach(libs) -> tuple[object, float, int]:
    prog = load_program(BpfSettings(empty=True))
    t0 = time.monotonic()
    probes = 0
    for lib in libs:
        ok, _ = prog.attach_library(lib.path, lib.kind, lib.identity, lib.symbols, lib.addresses)
        probes += ok
    return prog, time.monotonic() - t0, probes


def one_round(libs, kind: str) -> dict:
    os.environ[UPROBE_MULTI_ENV] = KINDS[kind]
    first, attach_s, probes = _attach(libs)
    t0 = time.monotonic()
    closing = threading.Thread(target=first.close, kwargs={"wait": True})
    closing.start()
    second, next_attach_s, _ = _attach(libs)
    closing.join()
    both_s = time.monotonic() - t0
    t1 = time.monotonic()
    second.close(wait=True)
    return {"probes": probes, "attach": attach_s, "detach": time.monotonic() - t1, "next_attach": next_attach_s,
            "first_detach_and_next_attach": both_s}


def attach_table(rounds: int) -> None:
    libs = list(LibraryWatcher().poll())
    print(f"{len(libs)} libraries: {', '.join(str(x.path) for x in libs)}\n")
    results: dict[str, list[dict]] = {k: [] for k in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            results[kind].append(one_round(libs, kind))
    print("| probes as | probes | attach s | detach s | next tracer's attach, during the detach, s |")
    print("|---|---:|---:|---:|---:|")
    for kind, rs in results.items():
        def span(key: str) -> str:
            vals = sorted(r[key] for r in rs)
            return f"{vals[0]:.3f}–{vals[-1]:.3f}"
        print(f"| {kind} | {rs[0]['probes']} | {span('attach')} | {span('detach')} | {span('next_attach')} |")


# ---- holds ---------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
# dlopen each path given, timing it on CLOCK_MONOTONIC: "ms PATH" per line
_DLOPEN_TIMED = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        clock_gettime(CLOCK_MONOTONIC, &b);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        printf("%.3f %s\n", (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6, argv[i]);
    }
    return 0;
}
"""
_HELD = re.compile(r"while pid \d+ was held at its mapping of (\S+) \((\d+\.\d) ms\)")
_BOUND = re.compile(r"after pid \d+'s mapping of (\S+): it was held for the")


def _libraries() -> dict[str, Path]:
    """The libraries to copy: the simulated runtime and NCCL, NVIDIA's libcudart 12 and 13, NVIDIA's libnccl."""
    out: dict[str, Path] = {}
    sim = REPO / "demos" / "build"
    for name, path in (("simulated libcudart.so.12", sim / "libcudart.so.12"),
                       ("simulated libnccl.so.2 (its libcudart: a file looked at)", sim / "libnccl.so.2")):
        if path.exists():
            out[name] = path
    try:
        import nvidia  # the wheels' namespace package

        for base in nvidia.__path__:
            for name, rel in (("NVIDIA libcudart.so.12 (0.7 MB)", "cuda_runtime/lib/libcudart.so.12"),
                              ("NVIDIA libnccl.so.2 (250 MB)", "nccl/lib/libnccl.so.2")):
                if (Path(base) / rel).exists():
                    out.setdefault(name, Path(base) / rel)
    except ImportError:
        pass
    cuda13 = sorted(Path("/usr/local").glob("cuda-13*/lib*/libcudart.so.13"))
    if cuda13:
        out["CUDA 13 libcudart.so.13"] = cuda13[-1]
    return out


def _tracer(db: Path, *flags: str) -> tuple[subprocess.Popen, list[dict]]:
    proc = subprocess.Popen([sys.executable, "-m", "ingero", "trace", "--json", "--db", str(db), "--duration", "900s",
                             "--no-serve", *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=REPO)
    lines: list[dict] = []

    def read() -> None:
        for line in proc.stdout:
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass

    threading.Thread(target=read, daemon=True).start()
    end = time.monotonic() + 300
    while not any(x.get("type") == "start" for x in lines):
        if time.monotonic() > end or proc.poll() is not None:
            proc.kill()
            raise SystemExit("ingero trace did not start")
        time.sleep(0.1)
    return proc, lines


def _notes(lines: list[dict]) -> list[str]:
    return [n for x in lines if x.get("type") in ("tick", "summary") for n in x.get("notes", [])]


def _dlopen_round(exe: Path, libs: dict[str, Path], work: Path, tag: str) -> dict[str, tuple[float, Path]]:
    """One process per library, each dlopen'ing a fresh copy (a file no process has mapped): name -> (ms, copy)."""
    out = {}
    for name, src in libs.items():
        d = work / f"{tag}-{len(list(work.iterdir()))}"
        d.mkdir()
        copy = Path(shutil.copy(src, d / src.name))
        if "simulated libnccl" in name:  # its DT_NEEDED libcudart, found beside it ($ORIGIN): a file looked at
            (d / "libcudart.so.12").symlink_to(src.parent / "libcudart.so.12")
        run = subprocess.run([str(exe), str(copy)], capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            raise SystemExit(f"dlopen {copy}: {run.stderr.strip()}")
        out[name] = (float(run.stdout.split()[0]), copy)
        if "250 MB" in name:
            copy.unlink()  # a hold is over once dlopen returned; 250 MB a copy is kept no longer

    return out


def holds_table(rounds: int, load: int) -> None:
    libs = _libraries()
    if not libs:
        raise SystemExit("no library to copy (make -C demos; pip install nvidia-cuda-runtime-cu12)")
    work = Path(tempfile.mkdtemp(prefix="bench-holds-"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        exe = work / "dlopen_timed"
        (work / "dlopen_timed.c").write_text(_DLOPEN_TIMED)
        subprocess.run([shutil.which("cc") or "gcc", "-O1", "-o", str(exe), str(work / "dlopen_timed.c"), "-ldl"],
                       check=True)
        plain: dict[str, list[float]] = {n: [] for n in libs}
        held: dict[str, list[float]] = {n: [] for n in libs}
        holder: dict[str, list[float]] = {n: [] for n in libs}
        bound: dict[str, int] = {n: 0 for n in libs}
        summary: list[str] = []
        for flags, into in ((("--no-hold",), plain), ((), held)):
            proc, lines = _tracer(work / f"t{len(flags)}.duckdb", *flags)
            try:
                copies: dict[Path, str] = {}
                for r in range(rounds):
                    for name, (ms, copy) in _dlopen_round(exe, libs, work, f"r{r}").items():
                        into[name].append(ms)
                        copies[copy] = name
                time.sleep(1.5)  # the last second's notes
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=300)
            if not flags:
                summary = [n for n in _notes(lines) if n.startswith("holds: ")]
                for note in _notes(lines):
                    m = _HELD.search(note)
                    if m and Path(m.group(1)) in copies:
                        holder[copies[Path(m.group(1))]].append(float(m.group(2)))
                    b = _BOUND.search(note)
                    if b and Path(b.group(1)) in copies:
                        bound[copies[Path(b.group(1))]] += 1
    finally:
        for h in hogs:
            h.kill()
        shutil.rmtree(work, ignore_errors=True)

    def span(vals: list[float]) -> str:
        if not vals:
            return "–"
        v = sorted(vals)
        return f"{v[len(v) // 2]:.1f} / {v[-1]:.1f}"

    print(f"{rounds} fresh copies of each library, one process each; {load} busy processes beside; "
          f"ms, median / max\n")
    print("| library | dlopen, tracer with --no-hold | dlopen, tracer holding | held, as the holder measured | "
          "bound (200 ms) reached |")
    print("|---|---:|---:|---:|---:|")
    for name in libs:
        print(f"| {name} | {span(plain[name])} | {span(held[name])} | {span(holder[name])} | {bound[name]} |")
    print("\nThe holding tracer's summary (every hold it made, other processes' included): "
          f"{summary[-1] if summary else '–'}")


_EXEC_HELD = re.compile(r"while pid \d+ was held at its exec of (\S+) \((\d+\.\d) ms\)")


def exec_holds(rounds: int, load: int) -> None:
    """``trace --cmd "sh -c 'k1 1; k2 1; ...'"``: each copy of an nvcc program (the runtime linked in) is
    held at its exec until its probes are in, as the holder measured it."""
    nvcc = shutil.which("nvcc") or next(iter(sorted(Path("/usr/local").glob("cuda*/bin/nvcc"), reverse=True)), None)
    if nvcc is None:
        print("\n(no nvcc: the exec holds are not measured)")
        return
    work = Path(tempfile.mkdtemp(prefix="bench-exec-holds-"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        k = work / "k"
        subprocess.run([str(nvcc), "-o", str(k), str(REPO / "tests" / "live" / "workloads" / "cuda_loop.cu")],
                       check=True, capture_output=True)
        copies = [Path(shutil.copy(k, work / f"k{i}")) for i in range(rounds)]
        cmd = "sh -c '" + "; ".join(f"{c} 1" for c in copies) + "; true'"
        proc = subprocess.run([sys.executable, "-m", "ingero", "trace", "--json", "--db", str(work / "t.duckdb"),
                               "--no-serve", "--cmd", cmd], capture_output=True, text=True, cwd=REPO, timeout=600)
        notes = _notes([json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")])
        held = sorted(float(m.group(2)) for n in notes if (m := _EXEC_HELD.search(n)) and Path(m.group(1)) in copies)
    finally:
        for h in hogs:
            h.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nExec holds ({rounds} copies of an nvcc program with the runtime linked in, run one after another by "
          f"`sh -c` under `trace --cmd`; {load} busy processes beside): "
          + (f"held {held[len(held) // 2]:.1f} ms median, {held[-1]:.1f} ms max, {len(held)} of {rounds} seen"
             if held else "no hold seen"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the hold measurement")
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--holds-only", action="store_true")
    part.add_argument("--no-holds", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, not {args.rounds}")
    if not args.holds_only:
        attach_table(args.rounds)
        print()
    if not args.no_holds:
        holds_table(args.rounds, args.load)
        exec_holds(args.rounds, args.load)


if __name__ == "__main__":
    main()
