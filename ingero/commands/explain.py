"""ingero explain: causal chains (host cause -> slow CUDA calls -> fix) from the store."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ingero.commands.options import DURATION, db_option, json_option, parse_duration, resolve_db
from ingero.errors import IngeroError


def _since(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """--since parsed like options.DURATION, but a bad value is one line (IngeroError, exit 2)."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise IngeroError(f"bad --since: {exc}") from None


def _time(flag: str) -> "click.Parameter":
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
        from ingero.analyze.context import parse_time

        if value is None:
            return None
        try:
            return parse_time(value)
        except ValueError as exc:
            raise IngeroError(f"bad {flag}: {exc}") from None

    return convert


@click.command("explain")
@click.option("--since", metavar="DURATION", callback=_since, default=None,
              help="Only the last DURATION of the session (30s, 2m, 1h30m).")
@click.option("--from", "from_ns", metavar="TIME", callback=_time("--from"), default=None,
              help="Start (ISO time, local unless it has an offset, or epoch seconds).")
@click.option("--to", "to_ns", metavar="TIME", callback=_time("--to"), default=None,
              help="End (ISO time or epoch seconds).")
@click.option("--session", type=int, default=None, help="Session id (default: the latest).")
@click.option("--pid", "pids", type=int, multiple=True, help="Only these processes (repeatable).")
@click.option("--window", "window_s", type=DURATION, default=None,
              help="Window length (default: span/30, between 1 s and 60 s).")
@click.option("--stack", is_flag=True, help="Add the top callers and most-preempted source lines.")
@json_option
@db_option
def command(since: float | None, from_ns: int | None, to_ns: int | None, session: int | None,
            pids: tuple[int, ...], window_s: float | None, stack: bool, as_json: bool,
            db_path: Path | None) -> None:
    """Explain why the traced GPU job was slow: causal chains with fixes.

    \b
      ingero explain                       the latest session
      ingero explain --since 2m            its last two minutes
      ingero explain --pid 4242 --json     one process, machine-readable
      ingero explain --session 3 --stack   with source lines (needs trace --stack)
    """
    from ingero.analyze.context import Options

    opts = Options(session=session, since_s=since, from_ns=from_ns, to_ns=to_ns,
                   pids=pids, window_s=window_s, stack=stack)
    path = resolve_db(db_path)
    reply = _explain_local(path, opts)
    if reply is None:  # a running tracer holds the file: it runs explain for us
        reply = _explain_in_tracer(path, opts)
    if as_json:
        json.dump(reply["json"], sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(reply["text"])


def _explain_local(path: Path, opts: Any) -> dict[str, Any] | None:
    """{"json", "text"} from the file, or None when a tracer holds its lock."""
    import io

    from ingero.analyze.explain import explain
    from ingero.render import json as render_json
    from ingero.render import terminal
    from ingero.store.db import Store

    try:
        store = Store.open(path, read_only=True)
    except IngeroError as exc:
        from ingero.daemon.client import is_lock_error

        if is_lock_error(exc):
            return None
        raise
    try:
        report = explain(store.con, opts)
    finally:
        store.close()
    text = io.StringIO()
    terminal.write(report, text)
    return {"json": render_json.to_dict(report), "text": text.getvalue()}


def _explain_in_tracer(path: Path, opts: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from ingero.daemon import client

    sock = client.find_socket(path)
    if sock is None:
        raise IngeroError(
            f"database {path} is locked by another process and no ingero tracer serving it was found",
            "wait for that process to finish, or pass another --db",
        )
    args = asdict(opts)
    args["pids"] = list(args["pids"])
    return client.explain(socket_path=sock, **args)
