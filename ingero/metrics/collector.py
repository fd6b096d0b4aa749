"""The Prometheus collector: metric families built from one Aggregates snapshot per scrape.

Built on prometheus_client's custom-collector API (its *MetricFamily classes
and its own text exposition), so nothing here formats the wire format.
Every series of a traced process carries ``pid`` and ``process`` (its name
as the store has it); names are documented in the README's metrics section.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ingero import __version__
from ingero.metrics.aggregate import BUCKETS_S, Aggregates, Histo
from ingero.metrics.diagnosis import SEVERITY_LEVEL, Diagnosis

_LE = [floatToGoString(b) for b in BUCKETS_S] + ["+Inf"]  # as prometheus_client writes them
_PROC = ["pid", "process"]


def _buckets(h: Histo) -> list[tuple[str, float]]:
    return list(zip(_LE, h.buckets.cumsum().tolist()))


def _proc(pid: int, names: dict[int, str]) -> list[str]:
    return [str(pid), names.get(pid, "")]


class IngeroCollector(Collector):
    """Reads ``aggregates`` (and ``diagnosis`` when given) at each scrape."""

    def __init__(self, aggregates: Aggregates, diagnosis: Diagnosis | None = None) -> None:
        self.aggregates = aggregates
        self.diagnosis = diagnosis
        self.http_closed: Callable[[], dict[str, int]] | None = None  # the server's counters (http.Stats)

    def collect(self) -> Iterator[object]:
        s = self.aggregates.snapshot()
        names = s.names
        info = GaugeMetricFamily("ingero_build_info", "The tracer's version (always 1)", labels=["version"])
        info.add_metric([__version__], 1)
        yield info

        # its _count is the call counter: a separate *_total would repeat it beside every histogram
        durs = HistogramMetricFamily("ingero_cuda_call_duration_seconds", "CUDA runtime/driver calls per traced "
                                     "process and op: count and durations (entry to return)", labels=[*_PROC, "op"])
        for (pid, op), h in sorted(s.cuda.items()):
            durs.add_metric([*_proc(pid, names), op], _buckets(h), h.sum_ns / 1e9)
        yield durs

        off = CounterMetricFamily("ingero_offcpu_seconds", "Time traced threads spent off CPU: preempted "
                                  "(switched out while runnable) or blocked (sleep, I/O)", labels=[*_PROC, "state"])
        switches = CounterMetricFamily("ingero_offcpu_switches", "Switches out of traced threads",
                                       labels=[*_PROC, "state"])
        runq = CounterMetricFamily("ingero_runqueue_wait_seconds", "Time traced threads waited for a CPU "
                                   "while runnable (wakeup or preemption to running)", labels=_PROC)
        for pid, o in sorted(s.offcpu.items()):
            p = _proc(pid, names)
            off.add_metric([*p, "preempted"], o.preempted_ns / 1e9)
            off.add_metric([*p, "blocked"], o.blocked_ns / 1e9)
            switches.add_metric([*p, "preempted"], o.preempted)
            switches.add_metric([*p, "blocked"], o.blocked)
            runq.add_metric(p, o.runq_ns / 1e9)
        yield off
        yield switches
        yield runq

        faults = CounterMetricFamily("ingero_page_faults", "User page faults of traced processes "
                                     "(the time they block counts as blocked off-CPU time)", labels=_PROC)
        for pid, n in sorted(s.faults.items()):
            faults.add_metric(_proc(pid, names), n)
        yield faults
        bio = HistogramMetricFamily("ingero_block_io_duration_seconds", "Block I/O requests on the host, "
                                    "issue to completion", labels=["kind"])
        for kind, h in sorted(s.block_io.items()):
            bio.add_metric([kind], _buckets(h), h.sum_ns / 1e9)
        yield bio

        yield from _health(s.health)
        if self.http_closed is not None:
            closed = CounterMetricFamily("ingero_metrics_connections_closed", "Connections to /metrics closed "
                                         "unanswered: evicted (a newer one needed the slot while it still "
                                         "sent its request), timeout (no whole request in time), too_large, "
                                         "busy (answered 503)", labels=["reason"])
            for reason, n in self.http_closed().items():
                closed.add_metric([reason], n)
            yield closed
        if self.diagnosis is not None:
            yield from _diagnosis(self.diagnosis, names)


def _health(h) -> Iterator[object]:
    drops = CounterMetricFamily("ingero_drops", "Events lost: kernel (ring full) or user (lapped, unstored)",
                                labels=["source"])
    drops.add_metric(["kernel"], h.drops_kernel)
    drops.add_metric(["user"], h.drops_user)
    yield drops
    yield CounterMetricFamily("ingero_events_stored", "Events stored in DuckDB", value=h.events)
    yield GaugeMetricFamily("ingero_events_per_second", "Events stored per second over the last 10 s",
                            value=h.events_per_s)
    yield CounterMetricFamily("ingero_stale_calls", "CUDA calls whose return never came (no row stored)",
                              value=h.stale_calls)
    yield GaugeMetricFamily("ingero_db_bytes", "DuckDB file plus WAL size", value=h.db_bytes)
    flush = HistogramMetricFamily("ingero_flush_duration_seconds", "Time to store one batch (append + commit)")
    flush.add_metric([], _buckets(h.flushes), h.flushes.sum_ns / 1e9)
    yield flush
    if h.last_flush_s is not None:
        yield GaugeMetricFamily("ingero_last_flush_timestamp_seconds", "Wall clock of the last flush",
                                value=h.last_flush_s)


def _diagnosis(d: Diagnosis, names: dict[int, str]) -> Iterator[object]:
    snap = d.snapshot()
    # no severity label on the share: it would clash with alert rules' own `severity` label, and
    # a chain moving between MEDIUM and HIGH would start a new series; the severity gauge has it
    share = GaugeMetricFamily("ingero_diagnosis_share_ratio", "Share of the process' wall clock a causal chain "
                              "active in the last diagnosis window explains (0-1)", labels=["rule", *_PROC])
    level = GaugeMetricFamily("ingero_diagnosis_severity", "Severity of an active causal chain: "
                              "3 HIGH, 2 MEDIUM, 1 LOW", labels=["rule", *_PROC])
    for c in snap.chains:
        p = [str(c.pid), names.get(c.pid) or c.process]
        share.add_metric([c.rule, *p], c.share)
        level.add_metric([c.rule, *p], SEVERITY_LEVEL.get(c.severity, 0))
    yield share
    yield level
    step = GaugeMetricFamily("ingero_step_duration_seconds", "Step time of the loop explain analysed in the "
                             "last diagnosis window (a request for an inference server): median (quantile "
                             "0.5) and p99", labels=[*_PROC, "quantile"])
    rate = GaugeMetricFamily("ingero_steps_per_second", "Steps the loop completed in the last diagnosis "
                             "window, per second of it", labels=_PROC)
    if snap.steps is not None:
        st = snap.steps
        p = [str(st.pid), names.get(st.pid) or st.process]
        step.add_metric([*p, "0.5"], st.median_s)
        step.add_metric([*p, "0.99"], st.p99_s)
        rate.add_metric(p, st.per_s)
    yield step
    yield rate
    yield CounterMetricFamily("ingero_diagnosis_runs", "Diagnosis runs over the last window",
                              value=snap.runs)
    yield CounterMetricFamily("ingero_diagnosis_errors", "Diagnosis runs that failed", value=snap.errors)
    if snap.last_run_s is not None:
        yield GaugeMetricFamily("ingero_diagnosis_last_run_timestamp_seconds", "Wall clock of the last "
                                "diagnosis run", value=snap.last_run_s)
