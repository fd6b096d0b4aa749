"""The host samplers as a trace hook: memory, system, GPU metrics and cgroup CPU limits, once a second.

Their rows go into the second's one transaction (``write_second``), beside
the session's own process_cpu rows: one commit per second, not four (on an
idle trace the commits were a third of the tracer's CPU).  A sampler whose
library is missing (psutil, pynvml) is left out; NVML's absence is the one
line ``on_start`` returns.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ingero.traceapi import TraceHook


class SamplerHook(TraceHook):
    def __init__(self) -> None:
        self.system: Any = None
        self.gpu: Any = None
        self.memory: Any = None
        self.cgroup: Any = None
        self.note: str | None = None

    def on_start(self, sess: Any) -> list[str] | None:
        try:
            from ingero.sample import memory

            self.memory = memory
        except ImportError:
            self.memory = None
        from ingero.sample.cgroup import CgroupSampler  # (the standard library only)

        self.cgroup = CgroupSampler()
        try:
            from ingero.sample.system import SystemSampler

            self.system = SystemSampler()
        except ImportError:
            self.system = None
        try:
            from ingero.sample.gpu import GpuSampler

            self.gpu = GpuSampler()
            self.note = self.gpu.note
        except ImportError:
            self.gpu = None
        return [self.note] if self.note else None

    def write_second(self, sess: Any) -> None:
        store, session_id = sess.store, sess.session_id
        if self.memory is not None:
            rows = self.memory.sample(frozenset(sess.traced or ()))
            if rows:
                store.append("process_memory", pa.Table.from_pylist([{**r, "session_id": session_id} for r in rows]))
        if self.system is not None:
            row = self.system.sample()
            if row:
                store.append("system_metrics", pa.Table.from_pylist([{**row, "session_id": session_id}]))
        if self.gpu is not None:
            rows = self.gpu.sample()
            if rows:
                store.append("gpu_metrics", pa.Table.from_pylist([{**r, "session_id": session_id} for r in rows]))
        if self.cgroup is not None:
            self._append_cgroup(sess, self.cgroup.sample(frozenset(sess.traced or ())))

    def on_end(self, sess: Any) -> None:
        # the cgroups' last reading: the throttling of the trace's last partial second (a job
        # that exited since the last second has no /proc entry left to find its cgroup by)
        if self.cgroup is not None:
            with sess.store.transaction():
                self._append_cgroup(sess, self.cgroup.finish())

    @staticmethod
    def _append_cgroup(sess: Any, rows: list[dict]) -> None:
        if rows:
            sess.store.append("cgroup_cpu", pa.Table.from_pylist([{**r, "session_id": sess.session_id} for r in rows]))
