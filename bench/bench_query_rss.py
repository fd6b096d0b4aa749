"""The tracer's resident memory while one hostile query runs over its socket (issue 41.13).

Starts a real `ingero trace` (needs root and eBPF) of one sleeping process and
sends each query in turn, one at a time, sampling the tracer's RSS every 2 ms
with psutil: before the query and its peak while it runs.  The values a
function builds (repeat, range, lpad, a list_reduce doubling a string) are
refused before DuckDB builds them (store/valuecap.py); what DuckDB tracks
(string_agg, sorts) stays under its 1 GiB memory limit.

    sudo .venv/bin/python -m bench.bench_query_rss
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from ingero.daemon import client
from ingero.errors import IngeroError

QUERIES = (
    "SELECT 1",
    "SELECT repeat('x', 1000000000)",
    "SELECT repeat('x', 200000000)",
    "SELECT len(range(100000000))",
    "SELECT strlen(lpad('x', 500000000, 'y'))",
    "SELECT strlen(list_reduce(list_transform(range(31), lambda i: 'x'), lambda a, b: a || a))",
    "SELECT len(list_transform(range(500), lambda x: repeat('x', 1000000)))",
    "SELECT strlen(string_agg(s, '')) FROM (SELECT repeat('x', 1000000) s FROM range(3000))",
    "SELECT count(*) FROM (SELECT * FROM range(20000000) t(i) ORDER BY random())",
)


def _peak_while(proc: psutil.Process, fn) -> tuple[int, int, str, float]:
    base = proc.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.002)

    t = threading.Thread(target=watch)
    t.start()
    t0 = time.monotonic()
    try:
        answer = fn()
    except IngeroError as exc:
        answer = exc.message
    took = time.monotonic() - t0
    time.sleep(0.3)  # a peak after the reply (freeing) is still the query's
    stop.set()
    t.join()
    return base, peak[0], answer, took


def main() -> int:
    repo = Path(__file__).resolve().parents[1]
    d = Path(tempfile.mkdtemp(prefix="ingrss-", dir="/tmp"))
    db, sock = d / "t.duckdb", d / "t.sock"
    env = {**os.environ, "INGERO_SOCKET": str(sock), "INGERO_DB": str(db), "PYTHONPATH": str(repo)}
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.02)"])
    tracer = subprocess.Popen([sys.executable, "-m", "ingero", "trace", "--pid", str(sleeper.pid),
                               "--duration", "900s"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not sock.exists():
            if tracer.poll() is not None:
                print(tracer.stderr.read(), file=sys.stderr)
                return 1
            time.sleep(0.2)
        while True:
            try:
                if client.status(socket_path=sock)["running"]:
                    break
            except IngeroError:
                pass
            time.sleep(0.2)
        time.sleep(3)  # past the first flushes
        proc = psutil.Process(tracer.pid)
        print(f"load {os.getloadavg()[0]:.1f}")
        print("| query | RSS before MiB | peak MiB | s | answer |")
        print("| --- | --- | --- | --- | --- |")
        for q in QUERIES:
            base, peak, answer, took = _peak_while(
                proc, lambda: str(client.query(q, socket_path=sock, timeout_s=60)[1])[:40])
            print(f"| `{q}` | {base >> 20} | {peak >> 20} | {took:.2f} | {answer[:90]} |", flush=True)
    finally:
        tracer.send_signal(signal.SIGTERM)
        tracer.wait(120)
        sleeper.kill()
        sleeper.wait()
        subprocess.run(["rm", "-rf", str(d)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
