"""The export entry point: open the store read-only, resolve the selection, write atomically."""

from __future__ import annotations

from pathlib import Path

from ingero.analyze.context import Options
from ingero.errors import IngeroError
from ingero.export import output
from ingero.export.selection import select
from ingero.store.db import Store


def _kind(fmt: str) -> output.Kind:
    if fmt == "perfetto":
        from ingero.export import perfetto

        return output.Kind("Perfetto trace", False, perfetto.is_ours)
    if fmt == "parquet":
        from ingero.export import parquet

        return output.Kind("Parquet export", True, parquet.is_ours)
    if fmt == "html":
        from ingero.export import report_html

        return output.Kind("HTML report", False, report_html.is_ours)
    raise IngeroError(f"unknown format {fmt!r}", "use perfetto or parquet")


def check_report_target(path: Path) -> None:
    """Fail at once where the report could not be written (the demo asks before its runs)."""
    output.check_target(path, True, _kind("html"))


def export(db: Path, fmt: str, path: Path, opts: Options, *, force: bool = False) -> str:
    """Write the export; return the one line to print about it."""
    kind = _kind(fmt)
    output.check_target(path, force, kind)  # before the (slow) work: a wrong -o fails at once
    store = Store.open(db, read_only=True)
    try:
        sel = select(store.con, opts)
        if fmt == "perfetto":
            from ingero.export import perfetto

            with output.atomic_file(path, force, kind) as tmp, open(tmp, "wb") as f:
                s = perfetto.export(store.con, sel, opts, f, path)
            device = f"{s.device_slices:,} device slices, " if s.device_slices else ""
            return (f"wrote {path}: {s.events:,} events, {device}{s.chains} chains with {s.flows} arrows, "
                    f"{s.bytes / 1e6:.1f} MB — open it in https://ui.perfetto.dev")
        if fmt == "parquet":
            from ingero.export import parquet

            with output.atomic_dir(path, force, kind) as tmp:
                rows = parquet.export(store.con, sel, opts, tmp)
            return f"wrote {path}: " + ", ".join(f"{k} ({v:,} rows)" for k, v in rows.items())
        raise IngeroError(f"unknown format {fmt!r}", "use perfetto or parquet")
    finally:
        store.close()


def report(db: Path, path: Path, opts: Options, *, force: bool = False,
           after: tuple[Path, Options] | None = None) -> str:
    """Write the one-file HTML report; return the line to print about it.  ``after``: the fixed
    run's store and range (the demo's second run): the page adds before/after."""
    from ingero.analyze.explain import explain
    from ingero.export import report_data, report_html, report_timeline

    kind = _kind("html")
    output.check_target(path, force, kind)
    after_rep = None
    if after is not None:
        store = Store.open(after[0], read_only=True)
        try:
            after_rep = explain(store.con, after[1])
        finally:
            store.close()
    store = Store.open(db, read_only=True)
    try:
        sel = select(store.con, opts)
        rep = explain(store.con, opts)
        # (after explain, on its connection: the step breakdown reads the window tables it built)
        charts = report_data.collect(store.con, sel, opts, rep.steps)
        timeline = report_timeline.collect(store.con, rep, charts.params)
        with output.atomic_file(path, force, kind) as tmp, open(tmp, "w", encoding="utf-8") as f:
            n = report_html.write(rep, charts, f, timeline=timeline, after=after_rep)
            size = f.tell()
    finally:
        store.close()
    ba = ", before/after" if after_rep is not None else ""
    return f"wrote {path}: {len(rep.chains)} chains, {n} charts{ba}, {size / 1e6:.1f} MB"
