"""What attaching and detaching the CUDA probes costs: uprobe_multi links against BCC's perf events.

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

    python -m bench.bench_attach [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, not {args.rounds}")
    libs = list(LibraryWatcher().poll())
    print(f"{len(libs)} libraries: {', '.join(str(x.path) for x in libs)}\n")
    results: dict[str, list[dict]] = {k: [] for k in KINDS}
    for _ in range(args.rounds):
        for kind in KINDS:
            results[kind].append(one_round(libs, kind))
    print("| probes as | probes | attach s | detach s | next tracer's attach, during the detach, s |")
    print("|---|---:|---:|---:|---:|")
    for kind, rs in results.items():
        def span(key: str) -> str:
            vals = sorted(r[key] for r in rs)
            return f"{vals[0]:.3f}–{vals[-1]:.3f}"
        print(f"| {kind} | {rs[0]['probes']} | {span('attach')} | {span('detach')} | {span('next_attach')} |")


if __name__ == "__main__":
    main()
