"""Issue 41.3: terminal escapes in a traced process's name, an NVTX range, an op name or a fleet node's
chain text are shown escaped by every terminal view (explain, query, fleet, status, check, the error
line); JSON keeps its own escaping.  The sanitiser itself is checked with hypothesis."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from analyze_helpers import MAIN_PID, Trace
from ingero.cli import cli, main
from ingero.errors import IngeroError
from ingero.render import safe, table, terminal
from ingero.render import status as render_status
from ingero.store.query import QueryResult

# what an attacker's process name holds: retitle the window (OSC ... BEL), clear the screen (CSI),
# a C1 CSI, DEL, and a right-to-left override that makes "exe.txt" read "txt.exe"
TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J"
HOSTILE = f"{TITLE}stress{CLEAR}\x9b1m\x7f\u202etxt.exe"
SHOWN = r"\x1b]0;owned\x07stress\x1b[2J\x9b1m\x7f\u202etxt.exe"
STRESS = 7000


def raw_controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (line breaks of the view itself aside)."""
    return [c for c in text if not c.isprintable() and c != "\n"]


# -- the sanitiser ------------------------------------------------------------------------


@given(st.text())
def test_the_sanitised_form_of_any_string_is_printable(s):
    assert safe.text(s).isprintable()
    assert raw_controls(safe.lines(s)) == []
    assert safe.lines(s).count("\n") == s.count("\n")


@given(st.text(st.characters(codec="utf-8")).filter(str.isprintable))
def test_printable_text_is_unchanged(s):
    assert safe.text(s) == s and safe.lines(s) == s


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b", r"\x1b"), ("\x07", r"\x07"), ("\x00", r"\x00"), ("\t", r"\t".replace("t", "x09")),
    ("\r", r"\x0d"), ("\x7f", r"\x7f"), ("\x9b", r"\x9b"), ("\x85", r"\x85"),
    ("\u202e", r"\u202e"), ("\u2066", r"\u2066"), ("\u2028", r"\u2028"), ("\udcff", r"\udcff"),
    ("\U000e0001", r"\U000e0001"), ("a\\x1b", "a\\x1b"), ("tr\u00e4in.py 训练", "tr\u00e4in.py 训练"),
])
def test_each_kind_of_control_is_shown_escaped(raw, shown):
    assert safe.text(raw) == shown


def test_lines_keeps_the_views_line_breaks_and_escapes_the_rest():
    assert safe.lines(f"a{CLEAR}\nb\r\n") == "a\\x1b[2J\nb\\x0d\n"


# -- explain, from a store whose names are hostile -----------------------------------------


def hostile_trace() -> Trace:
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", f"python3 train.py {TITLE}")
    tr.name(STRESS, HOSTILE, "stress", f"stress --cpu 2 {CLEAR}")
    tr.loop(0, 10).loop(10, 20, preempt_ms=40, preempt_by=STRESS).loop(20, 30)
    return tr.competitor(STRESS, HOSTILE, 10, 20).system(0, 30, cpu_pct=91.0, load1=6.1)


@pytest.fixture
def hostile_db(tmp_path: Path) -> Path:
    path = tmp_path / "ingero.duckdb"
    hostile_trace().store(path).close()
    return path


def test_explain_text_shows_a_hostile_process_name_escaped(hostile_db: Path):
    res = CliRunner().invoke(cli, ["explain", "--db", str(hostile_db)])
    assert res.exit_code == 0, res.output
    assert raw_controls(res.output) == []
    assert "[HIGH] CPU scheduling contention" in res.output  # the hostile process was analysed
    assert SHOWN in res.output  # and named, escaped


def test_explain_json_escapes_the_same_name_itself(hostile_db: Path):
    res = CliRunner().invoke(cli, ["explain", "--db", str(hostile_db), "--json"])
    assert res.exit_code == 0, res.output
    assert raw_controls(res.output) == [] and "\\u001b]0;owned\\u0007" in res.output
    doc = json.loads(res.output)
    assert any(HOSTILE in " ".join(c["root"] + c["contributing"] + c["fix"]) for c in doc["chains"])


def test_an_nvtx_range_name_is_shown_escaped_in_the_steps_line():
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3")
    tr.loop(0, 10)
    starts = sorted({e["timestamp"] for e in tr.events if e["op"] == "cudaStreamSync"})
    for a, b in zip(starts, starts[1:]):
        tr.span(MAIN_PID, 1, a, b, f"step{CLEAR}")
    report = tr.explain()
    assert report.steps is not None and report.steps.source == "nvtx"
    out = io.StringIO()
    terminal.write(report, out)
    assert raw_controls(out.getvalue()) == []
    assert "NVTX ranges 'step\\x1b[#J'" in out.getvalue()  # digits are the family's step number


def test_explain_text_from_a_tracer_is_sanitised_again_by_the_client(hostile_db: Path, monkeypatch):
    # an older tracer sends its text unsanitised: the client keeps only its line breaks
    from ingero.daemon import client
    from ingero.store import db as store_db

    def locked(*a, **k):
        raise store_db.DatabaseLocked(hostile_db, "Conflicting lock is held")

    monkeypatch.setattr(store_db.Store, "open", classmethod(lambda cls, *a, **k: locked()))
    monkeypatch.setattr(client, "find_socket", lambda path, **kw: Path("/run/ingero.sock"))
    monkeypatch.setattr(client, "explain", lambda **kw: {"json": {}, "text": f"Root: {HOSTILE}\nFix: renice\n"})
    res = CliRunner().invoke(cli, ["explain", "--db", str(hostile_db)])
    assert res.exit_code == 0 and res.output == f"Root: {SHOWN}\nFix: renice\n"


def test_the_tracers_explain_reply_is_already_sanitised(hostile_db: Path, tmp_path: Path):
    from ingero.daemon.server import QueryServer
    from ingero.store.db import Store

    store = Store.open(hostile_db)
    srv = QueryServer(store.con.cursor, tmp_path / "s.sock", group=None).start()
    try:
        reply = srv.handle({"op": "explain", "args": {}})
    finally:
        srv.stop()
        store.close()
    assert reply["ok"] and SHOWN in reply["result"]["text"] and raw_controls(reply["result"]["text"]) == []


# -- query, status, check, the error line ----------------------------------------------------


def test_query_table_and_csv_on_a_terminal_show_stored_names_escaped(hostile_db: Path):
    sql = "SELECT pid, name, cmdline FROM process_names ORDER BY pid"
    res = CliRunner().invoke(cli, ["query", "--db", str(hostile_db), sql])
    assert res.exit_code == 0, res.output
    assert raw_controls(res.output) == [] and SHOWN in res.output and "(2 rows)" in res.output
    result = QueryResult(["name"], ["VARCHAR"], [(HOSTILE,)], False)
    shown = io.StringIO()
    table.write_csv(result, shown, terminal=True)
    assert shown.getvalue() == f"name\n{SHOWN}\n"
    kept = io.StringIO()  # into a file or a pipe CSV keeps the stored bytes
    table.write_csv(result, kept)
    assert kept.getvalue() == f"name\n{HOSTILE}\n"


def test_query_json_escapes_control_characters(hostile_db: Path):
    res = CliRunner().invoke(cli, ["query", "--db", str(hostile_db), "--json",
                                   f"SELECT name FROM process_names WHERE pid = {STRESS}"])
    assert res.exit_code == 0 and raw_controls(res.output) == []
    assert json.loads(res.output)["rows"] == [{"name": HOSTILE}]


def test_a_column_alias_is_escaped_too():
    out = io.StringIO()
    table.write_text(QueryResult([CLEAR], ["INTEGER"], [(1,)], False), out)
    assert raw_controls(out.getvalue()) == [] and out.getvalue().startswith("\\x1b[2J")


def test_status_lines_escape_the_targets():
    st = {"running": True, "source": "socket", "db_path": "/tmp/x.duckdb", "db_bytes": 10, "wal_bytes": 0,
          "session": {"session_id": 1, "tracer_pid": 5, "started_ns": 1, "duration_s": 3.0,
                      "targets": f"pid 7000 ({HOSTILE})", "events": 5, "events_stored": 5, "events_per_s": 1.0,
                      "drops_kernel": 0, "drops_user": 0, "status": "running"}}
    lines = render_status.lines(st)
    assert f"targets: pid 7000 ({SHOWN})" in lines
    assert all(raw_controls(line) == [] for line in lines)


def test_check_lines_escape_what_the_host_named():
    from types import SimpleNamespace

    from ingero.render.check import text

    rows = [SimpleNamespace(name="cuda libraries", ok=False, required=False, detail=f"/opt/{CLEAR}/libcudart.so",
                            fix=f"rename {TITLE}")]
    out = text(rows, ready=True)
    assert raw_controls(out) == [] and "/opt/\\x1b[2J/libcudart.so" in out and "fix: rename \\x1b]0;owned\\x07" in out


def test_the_error_line_is_escaped(monkeypatch, capsys):
    from ingero import cli as cli_module

    def fail(*a, **k):
        raise IngeroError(f"no such process {HOSTILE}", "pass a pid")

    monkeypatch.setattr(cli_module.cli, "main", fail)
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert err == f"ingero: no such process {SHOWN} — pass a pid\n"


# -- fleet -----------------------------------------------------------------------------------


def test_fleet_explain_and_query_show_a_nodes_hostile_chain_escaped(tmp_path: Path):
    from ingero.fleet.synthetic import NodeSpec, generate

    hog = [{"rule_id": "cpu-contention", "severity": "HIGH", "share": 0.45,
            "title": f"CPU scheduling contention {TITLE}", "root": [f"CPU taken by {HOSTILE} (PID 999)"],
            "fix": [f"renice -n 19 -p 999 {CLEAR}"], "culprits": [{"pid": 999, "name": HOSTILE, "detail": "x"}]}]
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("node-a", 20.0), NodeSpec("node-b", 41.0, cpu_wait_share=0.4, chains=hog),
                         NodeSpec("node-c", 20.4), NodeSpec("node-d", 19.8)], seconds=120)
    # publishing writes safe node names; a node that writes the root itself can name its directories freely
    renamed = 0
    for d in sorted(root.rglob("node=node-b"), key=lambda p: -len(p.parts)):
        d.rename(d.with_name(f"node=node-b{CLEAR}"))
        renamed += 1
    assert renamed > 0
    res = CliRunner().invoke(cli, ["fleet", "explain", str(root)])
    assert res.exit_code == 0, res.output
    assert raw_controls(res.output) == []
    assert "node-b\\x1b[2J" in res.output and f"CPU taken by {SHOWN} (PID 999)" in res.output
    res = CliRunner().invoke(cli, ["fleet", "query", str(root), "SELECT DISTINCT node, root FROM chains"])
    assert res.exit_code == 0, res.output
    assert raw_controls(res.output) == [] and "node-b\\x1b[2J" in res.output and "(1 row)" in res.output


def test_the_html_report_escapes_names_its_own_way(tmp_path: Path):
    path = tmp_path / "ingero.duckdb"
    tr = hostile_trace()
    tr.names[0]["name"] = "<b>python3</b> (train.py)"  # the charted process
    tr.store(path).close()
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", "--db", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "<b>python3</b>" not in page and "&lt;b&gt;python3&lt;/b&gt; (train.py)" in page
    # the verdict cards name the hostile culprit as the terminal shows it; nothing on the page
    # (cards, charts' data) holds a character a browser would act on (U+202E reorders the text)
    cards = page[page.index("class='culprit'"):]
    assert SHOWN in cards[:cards.index("</p>")]
    assert "\u202e" not in page and "\x1b" not in page and "\x9b" not in page
