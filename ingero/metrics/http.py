"""The /metrics HTTP server: a fixed number of threads whatever the clients do.

prometheus_client's own server (``start_http_server``) starts a thread per
connection, and a thread waits as long as its client takes to send a request:
a few hundred connections that send half a request each and hold it are a few
hundred threads in the tracer, for as long as the client likes.  Here:

- one I/O thread accepts and reads every request's head without blocking
  (``selectors``), at most ``max_pending`` connections at a time.  A connection
  that has not sent a whole head within ``read_timeout_s`` of its accept, or
  sends more than MAX_HEAD_BYTES of it, is closed; a new connection arriving
  while ``max_pending`` are still reading closes the one that has waited
  longest.  A scraper sends its request at once, in one packet, so held
  connections are the ones closed, never a scrape behind them.
- ``workers`` threads answer the complete requests with prometheus_client's
  WSGI app (its content negotiation, gzip and ``name[]`` filter) through the
  standard library's WSGI request handler, reading the head from memory and
  writing with a ``write_timeout_s`` bound.  At most ``workers + max_queued``
  complete requests are theirs at a time (answered or waiting); one more is
  answered 503 at once and closed.

Threads: 1 + ``workers``, started once.  The counters (``stats``) are what the
collector serves as ``ingero_metrics_connections_closed_total``.
"""

from __future__ import annotations

import io
import queue
import selectors
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

# A request head to /metrics is ~200-300 bytes (Prometheus: GET, Host, User-Agent, Accept,
# Accept-Encoding, X-Prometheus-Scrape-Timeout-Seconds); 8 KiB is http.server's line limit's
# order and more than any scraper sends.
MAX_HEAD_BYTES = 8192
# Connections reading their head at once.  Prometheus opens one per scrape (HA pairs: two);
# 32 leaves room for a browser, curl and a few more scrapers while bounding what held
# connections cost (a socket and at most MAX_HEAD_BYTES each).
MAX_PENDING = 32
# From accept to the end of the head.  A scraper's head comes in the first packet;
# Prometheus' own scrape timeout is 10 s by default, so a slower sender has failed anyway.
READ_TIMEOUT_S = 5.0
# One answer's whole write (socket sendall bound).  A scrape's body is ~1 MB at 50 processes,
# written in milliseconds to a reader that reads; a client that stops reading holds a worker
# this long at most.
WRITE_TIMEOUT_S = 10.0
# Threads answering: a scrape is prometheus_client building the text (tens of ms of CPU); two
# let one scrape go on while another (an HA pair's, a human's curl) is served.
WORKERS = 2
MAX_QUEUED = 4
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@dataclass
class Stats:
    accepted: int = 0
    answered: int = 0  # handed to a worker
    evicted: int = 0  # closed while reading: a newer connection needed the slot
    timed_out: int = 0  # closed: no whole head within the read timeout
    too_large: int = 0  # closed: a head over MAX_HEAD_BYTES
    busy: int = 0  # answered 503: every worker busy and the queue full

    def closed(self) -> dict[str, int]:
        return {"evicted": self.evicted, "timeout": self.timed_out, "too_large": self.too_large,
                "busy": self.busy}


class _Handler(WSGIRequestHandler):
    """The standard WSGI request handler over a head already read (``request`` is (socket, head))."""

    def setup(self) -> None:
        sock, head = self.request
        self.connection = sock
        sock.settimeout(self.server.write_timeout_s)
        self.rfile = io.BytesIO(head)
        self.wfile = sock.makefile("wb")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        """Nothing: a scrape every 15 s would fill the tracer's stderr."""


def _head_complete(buf: bytearray) -> bool:
    return b"\r\n\r\n" in buf or b"\n\n" in buf


class BoundedServer(WSGIServer):
    """Bound at construction (OSError as socket.bind raises it); ``start()`` starts the threads."""

    # The kernel's queue of connections not yet accepted (socketserver's default is 5): the I/O
    # thread accepts them all as they come, this only absorbs a burst between two of its turns.
    request_queue_size = 128

    def __init__(self, addr: str, port: int, app: Callable, *, max_pending: int = MAX_PENDING,
                 read_timeout_s: float = READ_TIMEOUT_S, write_timeout_s: float = WRITE_TIMEOUT_S,
                 workers: int = WORKERS, max_queued: int = MAX_QUEUED) -> None:
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        super().__init__(sockaddr[:2], _Handler)
        self.set_app(app)
        self.max_pending = max_pending
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self.stats = Stats()
        self.socket.setblocking(False)
        # requests the workers hold (being answered or waiting): taken by the I/O thread, given
        # back by the worker that answered
        self._slots = threading.Semaphore(workers + max_queued)
        self._queue: queue.Queue = queue.Queue()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        # reading connections in accept order (the first is the one that waited longest):
        # socket -> (deadline, head so far, client address)
        self._pending: OrderedDict[socket.socket, tuple[float, bytearray, Any]] = OrderedDict()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._io_loop, name="ingero-metrics-io", daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"ingero-metrics-worker-{i}", daemon=True)
                          for i in range(workers)]

    def start(self) -> "BoundedServer":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        for _ in self._threads[1:]:
            self._queue.put(None)
        for t in self._threads:
            if t.is_alive():
                t.join(self.write_timeout_s + 5)
        for sock in list(self._pending):
            sock.close()
        self._pending.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].close()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
        self.server_close()

    # -- the I/O thread ------------------------------------------------------------

    def _io_loop(self) -> None:
        self._sel.register(self.socket, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        while not self._stop.is_set():
            timeout = None
            if self._pending:
                first_deadline = next(iter(self._pending.values()))[0]  # accept order: the earliest
                timeout = max(0.0, first_deadline - time.monotonic())
            for key, _ in self._sel.select(timeout):
                if key.data == "accept":
                    self._accept()
                elif key.data == "read":
                    self._read(key.fileobj)
            self._expire(time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                sock, client = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors and the like: the backlog keeps the rest
                return
            self.stats.accepted += 1
            if len(self._pending) >= self.max_pending:
                oldest = next(iter(self._pending))
                self._drop(oldest)
                self.stats.evicted += 1
            sock.setblocking(False)
            self._pending[sock] = (time.monotonic() + self.read_timeout_s, bytearray(), client)
            self._sel.register(sock, selectors.EVENT_READ, "read")

    def _read(self, sock: Any) -> None:
        entry = self._pending.get(sock)
        if entry is None:
            return
        _, buf, client = entry
        try:
            data = sock.recv(MAX_HEAD_BYTES + 1 - len(buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client closed (or reset) before a whole head
            self._drop(sock)
            return
        buf += data
        if _head_complete(buf):
            self._sel.unregister(sock)
            del self._pending[sock]
            if self._slots.acquire(blocking=False):
                self._queue.put((sock, bytes(buf), client))
                self.stats.answered += 1
            else:
                self.stats.busy += 1
                try:
                    sock.send(_BUSY)  # non-blocking, best effort: it fits any empty send buffer
                except OSError:
                    pass
                sock.close()
        elif len(buf) > MAX_HEAD_BYTES:
            self.stats.too_large += 1
            self._drop(sock)

    def _expire(self, now: float) -> None:
        while self._pending:
            sock, (deadline, _, _) = next(iter(self._pending.items()))
            if deadline > now:
                return
            self.stats.timed_out += 1
            self._drop(sock)

    def _drop(self, sock: Any) -> None:
        self._sel.unregister(sock)
        del self._pending[sock]
        sock.close()

    # -- the workers -----------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            item = self._queue.get()
            if item is None:
                return
            sock, head, client = item
            try:
                self.finish_request((sock, head), client)  # _Handler: parse, run the app, write
            except OSError:  # the client went away mid-answer, or stopped reading (write timeout)
                pass
            finally:
                try:
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                sock.close()
                self._slots.release()
