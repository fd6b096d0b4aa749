"""`ingero export --format parquet`: hive-laid-out files that pyarrow and DuckDB read back
row for row as the store's selection."""

from __future__ import annotations

import stat
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from export_helpers import make_db
from ingero.cli import main

# replays.py's cache serves this module and the other replay users on one worker
pytestmark = pytest.mark.xdist_group("replays")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("parquet")
    db = make_db(d / "io.duckdb", "io-stall", duration_s=20)
    out = d / "out"
    assert main(["export", "--db", str(db), "--format", "parquet", "-o", str(out)]) == 0
    return db, out


def _rows(con, sql: str) -> list[tuple]:
    return sorted(con.execute(sql).fetchall(), key=repr)


@pytest.mark.parametrize("table, store_sql", [
    ("events", "SELECT * FROM events"),
    ("processes", "SELECT * FROM process_names WHERE pid IN (SELECT pid FROM events UNION "
                  "SELECT other_pid FROM events WHERE op = 'sched_switch')"),
    ("sessions", "SELECT * FROM sessions"),
])
def test_tables_read_back_row_for_row(exported, table: str, store_sql: str) -> None:
    db, out = exported
    files = list(out.glob(f"node=*/session=1/{table}.parquet"))
    assert len(files) == 1
    want = _rows(duckdb.connect(str(db), read_only=True), store_sql)
    assert want
    with_arrow = pq.read_table(files[0])
    assert sorted((tuple(r.values()) for r in with_arrow.to_pylist()), key=repr) == want
    assert _rows(duckdb.connect(), f"SELECT * FROM read_parquet('{files[0]}', hive_partitioning = false)") == want
    assert stat.S_IMODE(files[0].stat().st_mode) in (0o600, 0o640)


def test_chains_and_hive_partitions(exported) -> None:
    _, out = exported
    con = duckdb.connect()
    rows = con.execute(f"SELECT rank, rule_id, severity, session, len(evidence_windows) > 0 FROM read_parquet("
                       f"'{out}/**/chains.parquet', hive_partitioning = true) ORDER BY rank").fetchall()
    assert rows[0][1:] == ("io-stall", "HIGH", 1, True)
    assert pq.read_table(next(out.glob("node=*/session=1/chains.parquet"))).num_rows == len(rows)
    n = con.execute(f"SELECT count(DISTINCT node) FROM read_parquet('{out}/**/events.parquet', "
                    "hive_partitioning = true)").fetchone()[0]
    assert n == 1


def test_existing_directory_needs_force(exported, capsys) -> None:
    db, out = exported
    assert main(["export", "--db", str(db), "--format", "parquet", "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
