"""The CLI edge: docs on every command, one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingero.cli import COMMANDS, cli, main
from ingero.store.db import Store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.duckdb"
    s = Store.open(path)
    sid = s.begin_session(command="test", targets="all")
    s.con.execute(
        """INSERT INTO events (session_id, timestamp, duration_ns, pid, tid, op, kind, bytes)
           VALUES ($s, 1, 100, 10, 10, 'cudaMemcpy', 'H2D', 4096),
                  ($s, 2, 300, 10, 11, 'cudaMemcpy', 'D2H', 8192),
                  ($s, 3, 5000, 10, 10, 'sched_switch', 'preempted', NULL)""",
        {"s": sid},
    )
    s.close()
    return path


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_is_documented_with_an_example(name: str) -> None:
    cmd = cli.get_command(None, name)  # type: ignore[arg-type]
    assert cmd is not None, f"command {name} is missing"
    text = CliRunner().invoke(cli, [name, "--help"]).output
    assert cmd.help and len(cmd.help.strip()) > 20, f"{name} needs a description"
    assert "ingero " + name in text or "Example" in text, f"{name} --help needs an example"


def test_query_table_output(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["query", "--db", str(db), "SELECT op, count(*) AS n FROM events GROUP BY op ORDER BY op"],
                         capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["op", "n"]
    assert lines[2].split() == ["cudaMemcpy", "2"]
    assert lines[3].split() == ["sched_switch", "1"]
    assert lines[-1] == "(2 rows)"


def test_query_json_and_csv(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["query", "--db", str(db), "--json",
                        "SELECT kind, bytes FROM events WHERE op='cudaMemcpy' ORDER BY bytes"], capsys)
    assert code == 0
    assert json.loads(out) == {"columns": ["kind", "bytes"], "truncated": False,
                               "rows": [{"kind": "H2D", "bytes": 4096}, {"kind": "D2H", "bytes": 8192}]}
    code, out, _ = run(["query", "--db", str(db), "--csv", "SELECT kind, bytes FROM events ORDER BY timestamp"], capsys)
    assert out.splitlines() == ["kind,bytes", "H2D,4096", "D2H,8192", "preempted,"]


def test_query_max_rows_truncates(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["query", "--db", str(db), "--max-rows", "1", "SELECT * FROM events"], capsys)
    assert code == 0
    assert "(1 row) (more rows not shown" in out


@pytest.mark.parametrize(
    "sql, fragment",
    [
        # the guard every path shares (daemon/sqlguard.py), then DuckDB's own refusal of file access
        ("COPY events TO '/tmp/ingero-leak.csv'", "COPY is refused: a query never reads or writes files"),
        ("SELECT * FROM read_text('/etc/shadow')", "refused: "),
        ("SELECT * FROM read_csv('/etc/passwd')", "refused: "),
        ("ATTACH '/tmp/other.duckdb' AS o", "ATTACH is refused"),
        ("INSTALL httpfs", "INSTALL/LOAD is refused"),
        ("LOAD httpfs", "INSTALL/LOAD is refused"),
        ("SET enable_external_access = true", "SET is refused"),
        ("DELETE FROM events", "DELETE is refused: queries are read-only"),
        ("DROP TABLE events", "DROP is refused: queries are read-only"),
        ("SELEC 1", "bad SQL: "),
        ("SELECT * FROM no_such_table", "bad SQL: "),
    ],
)
def test_query_refusals_are_one_line_exit_2(db: Path, sql: str, fragment: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["query", "--db", str(db), sql], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("ingero: " + fragment), err
    assert not Path("/tmp/ingero-leak.csv").exists()


def test_query_missing_db(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["query", "--db", str(tmp_path / "none.duckdb"), "SELECT 1"], capsys)
    assert code == 2
    assert err == (f"ingero: no ingero database at {tmp_path / 'none.duckdb'} — "
                   "run `sudo ingero trace` (or `ingero demo`) first, or pass --db PATH\n")


def test_query_corrupt_db(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(b"\x00garbage" * 100)
    code, _, err = run(["query", "--db", str(bad), "SELECT 1"], capsys)
    assert code == 2 and err.startswith(f"ingero: cannot open database {bad}") and err.count("\n") == 1


def test_query_schema_lists_tables(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["query", "--schema"], capsys)
    assert code == 0
    for table in ("events", "sessions", "process_names", "stacks", "system_metrics", "gpu_metrics"):
        assert f"\n{table}  -- " in "\n" + out
    assert "  duration_ns " in out


def test_bad_option_value_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["query", "--max-rows", "zero", "SELECT 1"], capsys)
    assert code == 2 and "bad --max-rows: 'zero' is not a whole number" in err


def test_check_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(["check", "--json", "--db", str(tmp_path / "x.duckdb")])
    except SystemExit as exc:  # exit 2 when the machine is not ready: the JSON is still printed
        assert exc.code == 2
    out = capsys.readouterr().out
    doc = json.loads(out)
    names = [c["name"] for c in doc["checks"]]
    assert names[:3] == ["root", "kernel", "BTF"] and "database" in names
    assert isinstance(doc["ready"], bool)
