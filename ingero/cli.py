"""The ``ingero`` command: assembles the subcommands and owns the error edge.

Each subcommand lives in ingero/commands/<name>.py and only parses, calls one
library function and renders.  Errors a user can cause arrive here as
IngeroError and leave as one line on stderr with exit code 2; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from ingero import __version__
from ingero.errors import IngeroError
from ingero.render import safe

# name -> module in ingero.commands exposing a click command called `command`.
COMMANDS = ("trace", "explain", "query", "check", "demo", "status", "import", "export", "report", "mcp", "fleet")
MODULES = {"import": "import_cmd"}  # a command whose name is a Python keyword
# click >= 8.2 raises this for a group called without a command (8.1 printed the help and exited 0)
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class LazyGroup(click.Group):
    """Imports a subcommand only when it runs: `ingero query` never imports bcc."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        try:
            module = importlib.import_module(f"ingero.commands.{MODULES.get(name, name)}")
        except ModuleNotFoundError as exc:
            if exc.name == f"ingero.commands.{MODULES.get(name, name)}":
                return None  # not built yet
            raise
        return module.command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ingero")
def cli() -> None:
    """Why is my GPU job slow?  eBPF tracing of CUDA calls and host events.

    \b
      sudo ingero trace -- python3 train.py   record a job's CUDA calls + host events
      sudo ingero trace -d 120s             every CUDA process for two minutes
      ingero explain --since 120s           causal chains with fixes
      ingero query "SELECT op, count(*) FROM events GROUP BY op"
      ingero demo cpu-contention            the whole story, no GPU needed
      ingero check                          is this machine ready to trace?
    """


def _exit_now_if_stuck(code: int) -> None:
    """After Ctrl-C left a database statement running in C (daemon.access.STUCK), end the process
    at once: a normal exit would wait for that statement in DuckDB's teardown, forever for a
    runaway query."""
    access = sys.modules.get("ingero.daemon.access")  # not imported: nothing of it can be running
    if access is not None and access.STUCK.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="ingero", standalone_mode=False)
    except IngeroError as exc:
        # a message may quote a file's or a traced process's text: one printable line
        click.echo(f"ingero: {safe.text(exc)}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("ingero: aborted", err=True)
        _exit_now_if_stuck(130)
        return 130
    except NO_ARGS_IS_HELP as exc:
        # bare `ingero` (or `ingero fleet`): the help, on stdout, exit 0, as `git` does
        click.echo(exc.ctx.get_help() if exc.ctx is not None else cli.get_help(click.Context(cli)))
        return 0
    except click.UsageError as exc:
        # One line, like every other user error: what is wrong and where to look.
        where = (f"ingero {exc.ctx.command_path.split(' ', 1)[1]} --help"
                 if exc.ctx and " " in exc.ctx.command_path else "ingero --help")
        click.echo(f"ingero: {exc.format_message()} — see `{where}`", err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"ingero: {exc.format_message()}", err=True)
        return 2 if exc.exit_code in (1, 2) else exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:  # a command's own exit code (check: 2 not ready; explain --fail-on: 1)
        if isinstance(exc.code, int) or exc.code is None:
            return exc.code or 0
        raise
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
