"""The /metrics server's bounds, with real sockets: threads, held half-sent requests, timeouts, a
full queue.  Every wait is for an event the server counts (``stats``), never for time to pass."""

from __future__ import annotations

import select
import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client.registry import Collector

from ingero.metrics import http
from ingero.metrics.server import MetricsServer

HALF = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # no blank line: the head never ends
WHOLE = b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
WAIT_S = 60  # for what the server is about to do; on a loaded box it may take a while


def wait_until(cond, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < end, f"still waiting for {what}"
        time.sleep(0.02)


def connect(port: int, data: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    s.sendall(data)
    return s


def closed_by_server(s: socket.socket) -> bool:
    """True when the server closed ``s`` (EOF, or a reset: it closed with our bytes unread)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def scrape(srv: MetricsServer) -> str:
    with urllib.request.urlopen(srv.url, timeout=WAIT_S) as r:
        assert r.status == 200
        return r.read().decode()


@pytest.fixture
def held():
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def started_since(before: set[threading.Thread]) -> list[str]:
    return sorted(t.name for t in set(threading.enumerate()) - before)


SERVER_THREADS = sorted(["ingero-metrics-io", *(f"ingero-metrics-worker-{i}" for i in range(http.WORKERS))])


def test_300_half_sent_requests_leave_the_threads_fixed_and_the_scrape_working(held):
    n = 300
    before = set(threading.enumerate())
    srv = MetricsServer.bind("127.0.0.1", 0, read_timeout_s=3600)  # none times out here
    try:
        assert started_since(before) == SERVER_THREADS  # the I/O thread and the workers, no more
        held.extend(connect(srv.port, HALF) for _ in range(n))
        stats = srv._httpd.stats
        wait_until(lambda: stats.accepted == n, "the server to accept every connection")
        assert started_since(before) == SERVER_THREADS
        # the oldest ones were closed as newer ones came: MAX_PENDING are held, all the newest
        assert stats.evicted == n - http.MAX_PENDING
        assert all(closed_by_server(s) for s in held[: n - http.MAX_PENDING])
        readable, _, _ = select.select(held[n - http.MAX_PENDING:], [], [], 0)
        assert readable == []
        # a scrape meanwhile: served (it evicts the oldest held one), and it counts what was closed
        body = scrape(srv)
        assert 'ingero_build_info{version="' in body
        assert f'ingero_metrics_connections_closed_total{{reason="evicted"}} {n - http.MAX_PENDING + 1}.0' in body
        assert started_since(before) == SERVER_THREADS
    finally:
        srv.close()
    assert started_since(before) == []


def test_a_half_sent_request_is_closed_after_the_read_timeout(held):
    srv = MetricsServer.bind("127.0.0.1", 0, read_timeout_s=0.2)
    try:
        held.append(connect(srv.port, HALF))
        assert closed_by_server(held[0])  # blocks until the server closes it (WAIT_S at most)
        assert srv._httpd.stats.timed_out == 1
        assert "ingero_build_info" in scrape(srv)
    finally:
        srv.close()


def test_an_endless_head_is_closed_at_its_size_limit(held):
    srv = MetricsServer.bind("127.0.0.1", 0, read_timeout_s=3600)
    try:
        held.append(connect(srv.port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * http.MAX_HEAD_BYTES))
        assert closed_by_server(held[0])
        assert srv._httpd.stats.too_large == 1
    finally:
        srv.close()


class Gate(Collector):
    """A collector that holds every scrape until released: workers busy on demand."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def collect(self):
        self.entered.release()
        self.release.wait(WAIT_S)
        return []


def test_with_every_worker_busy_and_the_queue_full_the_next_request_gets_503(held):
    srv = MetricsServer.bind("127.0.0.1", 0, read_timeout_s=3600, max_queued=1)
    gate = Gate()
    srv.registry.register(gate)
    try:
        held.extend(connect(srv.port, WHOLE) for _ in range(http.WORKERS))
        for _ in range(http.WORKERS):
            assert gate.entered.acquire(timeout=WAIT_S)  # every worker inside a scrape
        held.append(connect(srv.port, WHOLE))  # waits for a worker
        wait_until(lambda: srv._httpd.stats.answered == http.WORKERS + 1, "a request to wait for a worker")
        extra = connect(srv.port, WHOLE)
        held.append(extra)
        assert read_all(extra).startswith(b"HTTP/1.0 503 ")
        assert srv._httpd.stats.busy == 1
        gate.release.set()
        for s in held[:-1]:
            assert read_all(s).startswith(b"HTTP/1.0 200 OK")
    finally:
        gate.release.set()
        srv.close()
