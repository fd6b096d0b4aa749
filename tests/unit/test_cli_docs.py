"""docs/cli.md is the commands' own --help (generated: `make docs`), and says every convention."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from ingero.cli import COMMANDS, cli
from ingero.commands.reference import markdown

ROOT = Path(__file__).resolve().parents[2]


def test_cli_md_is_current() -> None:
    assert (ROOT / "docs" / "cli.md").read_text() == markdown(), "run `make docs`"


def test_cli_md_holds_every_command_and_its_options() -> None:
    text = markdown()
    for name in COMMANDS:
        assert f"\n### `ingero {name}`\n" in text
    for sub in ("explain", "query", "status"):
        assert f"\n### `ingero fleet {sub}`\n" in text
    # the same help a terminal shows, at the page's width
    trace = CliRunner().invoke(cli, ["trace", "--help"], prog_name="ingero", terminal_width=100).output
    assert f"```\n{trace}```\n" in text


def test_the_conventions_name_the_exit_codes_and_the_forms() -> None:
    text = markdown()
    for line in ("| 1 | `explain --fail-on LEVEL` found a chain of LEVEL or above (`high`, `medium`, `low`) |",
                 "`sudo ingero trace -d 60s -- python3 train.py --lr 0.1`",
                 "`-p 12 -p 34`, `--pid 12,34`"):
        assert line in text
