"""ingero explain: causal chains (host cause -> slow CUDA calls -> fix) from the store."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ingero.commands.options import (DURATION, SESSION, TIME, TIMEOUT, WINDOW, db_option, json_option, pid_option,
                                     resolve_db)
from ingero.daemon import protocol

# --fail-on LEVEL: exit FAIL_EXIT when a chain of that severity or above is found (a CI job's gate).
# 1, not 2: 2 is every command's "bad input", so a script tells a finding from a mistake.
FAIL_LEVELS = ("high", "medium", "low")  # most severe first, as analyze.model.SEVERITIES
FAIL_EXIT = 1


@click.command("explain")
@click.option("--since", type=DURATION, metavar="DURATION", default=None,
              help="Only the last DURATION of the session (30s, 2m, 1h30m).")
@click.option("--from", "from_ns", metavar="TIME", type=TIME, default=None,
              help="Start (ISO time, local unless it has an offset, or epoch seconds).")
@click.option("--to", "to_ns", metavar="TIME", type=TIME, default=None,
              help="End (ISO time or epoch seconds).")
@click.option("--session", type=SESSION, default=None, help="Session id (default: the latest).")
@pid_option("Only these processes.")
@click.option("--window", "window_s", type=WINDOW, default=None,
              help="Window length, at least 1s (default: span/30, between 1 s and 60 s).")
@click.option("--stack", is_flag=True, help="Add the top callers and most-preempted source lines.")
@click.option("-v", "--verbose", is_flag=True,
              help="Every line of each chain (what contributed, every root, effect and fix line), every step part.")
@click.option("--timeout", "timeout_s", type=TIMEOUT, default=protocol.DEFAULT_TIMEOUT_S, show_default=True,
              help=f"Stop after this long (at most {protocol.MAX_TIMEOUT_S:.0f}s); Ctrl-C stops it too.")
@click.option("--fail-on", "fail_on", type=click.Choice(FAIL_LEVELS, case_sensitive=False), default=None,
              metavar="high|medium|low",
              help=f"Exit {FAIL_EXIT} when a chain of this severity or above is found (for CI); "
                   "the output is the same.")
@json_option
@db_option
def command(since: float | None, from_ns: int | None, to_ns: int | None, session: int | None,
            pids: tuple[int, ...], window_s: float | None, stack: bool, verbose: bool, timeout_s: float,
            fail_on: str | None,
            as_json: bool, db_path: Path | None) -> None:
    """Explain why the traced GPU job was slow: causal chains with fixes.

    Exit code 0, or with --fail-on LEVEL 1 when a chain of LEVEL or above
    was found (--fail-on medium: a HIGH or MEDIUM chain); 2 on bad input.

    \b
      ingero explain                       the latest session
      ingero explain --since 2m            its last two minutes
      ingero explain -v                    every line of each chain
      ingero explain -p 4242,4243 --json   two processes, machine-readable
      ingero explain --session 3 --stack   with source lines (needs trace --stack)
      ingero explain --fail-on high        in CI: exit 1 on a HIGH chain
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
    if fail_on is not None and failing(reply["json"], fail_on):
        sys.stdout.flush()
        raise SystemExit(FAIL_EXIT)


def failing(payload: dict[str, Any], fail_on: str) -> bool:
    """Whether explain's JSON holds a chain of severity ``fail_on`` or above."""
    worst = FAIL_LEVELS.index(fail_on.lower())
    return any(str(c.get("severity", "")).lower() in FAIL_LEVELS[:worst + 1] for c in payload.get("chains", []))


def _explain_file(con: Any, opts: Any) -> dict[str, Any]:
    from ingero.analyze.explain import explain
    from ingero.render.json import explain_payload

    return explain_payload(explain(con, opts))
