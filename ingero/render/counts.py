"""One wording per loss count, for every output that states it.

Rows that never reached the store are counted, not stored: CUDA calls whose
return was never seen (sessions.stale_calls) and runs of our BPF programs
the kernel skipped (sessions.probe_misses).  A clause for one-line summaries
(explain's analysed line, `ingero status`), a sentence for the end of a trace.
"""

from __future__ import annotations


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' if n != 1 else ''}"


def stale_calls_clause(n: int) -> str:
    return f"{_plural(n, 'stale CUDA call')} (never returned: longjmp or exception; not in events)"


def probe_misses_clause(n: int) -> str:
    return f"{_plural(n, 'probe run')} skipped by the kernel (rows may be missing)"


def stale_calls_sentence(n: int) -> str:
    return (f"{_plural(n, 'CUDA call')} never returned (left by longjmp or a C++ exception); "
            f"{'they have' if n != 1 else 'it has'} no row in events (sessions.stale_calls)")


def probe_misses_sentence(n: int) -> str:
    return (f"the kernel skipped {_plural(n, 'run')} of ingero's BPF programs (another BPF program "
            "or a bpf() syscall held the CPU); each may have lost a row (sessions.probe_misses)")


def failed_calls_sentence(failures: dict[str, int], calls: int) -> str:
    """The end of a trace: how many CUDA calls returned an error, by error name (most first)."""
    n = sum(failures.values())
    names = ", ".join(f"{k} {v:,}" for k, v in list(failures.items())[:3]) + (", …" if len(failures) > 3 else "")
    return (f"{n:,} of {max(n, calls):,} CUDA calls failed ({names}): `ingero explain` lists them by op "
            "and times only the calls that succeeded")
