"""ingero explain: causal chains (host cause -> slow CUDA calls -> fix) from the store."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ingero.commands.options import COUNT, DURATION, PID, TIME, TIMEOUT, WINDOW, db_option, json_option, resolve_db
from ingero.daemon import protocol


@click.command("explain")
@click.option("--since", type=DURATION, metavar="DURATION", default=None,
              help="Only the last DURATION of the session (30s, 2m, 1h30m).")
@click.option("--from", "from_ns", metavar="TIME", type=TIME, default=None,
              help="Start (ISO time, local unless it has an offset, or epoch seconds).")
@click.option("--to", "to_ns", metavar="TIME", type=TIME, default=None,
              help="End (ISO time or epoch seconds).")
@click.option("--session", type=COUNT, default=None, help="Session id (default: the latest).")
@click.option("--pid", "pids", type=PID, multiple=True, help="Only these processes (repeatable).")
@click.option("--window", "window_s", type=WINDOW, default=None,
              help="Window length, at least 1s (default: span/30, between 1 s and 60 s).")
@click.option("--stack", is_flag=True, help="Add the top callers and most-preempted source lines.")
@click.option("-v", "--verbose", is_flag=True,
              help="Every line of each chain (what contributed, every root, effect and fix line), every step part.")
@click.option("--timeout", "timeout_s", type=TIMEOUT, default=protocol.DEFAULT_TIMEOUT_S, show_default=True,
              help=f"Stop after this long (at most {protocol.MAX_TIMEOUT_S:.0f}s); Ctrl-C stops it too.")
@json_option
@db_option
def command(since: float | None, from_ns: int | None, to_ns: int | None, session: int | None,
            pids: tuple[int, ...], window_s: float | None, stack: bool, verbose: bool, timeout_s: float,
            as_json: bool, db_path: Path | None) -> None:
    """Explain why the traced GPU job was slow: causal chains with fixes.

    \b
      ingero explain                       the latest session
      ingero explain --since 2m            its last two minutes
      ingero explain -v                    every line of each chain
      ingero explain --pid 4242 --json     one process, machine-readable
      ingero explain --session 3 --stack   with source lines (needs trace --stack)
    """
    from dataclasses import asdict

    from ingero.analyze.context import Options
    from ingero.daemon import access, client

    opts = Options(session=session, since_s=since, from_ns=from_ns, to_ns=to_ns,
                   pids=pids, window_s=window_s, stack=stack)
    args = {k: v for k, v in asdict(opts).items() if v not in (None, ())}
    if "pids" in args:
        args["pids"] = list(args["pids"])
    reply = access.read(resolve_db(db_path), timeout_s=timeout_s,
                        local=lambda con: _explain_file(con, opts),
                        remote=lambda sock: client.explain(socket_path=sock, timeout_s=timeout_s, **args))
    if as_json:
        json.dump(reply["json"], sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from ingero.render import reply as shown

        shown.write(reply, sys.stdout, verbose)


def _explain_file(con: Any, opts: Any) -> dict[str, Any]:
    from ingero.analyze.explain import explain
    from ingero.render.json import explain_payload

    return explain_payload(explain(con, opts))
