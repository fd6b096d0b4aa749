"""docs/cli.md: the conventions every command follows, then each command's --help as it prints.

Generated (`make docs`) and compared in tests/unit/test_cli_docs.py, so the page
never drifts from the options: a new option changes the page in the same commit.
"""

from __future__ import annotations

import click

from ingero.cli import COMMANDS, cli

WIDTH = 100  # the help's line width in the page (a terminal's differs; the text does not)

CONVENTIONS = """\
# The `ingero` command line

Generated from the commands themselves (`make docs`; tests/unit/test_cli_docs.py
fails when this page and `--help` differ).  `ingero` alone prints the command list.

## Conventions

- **A command to trace** goes after `--`, as `nsys`, `py-spy` and `perf` take it:
  `sudo ingero trace -d 60s -- python3 train.py --lr 0.1`.  Everything after the
  first word that is not one of ingero's options is the job, word for word (no
  shell re-splits or expands it).  `--cmd "python3 train.py"` is the same as one
  string, split like a shell would, run without one.  Both at once is an error.
- **Processes**: `-p`/`--pid` on `trace`, `explain`, `check`, `export` and
  `report`, repeated or comma-separated alike: `-p 12 -p 34`, `--pid 12,34`.
- **Values**: durations `30s`, `2m`, `1h30m`, `250ms` (a bare number is seconds);
  sizes `10GB`, `512MiB`; times ISO (`2026-11-22T21:05:00`, local unless it has an
  offset) or epoch seconds.
- **Output**: results on stdout; ingero's own lines (progress, notes, errors) on
  stderr.  `trace` prints nothing on stdout but with `--json` (NDJSON: a start
  object, one a second, a summary), so a traced job's stdout is its own (under
  `--json` the job's stdout goes to stderr).  `trace -v` adds the tracer's own
  accounting at the end (how its per-second summaries were written, how long
  its holds took); `--json` always carries those notes.
- **Exit codes**:

  | code | meaning |
  | --- | --- |
  | 0 | done (`check`: this machine can trace) |
  | 1 | `explain --fail-on LEVEL` found a chain of LEVEL or above (`high`, `medium`, `low`) |
  | 2 | bad input or a problem you can fix (one line on stderr saying what and how); `check`: not ready |
  | 130 | interrupted (Ctrl-C; `trace` stops on Ctrl-C as on `--duration`: 0) |

  `trace` exits 0 whatever its command's exit code, which it prints at the end
  (`the command exited with code N`; `command_exit` in `--json`'s summary).
  An unexpected error keeps its traceback: it is a bug, please report it.

## Commands
"""


def _contexts() -> list[click.Context]:
    """A context per command and subcommand, in `ingero --help`'s order, as the shell builds them."""
    root = click.Context(cli, info_name="ingero", terminal_width=WIDTH, max_content_width=WIDTH, **cli.context_settings)
    out = [root]
    for name in COMMANDS:
        cmd = cli.get_command(root, name)
        if cmd is None:
            continue
        ctx = click.Context(cmd, info_name=name, parent=root)
        out.append(ctx)
        if isinstance(cmd, click.Group):
            out += [click.Context(cmd.get_command(ctx, sub), info_name=sub, parent=ctx)
                    for sub in cmd.list_commands(ctx)]
    return out


def markdown() -> str:
    parts = [CONVENTIONS]
    for ctx in _contexts():
        parts.append(f"\n### `{ctx.command_path}`\n\n```\n{ctx.get_help()}\n```\n")
    return "".join(parts)
