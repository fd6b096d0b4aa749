"""PromQL's p99 of CUDA call durations from /metrics against the store's, on kept demo traces.

Run from the repo root: ``.venv/bin/python -m bench.bench_metrics_p99 DB...`` where each DB is a
``ingero demo SCENARIO --keep-db DB``.  Each trace's CUDA calls are folded into the metrics
aggregates as the tracer folds a flush, served on /metrics (one server per trace), scraped by
Debian's real Prometheus, and asked ``histogram_quantile(0.99, ...)`` per process and op; the
store's p99 is DuckDB's ``quantile_cont`` over the same rows, and "at rank" the order statistic
PromQL's rank (0.99 x count) points at.  With PYTHONPATH at another checkout, its buckets are
the ones measured.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import duckdb
import numpy as np

from ingero.events.records import EVENT_DTYPE
from ingero.metrics.aggregate import BUCKETS_S, Aggregates
from ingero.metrics.server import MetricsServer
from ingero.events.ops import OP_NAMES

OPS = ("cudaStreamSync", "cudaMemcpyAsync", "cudaMemcpy", "cudaLaunchKernel")
MIN_CALLS = 100


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _serve(db: Path) -> tuple[MetricsServer, list[tuple[int, str, int, float, float]]]:
    con = duckdb.connect(str(db), read_only=True)
    codes = {name: int(op) for op, name in OP_NAMES.items()}
    srv = MetricsServer.bind("127.0.0.1", 0)
    srv.aggregates = Aggregates(alive=lambda p: True)
    srv.collector.aggregates = srv.aggregates
    rows = []
    for op in OPS:
        for pid, n in con.execute("SELECT pid, count(*) FROM events WHERE op = $op GROUP BY pid HAVING count(*) >= $m",
                                  {"op": op, "m": MIN_CALLS}).fetchall():
            d = con.execute("SELECT duration_ns FROM events WHERE op = $op AND pid = $pid ORDER BY duration_ns",
                            {"op": op, "pid": pid}).fetchnumpy()["duration_ns"].astype(np.uint64)
            recs = np.zeros(len(d), dtype=EVENT_DTYPE)
            recs["op"], recs["pid"], recs["tid"], recs["duration_ns"] = codes[op], pid, pid, d
            srv.aggregates.add(recs)
            stored = con.execute("SELECT quantile_cont(duration_ns, 0.99) FROM events WHERE op = $op AND pid = $pid",
                                 {"op": op, "pid": pid}).fetchone()[0] / 1e9
            rows.append((int(pid), op, int(n), float(stored), float(d[math.ceil(0.99 * len(d)) - 1]) / 1e9))
    con.close()
    return srv, rows


def main(dbs: list[str]) -> int:
    prom_bin = shutil.which("prometheus")
    assert prom_bin, "Debian's prometheus is needed (apt-get install prometheus)"
    servers = {Path(db).stem: _serve(Path(db)) for db in dbs}
    with tempfile.TemporaryDirectory(prefix="ingero-bench-p99-") as tmp:
        targets = ", ".join(f'"127.0.0.1:{srv.port}"' for srv, _ in servers.values())
        (Path(tmp) / "p.yml").write_text(f"global: {{scrape_interval: 1s}}\nscrape_configs:\n"
                                         f"  - job_name: demo\n    static_configs: [{{targets: [{targets}]}}]\n")
        prom_port = _free_port()
        prom = subprocess.Popen([prom_bin, f"--config.file={tmp}/p.yml", f"--storage.tsdb.path={tmp}/tsdb",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            api = f"http://127.0.0.1:{prom_port}/api/v1/query?"

            def promql(q: str) -> list:
                return json.loads(_get(api + urllib.parse.urlencode({"query": q})))["data"]["result"]

            end = time.monotonic() + 120
            while time.monotonic() < end:
                try:
                    if len([r for r in promql('up == 1')]) == len(servers):
                        break
                except OSError:
                    pass
                time.sleep(0.5)
            print(f"{len(BUCKETS_S)} bounds, {BUCKETS_S[0]:g} .. {BUCKETS_S[-1]:g} s\n")
            print("| trace | pid | op | calls | store p99 (quantile_cont), ms | at PromQL's rank, ms | PromQL p99, ms "
                  "| vs store | vs at rank |")
            print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
            for name, (srv, rows) in servers.items():
                for pid, op, n, stored, at_rank in rows:
                    got = promql(f'histogram_quantile(0.99, ingero_cuda_call_duration_seconds_bucket{{instance='
                                 f'"127.0.0.1:{srv.port}",pid="{pid}",op="{op}"}})')
                    p = float(got[0]["value"][1])
                    print(f"| {name} | {pid} | {op} | {n:,} | {stored * 1e3:.3f} | {at_rank * 1e3:.3f} | {p * 1e3:.3f} "
                          f"| {(p / stored - 1) * 100:+.1f}% | {(p / at_rank - 1) * 100:+.1f}% |")
        finally:
            prom.terminate()
            prom.wait(20)
            for srv, _ in servers.values():
                srv.close()
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
