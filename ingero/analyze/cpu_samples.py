"""Where a thread's CPU time goes, from the CPU sampler of ``ingero trace --stack``.

With ``--stack`` the tracer samples the traced processes' threads at ~99 Hz
(bpf/sample.bpf.c): one ``events`` row per sample, op ``cpu_sample``, with the
thread's stack (``stack_id``), the CUDA call it was inside (``in_call``, NULL
outside every call) and whether device work it issued since its last sync
may still run (``queued``: FALSE right after a sync returned, until the next
launch or copy, when the device has nothing of the thread's to run).

``top_lines(con, ctx, tid, ws)`` groups the samples of thread ``tid`` taken
outside CUDA calls in windows ``ws`` by their innermost Python frame and its
caller: "the Python lines where the host time goes".
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze.context import Context

OP = "cpu_sample"

# A frame of PyTorch's DataLoader (the single-process iterator runs it on the
# loop thread: num_workers=0), or a function by one of the names its fetch path uses.
LOADER_FILES = ("torch/utils/data/",)
LOADER_FUNCTIONS = frozenset({"_next_data", "fetch", "default_collate", "collate", "pin_memory"})

SAMPLES_SQL = """
SELECT stack_id, count(*) AS n, count(*) FILTER (queued IS NOT TRUE) AS idle_n
FROM events
WHERE session_id = $sid AND op = 'cpu_sample' AND tid = $tid AND timestamp >= $t0 AND timestamp < $t1
  AND in_call IS NULL AND list_contains($ws, (timestamp - $t0) // $wns)
GROUP BY stack_id
"""

# Samples of the thread in the windows, whatever it was doing (the denominator).
ALL_SQL = """
SELECT count(*) FROM events
WHERE session_id = $sid AND op = 'cpu_sample' AND tid = $tid AND timestamp >= $t0 AND timestamp < $t1
  AND list_contains($ws, (timestamp - $t0) // $wns)
"""

FRAMES_SQL = """
SELECT stack_id, depth, file, line, function, source FROM stacks
WHERE frame_kind = 'python' AND list_contains($ids, stack_id)
ORDER BY stack_id, depth
"""


@dataclass(frozen=True)
class Site:
    file: str
    line: int | None
    function: str
    source: str | None

    def short(self) -> str:
        name = self.file.rsplit("/", 1)[-1] if self.file else "?"
        return f"{name}:{self.line}" if self.line is not None else name

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function, "source": self.source}


@dataclass(frozen=True)
class Line:
    """Samples outside CUDA calls whose innermost Python frame is ``site``, called from ``caller``."""

    site: Site
    caller: Site | None
    samples: int
    idle_samples: int  # of them, with nothing of the thread's queued on the device
    share: float  # of the thread's samples outside CUDA calls
    loader: bool  # a DataLoader frame is on the stack

    def text(self) -> str:
        out = f"{self.site.short()}  {self.site.function}"
        if self.site.source:
            out += f": {self.site.source.strip()}"
        if self.caller is not None:
            out += f"  ← {self.caller.short()} {self.caller.function}"
            if self.caller.source:
                out += f": {self.caller.source.strip()}"
        return out

    def to_dict(self) -> dict:
        return {**self.site.to_dict(), "caller": self.caller.to_dict() if self.caller else None,
                "samples": self.samples, "idle_samples": self.idle_samples, "share": round(self.share, 4),
                "loader": self.loader}


@dataclass(frozen=True)
class Sampled:
    total: int  # the thread's samples in the windows
    outside: int  # of them outside every CUDA call, with a stack
    loader: int  # of those, with a DataLoader frame on the stack
    lines: tuple[Line, ...]
    idle: int = 0  # of the samples outside calls, those with nothing of the thread's queued on the device

    @property
    def loader_share(self) -> float:
        """Share of the samples outside CUDA calls with a DataLoader frame on the stack."""
        return self.loader / self.outside if self.outside else 0.0


def has_samples(con) -> bool:
    row = con.execute("SELECT count(*) FROM (SELECT 1 FROM events WHERE op = 'cpu_sample' LIMIT 1)").fetchone()
    return bool(row and row[0])


def _is_loader(file: str | None, function: str | None) -> bool:
    f = (file or "").replace("\\", "/")
    return any(x in f for x in LOADER_FILES) or (function or "") in LOADER_FUNCTIONS and "torch" in f


def top_lines(ctx: Context, tid: int, ws: list[int], limit: int = 5, idle_first: bool = False) -> Sampled | None:
    """The thread's samples outside CUDA calls in windows ``ws``, by line; None without samples.

    ``idle_first``: lines ranked by their samples with nothing of the thread's queued on the
    device (the host work the device waited for), not by all their samples."""
    con = ctx.con
    p = {"sid": ctx.session_id, "tid": tid, "t0": ctx.start_ns, "t1": ctx.end_ns, "wns": ctx.window_ns,
         "ws": ws or [-1]}
    total = int(con.execute(ALL_SQL, p).fetchone()[0] or 0)
    if not total:
        return None
    counts = {sid: (int(n), int(idle)) for sid, n, idle in con.execute(SAMPLES_SQL, p).fetchall()
              if sid is not None}
    frames: dict[int, list[tuple]] = {}
    if counts:
        for sid, _depth, file, line, function, source in con.execute(FRAMES_SQL, {"ids": list(counts)}).fetchall():
            frames.setdefault(int(sid), []).append((file, line, function, source))
    groups: dict[tuple, list] = {}
    outside = loader_n = idle_n = 0
    for sid, (n, idle) in counts.items():
        fr = frames.get(sid)
        if not fr or fr[0][0] is None:  # no Python frame, or the innermost one was unreadable
            continue
        outside += n
        idle_n += idle
        site = Site(*fr[0])
        caller = Site(*fr[1]) if len(fr) > 1 and fr[1][0] is not None else None  # an unreadable caller: none
        loader = any(_is_loader(f[0], f[2]) for f in fr)
        loader_n += n if loader else 0
        g = groups.setdefault((site, caller), [0, 0, False])
        g[0] += n
        g[1] += idle
        g[2] = g[2] or loader
    lines = sorted(
        (Line(site, caller, n, idle, n / outside, loader) for (site, caller), (n, idle, loader) in groups.items()),
        key=lambda x: (-(x.idle_samples if idle_first else x.samples), -x.samples, x.site.file or "", x.site.line or 0),
    )
    return Sampled(total, outside, loader_n, tuple(lines[:limit]), idle_n)


# Frames of the interpreter's own library and installed packages: a user's line is the first
# frame outside them, counted from the innermost (json.dumps runs in json/encoder.py).
LIBRARY_PARTS = ("/lib/python", "/site-packages/", "/dist-packages/", "<frozen ")


def _is_library(file: str | None) -> bool:
    return not file or file.startswith("<") or any(p in file for p in LIBRARY_PARTS)


def user_lines(ctx: Context, tid: int, ws: list[int], limit: int = 3) -> tuple[int, list[tuple[Site, int]]]:
    """(samples outside CUDA calls with a Python stack, [(the innermost frame of the user's own
    code, its samples)]) of thread ``tid`` in windows ``ws``: where a helper thread (a GIL
    holder) spends its CPU, in the caller's terms."""
    con = ctx.con
    p = {"sid": ctx.session_id, "tid": tid, "t0": ctx.start_ns, "t1": ctx.end_ns, "wns": ctx.window_ns,
         "ws": ws or [-1]}
    counts = {int(sid): int(n) for sid, n, _ in con.execute(SAMPLES_SQL, p).fetchall() if sid is not None}
    if not counts:
        return 0, []
    frames: dict[int, list[tuple]] = {}
    for sid, _depth, file, line, function, source in con.execute(FRAMES_SQL, {"ids": list(counts)}).fetchall():
        frames.setdefault(int(sid), []).append((file, line, function, source))
    by_site: dict[Site, int] = {}
    total = 0
    for sid, n in counts.items():
        fr = frames.get(sid)
        if not fr:
            continue
        total += n
        mine = next((f for f in fr if not _is_library(f[0])), fr[0])
        if mine[0] is None:
            continue
        site = Site(*mine)
        by_site[site] = by_site.get(site, 0) + n
    ranked = sorted(by_site.items(), key=lambda kv: (-kv[1], kv[0].file, kv[0].line or 0))
    return total, ranked[:limit]
