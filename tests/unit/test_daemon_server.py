"""The tracer's query server, in-process: answers, limits, refusals, permissions, lock errors."""

from __future__ import annotations

import grp
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest

from ingero.daemon import client
from ingero.daemon.server import QueryServer, lock_down
from ingero.demo.synthetic import event_batch
from ingero.errors import IngeroError
from ingero.store.db import DatabaseLocked, Store, open_for_user_sql

T0 = 1_700_000_000_000_000_000


@pytest.fixture()
def served(short_dir, monkeypatch):
    monkeypatch.setenv("INGERO_SOCKET", str(short_dir / "ingero.sock"))
    store = Store.open(short_dir / "t.duckdb")
    sid = store.begin_session(command="test", targets="pid 1234")
    store.append("events", event_batch(sid, T0, T0 + 10**9, 5000, np.random.default_rng(1)))
    server = QueryServer(store.con.cursor, short_dir / "ingero.sock", group=None).start()
    yield store, server, short_dir / "ingero.sock"
    server.stop()
    store.close()


def test_query_returns_exact_rows(served):
    store, server, sock = served
    cols, rows = client.query("SELECT count(*) AS n, min(timestamp) AS t FROM events", socket_path=sock)
    assert cols == ["n", "t"]
    assert rows == [[5000, T0]]


def test_default_socket_is_found_and_matches_the_db(served):
    store, server, sock = served
    assert client.find_socket() == sock
    assert client.find_socket(store.path) == sock
    assert client.find_socket(store.path.with_name("other.duckdb")) is None


def test_row_limit_truncates_and_says_so(served):
    _, _, sock = served
    reply = client.query_reply("SELECT * FROM range(100)", socket_path=sock, max_rows=7)
    assert len(reply["rows"]) == 7 and reply["truncated"] is True
    reply = client.query_reply("SELECT * FROM range(7)", socket_path=sock, max_rows=7)
    assert len(reply["rows"]) == 7 and reply["truncated"] is False


def test_time_limit_interrupts_and_server_keeps_serving(served):
    _, _, sock = served
    t0 = time.monotonic()
    with pytest.raises(IngeroError, match="interrupted"):
        client.query("SELECT count(*) FROM range(1000000000000) a", socket_path=sock, timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    assert client.query("SELECT 42", socket_path=sock)[1] == [[42]]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("COPY events TO '/tmp/ingero-escape.csv'", "COPY is refused"),
        ("SELECT * FROM read_csv('/etc/shadow')", "file system operations are disabled"),
        ("SELECT * FROM read_text('/etc/shadow')", "file system operations are disabled"),
        ("SELECT * FROM read_blob('/etc/passwd')", "file system operations are disabled"),
        ("SELECT * FROM glob('/etc/*')", "file system operations are disabled"),
        ("ATTACH '/tmp/ingero-escape.duckdb'", "ATTACH is refused"),
        ("INSTALL httpfs", "INSTALL/LOAD is refused"),
        ("LOAD httpfs", "INSTALL/LOAD is refused"),
        ("SET enable_external_access = true", "SET is refused"),
        ("CREATE TABLE pwn (a INT)", "CREATE is refused"),
        ("INSERT INTO meta VALUES ('pwn', '1')", "INSERT is refused"),
        ("DELETE FROM events", "DELETE is refused"),
        ("DROP TABLE events", "DROP is refused"),
        ("SELECT 1; DROP TABLE events", "2 statements"),
        ("SELECT * FROM query('DELETE FROM events')", "query() is not a read-only function"),
            ("SELECT * FROM checkpoint()", "checkpoint() is not a read-only function"),
    ],
)
def test_escapes_refused_through_the_socket(served, sql, message):
    store, _, sock = served
    with pytest.raises(IngeroError) as err:
        client.query(sql, socket_path=sock)
    assert message in str(err.value)
    assert not Path("/tmp/ingero-escape.csv").exists()
    assert not Path("/tmp/ingero-escape.duckdb").exists()
    assert client.query("SELECT count(*) FROM events", socket_path=sock)[1] == [[5000]]


def test_read_only_transaction_backs_the_guard(served):
    # Even a statement the guard would let through cannot write: each runs in a READ ONLY transaction.
    _, server, _ = served
    reply = server._in_read_txn(lambda cur: _try_write(cur), 5)
    assert "read-only" in reply


def _try_write(cur: duckdb.DuckDBPyConnection) -> str:
    try:
        cur.execute("INSERT INTO meta VALUES ('pwn', '1')")
    except duckdb.Error as exc:
        return str(exc)
    return "wrote"


def test_lock_down_keeps_the_writer_working(served):
    store, _, _ = served
    # the writer's own Arrow appends, deletes and checkpoints still work on the locked instance
    assert store.append("events", event_batch(1, T0, T0 + 10, 10, np.random.default_rng(2))) == 10
    store.con.execute("DELETE FROM events WHERE timestamp < $t", {"t": T0 + 1})
    store.con.execute("CHECKPOINT")
    with pytest.raises(duckdb.Error, match="locked"):
        store.con.execute("SET enable_external_access = true")
    with pytest.raises(duckdb.PermissionException):
        store.con.execute("SELECT * FROM read_text('/etc/hostname')").fetchall()
    lock_down(store.con)  # idempotent


def test_status_op_describes_this_tracer(served):
    store, _, sock = served
    st = client.status(socket_path=sock)
    assert st["running"] is True
    assert st["db_path"] == str(store.path)
    assert st["session"]["targets"] == "pid 1234"
    assert st["session"]["events_stored"] == 5000
    assert st["session"]["tracer_pid"] == os.getpid()


def test_explain_rejects_unknown_arguments(served):
    _, _, sock = served
    with pytest.raises(IngeroError, match=r"args\.path: unknown"):
        client.explain(socket_path=sock, path="/etc/shadow")
    with pytest.raises(IngeroError, match=r"args\.session: '1; DROP TABLE events' is not a whole number"):
        client.explain(socket_path=sock, session="1; DROP TABLE events")


def test_explain_runs_in_the_tracer_and_returns_text_and_json(served):
    store, _, sock = served
    result = client.explain(socket_path=sock, session=1, pids=[1000, 1001])
    assert set(result) == {"json", "text"}
    assert "chains" in result["json"] and isinstance(result["json"]["chains"], list)
    assert result["text"].strip()
    # its temp tables stayed in the request's cursor: the writer's catalog is unchanged
    names = {r[0] for r in store.con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    assert not any(n.startswith("ing_") for n in names)


def test_unknown_op_and_bad_frames(served):
    _, server, sock = served
    with pytest.raises(IngeroError, match="op: unknown op 'shell'"):
        client.request({"op": "shell"}, socket_path=sock)
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sock))
    s.sendall(b"\x00\x00\x00\x05hello")
    from ingero.daemon import protocol
    reply = protocol.recv(s, 1 << 20)
    s.close()
    assert reply["ok"] is False and "bad request" in reply["error"]


def test_socket_mode_without_group_is_owner_only(served):
    _, _, sock = served
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to a group needs root")
def test_socket_mode_with_group_is_0660_and_group_owned(short_dir):
    group = grp.getgrgid(os.getgid()).gr_name if os.getgid() != 0 else "daemon"
    store = Store.open(short_dir / "g.duckdb")
    path = short_dir / "g.sock"
    with QueryServer(store.con.cursor, path, group=group):
        st = path.stat()
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_gid == grp.getgrnam(group).gr_gid and st.st_uid == 0
    assert not path.exists()
    store.close()


def test_second_server_on_a_live_socket_is_refused_and_stale_one_replaced(served):
    store, _, sock = served
    with pytest.raises(IngeroError, match="another ingero tracer is serving"):
        QueryServer(store.con.cursor, sock, group=None, lock=False).start()
    # a socket file left by a dead tracer is replaced
    stale = sock.with_name("stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    with QueryServer(store.con.cursor, stale, group=None, lock=False):
        assert client.query("SELECT 1", socket_path=stale)[1] == [[1]]


def test_no_tracer_gives_a_clear_error(short_dir):
    with pytest.raises(IngeroError, match="no ingero tracer is running"):
        client.query("SELECT 1", socket_path=short_dir / "none.sock")


def test_queries_during_concurrent_writes(served):
    """Readers on cursors while the writer appends on its own thread: no errors, counts only grow."""
    store, _, sock = served
    stop = threading.Event()
    written = [5000]

    def writer():
        rng = np.random.default_rng(3)
        while not stop.is_set():
            store.append("events", event_batch(1, T0, T0 + 10**9, 2000, rng))
            written[0] += 2000

    errors: list[BaseException] = []
    seen: list[list[int]] = [[] for _ in range(3)]

    def reader(i):
        try:
            for _ in range(15):
                seen[i].append(client.query("SELECT count(*) FROM events", socket_path=sock)[1][0][0])
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    w = threading.Thread(target=writer)
    w.start()
    readers = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    stop.set()
    w.join()
    assert errors == []
    for counts in seen:
        assert counts == sorted(counts) and all(c % 1000 == 0 for c in counts)
    assert max(max(c) for c in seen) > 5000
    assert client.query("SELECT count(*) FROM events", socket_path=sock)[1] == [[written[0]]]


def test_a_held_file_raises_database_locked(short_dir):
    db = short_dir / "locked.duckdb"
    Store.open(db).close()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"import duckdb,sys,time; c=duckdb.connect({str(db)!r}); print('held', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DatabaseLocked):
            Store.open(db, read_only=True)
        with pytest.raises(DatabaseLocked):
            open_for_user_sql(db)
    finally:
        holder.kill()
        holder.wait()


def test_stop_interrupts_running_queries_promptly(served):
    _, server, sock = served
    outcome: list[BaseException] = []

    def long_query():
        try:
            client.query("SELECT count(*) FROM range(1000000000000) a", socket_path=sock, timeout_s=60)
        except IngeroError as exc:
            outcome.append(exc)

    t = threading.Thread(target=long_query)
    t.start()
    # the query holds a read transaction on the server (not: half a second has passed)
    deadline = time.monotonic() + 30
    while not server._active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server._active, "the query never reached the server"
    t0 = time.monotonic()
    server.stop()
    t.join(10)
    assert time.monotonic() - t0 < 5
    assert len(outcome) == 1 and "interrupted" in str(outcome[0])
    assert not sock.exists()
    server.stop()  # idempotent


_AS_USER_QUERY = """
import os, sys
os.setgid({gid}); os.setuid({uid})
from ingero.daemon import client
from ingero.errors import IngeroError
try:
    print(client.query("SELECT 40 + 2", socket_path=sys.argv[1])[1][0][0])
except IngeroError as exc:
    print("ERR", exc)
"""


def _query_as(uid: int, gid: int, sock: Path) -> str:
    code = _AS_USER_QUERY.format(uid=uid, gid=gid)
    out = subprocess.run([sys.executable, "-c", code, str(sock)], capture_output=True, text=True, timeout=60)
    return (out.stdout + out.stderr).strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own sockets for and run as other users")
def test_under_sudo_the_invoking_user_may_query_and_others_may_not(short_dir, monkeypatch):
    import pwd as pwd_mod

    nobody = pwd_mod.getpwnam("nobody")
    other = pwd_mod.getpwnam("daemon")
    monkeypatch.setenv("SUDO_USER", "nobody")
    os.chmod(short_dir, 0o755)
    store = Store.open(short_dir / "s.duckdb")
    sock = short_dir / "s.sock"
    with QueryServer(store.con.cursor, sock, group=None):
        st = sock.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (nobody.pw_uid, 0o600)
        assert _query_as(nobody.pw_uid, nobody.pw_gid, sock) == "42"
        assert _query_as(other.pw_uid, other.pw_gid, sock).startswith("ERR permission denied on")
        # behind the file mode, the server checks the peer's credentials itself
        os.chmod(sock, 0o666)
        refused = _query_as(other.pw_uid, other.pw_gid, sock)
        assert (refused.startswith("ERR permission denied")
                and "run as root (sudo) or as the user who started the tracer (nobody)" in refused)
    store.close()
