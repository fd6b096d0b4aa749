"""`ingero trace --metrics-port`: the /metrics endpoint and the trace session's one hook into it.

``MetricsServer.bind`` runs before the trace loads or attaches anything, so a
port in use or a bad address ends the command with one line and nothing
attached.  The session then calls ``on_flush(session, recs, flush_s)`` once
per flush (the only hook, collect/session.py); the first call also starts the
diagnosis timer against the session's own query socket.
"""

from __future__ import annotations

import errno
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.process_collector import ProcessCollector

from ingero.events.records import Counter
from ingero.traceapi import TraceHook
from ingero.store.files import file_sizes
from ingero.errors import IngeroError
from ingero.metrics.aggregate import Aggregates
from ingero.metrics.bind import DEFAULT_ADDR, DEFAULT_PORT, parse_address
from ingero.metrics.collector import IngeroCollector
from ingero.metrics.diagnosis import Diagnosis
from ingero.metrics.http import BoundedServer


class MetricsServer(TraceHook):
    """The HTTP endpoint (http.BoundedServer: a fixed set of threads) over one Aggregates."""

    def __init__(self, addr: str, port: int) -> None:
        self.addr = addr
        self.port = port
        self.aggregates = Aggregates()
        self.diagnosis: Diagnosis | None = None
        self.collector = IngeroCollector(self.aggregates)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        ProcessCollector(namespace="ingero", registry=self.registry)  # the tracer's own CPU and RSS
        self._httpd: BoundedServer | None = None

    @classmethod
    def bind(cls, addr: str = DEFAULT_ADDR, port: int = DEFAULT_PORT, **limits: Any) -> "MetricsServer":
        """Listen now; IngeroError (one line) when the address or port cannot be used.

        ``limits``: BoundedServer's (max_pending, read_timeout_s, ...), for tests."""
        addr = parse_address(addr)
        port = int(port)  # parsed by the CLI (parse_port); 0 (any free port) is for tests and benchmarks
        self = cls(addr, port)
        try:
            self._httpd = BoundedServer(addr, port, make_wsgi_app(self.registry), **limits)
        except OSError as exc:
            why = exc.strerror or str(exc)
            hint = (("another process listens there (`ss -ltnp 'sport = :%d'` names it); pass another "
                     "--metrics-port" % port) if exc.errno == errno.EADDRINUSE
                    else "pass an address of this host with --metrics-addr")
            raise IngeroError(f"cannot serve metrics on {addr}:{port}: {why}", hint) from None
        self.port = self._httpd.server_address[1]  # the one the kernel gave for port 0 (tests)
        self.collector.http_closed = self._httpd.stats.closed
        self._httpd.start()
        return self

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    # -- the session's hook --------------------------------------------------------

    def on_flush(self, sess: Any, recs: Any, flush_s: float) -> None:
        """Fold a stored batch and the tracer's health in (the writer's thread, once per flush)."""
        if self.diagnosis is None and getattr(sess, "daemon", None) is not None and sess.daemon.socket_path:
            self.diagnosis = Diagnosis(sess.daemon.socket_path, sess.session_id).start()
            self.collector.diagnosis = self.diagnosis
        self.aggregates.add(recs, {p: ident[0] for p, ident in sess.identities.items()}, sampled_weights(sess))
        counters = sess.last_counters
        self.aggregates.set_health(
            events=sess.events, drops_user=sess.drops_user, flush_s=flush_s, db_bytes=sum(file_sizes(sess.store.path)),
            drops_kernel=int(counters[Counter.RB_DROPS]) if counters is not None else 0,
            stale_calls=int(counters[Counter.STALE_CALLS]) if counters is not None else 0)

    def close(self) -> None:
        if self.diagnosis is not None:
            self.diagnosis.stop()
        if self._httpd is not None:
            self._httpd.stop()
            self._httpd = None


def sampled_weights(sess: Any) -> dict[int, float] | None:
    """op -> 1 / attached share for the ops an overhead budget samples now (None: none sampled)."""
    from ingero.collect.budget import BudgetHook

    for hook in sess.opts.hooks:
        if isinstance(hook, BudgetHook) and hook.probes is not None and hook.ratio < 1.0:
            return {int(op): 1.0 / hook.ratio for op in hook.switched_ops}
    return None
