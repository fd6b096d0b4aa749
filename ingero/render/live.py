"""The live view of `ingero trace`: start-up lines, a per-second table, a summary.

Three forms from the same objects (ingero.traceapi StartInfo / TickStats /
TraceSummary): a rich table redrawn in place on a terminal, one plain line a
second when stdout is not a terminal, and NDJSON (one object per second,
then one summary object) with --json.  Start lines and notes name traced
processes: they go through the sanitiser (render/safe.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import IO, Any

from ingero.traceapi import OpStats, StartInfo, TickStats, TraceSummary
from ingero.render import counts, safe


def _ms(ns: float | None) -> str:
    if ns is None:
        return "-"
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.1f} µs"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def _ops_dict(ops: dict[str, OpStats]) -> dict[str, Any]:
    return {name: asdict(st) for name, st in sorted(ops.items())}


class LiveView:
    """Renders a trace as it runs.  ``stream`` defaults to stdout."""

    def __init__(self, *, as_json: bool = False, stream: IO[str] | None = None, err: IO[str] | None = None):
        self.as_json = as_json
        self.stream = stream or sys.stdout
        self.err = err or sys.stderr
        self.tty = self.stream.isatty() and not as_json
        self._live: Any = None
        self._console: Any = None
        if self.tty:
            from rich.console import Console

            self._console = Console(file=self.stream)

    # -- start -----------------------------------------------------------------

    def start(self, info: StartInfo) -> None:
        if self.as_json:
            self._json({"type": "start", "session_id": info.session_id, "db": info.db_path, "lines": info.lines})
            return
        out = self.err if not self.tty else self.stream
        for line in info.lines:
            print(f"ingero: {safe.text(line)}", file=out)
        print(f"ingero: session {info.session_id} -> {info.db_path}  (Ctrl-C to stop)", file=out)
        out.flush()
        if self.tty:
            from rich.live import Live

            self._live = Live(self._table(None), console=self._console, refresh_per_second=2, transient=False)
            self._live.start()

    # -- every second ----------------------------------------------------------

    def tick(self, t: TickStats) -> None:
        if self.as_json:
            self._json(
                {
                    "type": "tick",
                    "elapsed_s": round(t.elapsed_s, 3),
                    "events": t.events,
                    "events_per_s": round(t.events_per_s, 1),
                    "drops_kernel": t.drops_kernel,
                    "drops_user": t.drops_user,
                    "stale_calls": t.stale_calls,
                    "ops": _ops_dict(t.ops),
                    "notes": t.notes,
                }
            )
            return
        if self.tty and self._live is not None:
            for note in t.notes:
                # markup off: a note naming a process must not be read as rich markup either
                self._console.print(f"ingero: {safe.text(note)}", markup=False, highlight=False)
            self._live.update(self._table(t))
            return
        for note in t.notes:
            print(f"ingero: {safe.text(note)}", file=self.stream)
        ops = ", ".join(f"{name} {st.count} p99 {_ms(st.p99_ns)}" for name, st in sorted(t.ops.items()))
        print(
            f"{t.elapsed_s:6.1f}s  {t.events} events  {t.events_per_s:,.0f}/s  "
            f"drops {t.drops_kernel + t.drops_user}  {ops}",
            file=self.stream,
        )
        self.stream.flush()

    def _table(self, t: TickStats | None) -> Any:
        from rich.table import Table

        title = "ingero trace" if t is None else (
            f"ingero trace  {t.elapsed_s:.0f}s  {t.events:,} events  {t.events_per_s:,.0f}/s  "
            f"drops {t.drops_kernel + t.drops_user:,}"
        )
        table = Table(title=title, title_justify="left")
        for col in ("op", "count", "p50", "p95", "p99"):
            table.add_column(col, justify="left" if col == "op" else "right")
        if t is not None:
            for name, st in sorted(t.ops.items(), key=lambda kv: -kv[1].count):
                table.add_row(name, f"{st.count:,}", _ms(st.p50_ns), _ms(st.p95_ns), _ms(st.p99_ns))
        return table

    # -- end -------------------------------------------------------------------

    def finish(self, s: TraceSummary) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self.as_json:
            self._json(
                {
                    "type": "summary",
                    "session_id": s.session_id,
                    "db": s.db_path,
                    "elapsed_s": round(s.elapsed_s, 3),
                    "events": s.events,
                    "drops_kernel": s.drops_kernel,
                    "drops_user": s.drops_user,
                    "nest_skipped": s.nest_skipped,
                    "stale_calls": s.stale_calls,
                    "probe_misses": s.probe_misses,
                    "ended_by": s.ended_by,
                    "command_exit": s.command_exit,
                    "ops": _ops_dict(s.ops),
                    "notes": s.notes,
                }
            )
            return
        out = self.stream
        for note in s.notes:
            print(f"ingero: {safe.text(note)}", file=out)
        drops = s.drops_kernel + s.drops_user
        print(
            f"ingero: session {s.session_id} closed ({s.ended_by}) after {s.elapsed_s:.1f}s: "
            f"{s.events:,} events stored in {s.db_path}, {drops:,} dropped"
            + (f" (kernel {s.drops_kernel:,}, user {s.drops_user:,})" if drops else ""),
            file=out,
        )
        if s.stale_calls:
            print(f"ingero: {counts.stale_calls_sentence(s.stale_calls)}", file=out)
        if s.probe_misses:
            print(f"ingero: {counts.probe_misses_sentence(s.probe_misses)}", file=out)
        if s.command_exit is not None:
            print(f"ingero: the command exited with code {s.command_exit}", file=out)
        print(f"ingero: next: ingero explain --db {s.db_path}", file=out)

    def _json(self, obj: dict[str, Any]) -> None:
        self.stream.write(json.dumps(obj) + "\n")
        self.stream.flush()
