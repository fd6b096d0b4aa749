"""`ingero mcp` driven by the MCP SDK's own client over stdio, on a demo session (the synthetic
cpu-contention replay): the tools, explain against `ingero explain --json`, the evidence SQL,
refused SQL, and a database file left untouched."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parents[2]
TOOLS = {"explain", "query", "status", "check", "stacks", "list_sessions"}


def _text(result) -> str:
    return result.content[0].text


async def _session(db: Path, calls: list[tuple[str, dict]]) -> dict:
    params = StdioServerParameters(command=sys.executable, args=["-m", "ingero", "mcp", "--db", str(db)],
                                   env={"PYTHONPATH": str(REPO)}, cwd=str(REPO))
    out: dict = {}
    async with Client(params) as client:
        out["tools"] = {t.name: t for t in (await client.list_tools()).tools}
        out["prompts"] = [p.name for p in (await client.list_prompts()).prompts]
        out["prompt"] = (await client.get_prompt("investigate", {"since": "2m"})).messages[0].content.text
        for i, (name, args) in enumerate(calls):
            out[i] = await client.call_tool(name, args)
        # the evidence of explain's first chain, rerun through query (as a user would with `ingero query`)
        ev = json.loads(_text(out[0]))["evidence"]
        out["rerun"] = await client.call_tool("query", {"sql": ev["chains"][0]["sql"]})
    return out


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from ingero.demo import runner

    db = tmp_path_factory.mktemp("mcp") / "demo.duckdb"
    runner.run("cpu-contention", duration_s=20, keep_db=db, synthetic_only=True, fix=False)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    calls = [
        ("explain", {"since": "15s"}),
        ("query", {"sql": "COPY events TO '/tmp/ingero-mcp-copy.csv'"}),
        ("query", {"sql": "ATTACH '/tmp/ingero-mcp-other.duckdb' AS other"}),
        ("query", {"sql": "SELECT * FROM read_csv('/etc/passwd')"}),
        ("query", {"sql": "SELECT op, count(*) AS n FROM events GROUP BY op ORDER BY n DESC", "max_rows": 2}),
        ("list_sessions", {}),
        ("status", {}),
        ("stacks", {"op": "cudaStreamSync"}),
        ("stacks", {"op": "rm -rf"}),
        ("query", {"sql": "DELETE FROM events"}),
    ]
    out = asyncio.run(_session(db, calls))
    cli = subprocess.run([sys.executable, "-m", "ingero", "explain", "--json", "--since", "15s", "--db", str(db)],
                         capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert cli.returncode == 0, cli.stderr
    return {"db": db, "digest": digest, "out": out, "cli": json.loads(cli.stdout)}


def test_lists_the_tools_and_the_prompt(demo):
    out = demo["out"]
    assert set(out["tools"]) == TOOLS
    assert all(t.annotations.read_only_hint for t in out["tools"].values())
    assert out["prompts"] == ["investigate"]
    assert "`check`" in out["prompt"] and "`explain` (since=\"2m\")" in out["prompt"]


def test_explain_has_the_chains_of_explain_json(demo):
    got = json.loads(_text(demo["out"][0]))
    assert not demo["out"][0].is_error
    assert got["chains"] == demo["cli"]["chains"]
    assert [c["rule_id"] for c in got["chains"]][0] == "cpu-contention"
    ev = got["evidence"]
    assert [c["rule_id"] for c in ev["chains"]] == [c["rule_id"] for c in got["chains"]]
    assert ev["chains"][0]["windows"] == got["chains"][0]["evidence_windows"]


def test_evidence_sql_reruns(demo):
    rerun = demo["out"]["rerun"]
    assert not rerun.is_error, _text(rerun)
    body = json.loads(_text(rerun))
    assert body["columns"][:3] == ["pid", "op", "n"] and body["rows"]


@pytest.mark.parametrize("i, words", [
    (1, "COPY is refused"),
    (2, "ATTACH is refused"),
    (3, 'refused: Permission Error: Cannot access file "/etc/passwd"'),
    (9, "DELETE is refused: queries are read-only"),
])
def test_refused_sql_is_one_clear_error(demo, i, words):
    result = demo["out"][i]
    assert result.is_error
    text = _text(result)
    assert words in text and len(text.splitlines()) == 1


def test_query_has_a_row_limit_and_evidence(demo):
    body = json.loads(_text(demo["out"][4]))
    assert len(body["rows"]) == 2 and body["truncated"] is True
    assert body["evidence"]["sql"].startswith("SELECT op, count(*)")


def test_sessions_status_and_stacks(demo):
    sessions = json.loads(_text(demo["out"][5]))["sessions"]
    assert [s["session_id"] for s in sessions] == [1]
    status = json.loads(_text(demo["out"][6]))
    assert status["running"] is False and status["source"] == "database"
    assert status["session"]["session_id"] == 1
    stacks = json.loads(_text(demo["out"][7]))  # the replay records no stacks: said so, with the fix
    assert stacks["top_callers"] == [] and "--stack" in stacks["note"]
    assert "e.op = 'cudaStreamSync'" in stacks["evidence"]["sql"]
    bad = demo["out"][8]
    assert bad.is_error and "unknown CUDA op 'rm -rf'" in _text(bad)


def test_nothing_was_written(demo):
    assert hashlib.sha256(demo["db"].read_bytes()).hexdigest() == demo["digest"]
    assert not Path("/tmp/ingero-mcp-copy.csv").exists() and not Path("/tmp/ingero-mcp-other.duckdb").exists()
