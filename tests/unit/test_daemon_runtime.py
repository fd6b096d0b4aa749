"""Daemon: the session's three calls (start, tick, stop) serve queries and apply retention on schedule."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from ingero.daemon import client
from ingero.daemon.runtime import Daemon
from ingero.demo.synthetic import event_batch
from ingero.errors import IngeroError
from ingero.store.db import Store

S = 10**9
T0 = 1_700_000_000 * S


def test_start_tick_stop(monkeypatch):
    d = Path(tempfile.mkdtemp(prefix="ingr-", dir="/tmp"))
    store = Store.open(d / "r.duckdb")
    sid = store.begin_session(command="t", targets="t")
    store.append("events", event_batch(sid, T0, T0 + 100 * S, 1000, np.random.default_rng(1)))
    daemon = Daemon(store, retain_s=50, socket_path=d / "r.sock", retention_interval_s=0).start()
    try:
        assert client.query("SELECT count(*) FROM events", socket_path=d / "r.sock")[1] == [[1000]]
        info = daemon.tick(T0 + 100 * S)
        assert info is not None and info["deleted"]["events"] == 500  # evenly spread: half is older than 50 s
        assert client.query("SELECT count(*) FROM events", socket_path=d / "r.sock")[1] == [[500]]
    finally:
        daemon.stop()
    assert not (d / "r.sock").exists()
    store.close()


def test_tick_waits_for_its_interval_and_no_bounds_is_a_no_op():
    store = Store.memory()
    daemon = Daemon(store, retain_s=10, serve=False, retention_interval_s=3600).start()
    assert daemon.tick(T0) is None
    assert Daemon(store, serve=False).tick(T0) is None


def test_bad_bounds_are_one_line_errors():
    with pytest.raises(IngeroError, match="bad --retain/--max-db: max_db_bytes must be at least 64 MB"):
        Daemon(Store.memory(), max_db_bytes=10**6, serve=False)


def test_socket_names_are_per_database(tmp_path, monkeypatch) -> None:
    """Two tracers writing two files serve on two sockets; the default DB keeps ingero.sock."""
    from ingero.daemon.server import SOCKET_NAME, default_socket_path, socket_name

    monkeypatch.delenv("INGERO_SOCKET", raising=False)
    monkeypatch.setenv("INGERO_DB", str(tmp_path / "default.duckdb"))
    a, b = socket_name(tmp_path / "a.duckdb"), socket_name(tmp_path / "b.duckdb")
    assert a != b and a.startswith("ingero-") and a.endswith(".sock")
    assert socket_name(tmp_path / "default.duckdb") == SOCKET_NAME
    assert socket_name(tmp_path / "a.duckdb") == a  # stable
    monkeypatch.setenv("INGERO_SOCKET", str(tmp_path / "x.sock"))
    assert default_socket_path(tmp_path / "a.duckdb") == tmp_path / "x.sock"
