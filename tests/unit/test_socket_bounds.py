"""The query socket bounds what it spends and answers every request exactly once (issue 25, 1-6)."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ingero.daemon import client, server
from ingero.store import query as caps
from ingero.daemon.server import QueryServer
from ingero.demo.synthetic import event_batch
from ingero.errors import IngeroError
from ingero.store.db import Store

T0 = 1_700_000_000_000_000_000
RUNAWAY = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT max(n) FROM r"


@pytest.fixture()
def served(monkeypatch):
    d = Path(tempfile.mkdtemp(prefix="ingb-", dir="/tmp"))
    monkeypatch.setenv("INGERO_SOCKET", str(d / "ingero.sock"))
    store = Store.open(d / "t.duckdb")
    sid = store.begin_session(command="test", targets="pid 1234")
    store.append("events", event_batch(sid, T0, T0 + 10**9, 2000, np.random.default_rng(1)))
    srv = QueryServer(store.con.cursor, d / "ingero.sock", group=None).start()
    yield store, srv, d / "ingero.sock"
    srv.stop()
    store.close()
    for p in sorted(d.rglob("*"), reverse=True):
        p.unlink()
    d.rmdir()


def test_nan_timeout_is_refused_not_unlimited(served, raw_request):
    # finding 1: "timeout_s": NaN lifted the time limit off a query that never ends
    _, _, sock = served
    reply = raw_request(sock, b'{"sql": "%s", "timeout_s": NaN}' % RUNAWAY.encode())
    assert reply["ok"] is False and set(reply["fields"]) == {"timeout_s"}
    assert "not a finite number" in reply["fields"]["timeout_s"]


def test_nan_max_rows_and_deep_nesting_get_one_reply_each(served, raw_request):
    # finding 3: both got no reply at all (a thread traceback on the tracer's stderr)
    _, _, sock = served
    reply = raw_request(sock, b'{"sql": "SELECT 1", "max_rows": NaN}')
    assert reply["ok"] is False and set(reply["fields"]) == {"max_rows"}
    deep = b"[" * 100_000 + b"]" * 100_000
    reply = raw_request(sock, deep)
    assert reply["ok"] is False and "nested deeper" in reply["error"]
    for junk in (b"\xff\xfe", b"[]", b'{"sql": 5}', b'{"op": "explain", "args": {"window_s": 1e-9}}', b"{" * 5):
        assert raw_request(sock, junk)["ok"] is False


def test_a_huge_value_is_refused_inside_duckdb(served, monkeypatch):
    # finding 2: SELECT repeat('x', 1e9) was refused only after encoding (4.2 GiB RSS)
    _, _, sock = served
    with pytest.raises(IngeroError, match="a row of the result is larger than 1 MiB"):
        half = caps.MAX_ROW_BYTES // 2 + 10  # two values each under the cap, a row over it
        client.query(f"SELECT repeat('x', {half}) AS a, repeat('y', {half}) AS b", socket_path=sock)


def test_reply_size_is_counted_while_fetching(served, monkeypatch):
    _, _, sock = served
    with pytest.raises(IngeroError, match="^result too large: more than 50,000 bytes after 49 rows — "):
        client.query_reply("SELECT repeat('y', 1000) FROM range(1000)", socket_path=sock, max_bytes=50_000)
    cols, rows = client.query("SELECT 1 AS a, 2 AS a", socket_path=sock)
    assert cols == ["a", "a"] and rows == [[1, 2]]


def test_checkpoint_table_function_is_refused(served):
    # finding 6: SELECT * FROM checkpoint() passed the read-only guard
    _, _, sock = served
    with pytest.raises(IngeroError, match=r"checkpoint\(\) is not a read-only function"):
        client.query("SELECT * FROM checkpoint()", socket_path=sock)


def test_two_hundred_clients_at_once_all_get_an_answer(served):
    # finding 4: 160 of 200 got EAGAIN on connect (backlog 16)
    _, _, sock = served
    results: list[object] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            out = client.query("SELECT count(*) FROM events", socket_path=sock)[1][0][0]
        except IngeroError as exc:
            out = exc
        with lock:
            results.append(out)

    threads = [threading.Thread(target=one) for _ in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [2000] * 200


def test_past_the_pending_limit_the_reply_is_busy_and_the_client_retries(served, monkeypatch, raw_request):
    _, srv, sock = served
    monkeypatch.setattr(server, "MAX_PENDING", 1)
    srv._pending = threading.BoundedSemaphore(1)
    assert srv._pending.acquire()  # the one pending place is taken
    assert raw_request(sock, b'{"op": "status"}')["busy"] is True
    with pytest.raises(IngeroError, match="busy.*still busy after 0 s"):
        client.request({"op": "status"}, socket_path=sock, retry_s=0)
    threading.Timer(0.5, srv._pending.release).start()
    assert client.status(socket_path=sock)["source"] == "daemon"  # answered after a retry or more


def test_stop_interrupts_queries_with_tracer_stopping_and_then_checkpoint_works(served):
    # finding 5: SIGTERM mid-query -> "Cannot CHECKPOINT: there are other write transactions active"
    store, srv, sock = served
    outcome: list[object] = []

    def runaway() -> None:
        try:
            client.query(RUNAWAY, socket_path=sock, timeout_s=120)
        except IngeroError as exc:
            outcome.append(exc)

    t = threading.Thread(target=runaway)
    t.start()
    deadline = time.monotonic() + 30
    while srv._in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv._in_flight == 1
    srv.stop()
    t.join(30)
    assert [str(e).split(" — ")[0] for e in outcome] == ["interrupted: tracer stopping"]
    store.con.execute("CHECKPOINT")  # no read transaction left behind
