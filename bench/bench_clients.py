"""The tracer's resident memory under 200 concurrent clients, each running a heavy query.

Starts a real `ingero trace` (needs root and eBPF) of one sleeping process,
then 200 client threads at once, each sending one of four heavy queries over
the socket: a 200 MB string (refused inside DuckDB, row over 1 MiB), a sort
of 20 M rows (DuckDB's memory_limit), a 5 M-row string_agg (reply over 64 MiB,
refused while fetching) and 200k rows (cut to max_rows).  The tracer's peak
RSS (VmHWM) must stay below BOUND_MIB; every client must get exactly one
answer (a result, a one-line refusal, or "busy" after its retries).

    sudo .venv/bin/python -m bench.bench_clients
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from ingero.daemon import client
from ingero.errors import IngeroError

CLIENTS = 200
# The bound: the tracer's own ~0.4 GiB, DuckDB's memory_limit (1 GiB, for sorts, joins and
# aggregates of every query at once) and the strings DuckDB builds outside it (the 200 MB
# value, up to MAX_CLIENTS at once) before the row check refuses them.
BOUND_MIB = 2048
HEAVY = (
    "SELECT repeat('x', 200000000) AS s",
    "SELECT count(*) FROM (SELECT * FROM range(20000000) t(i) ORDER BY random())",
    "SELECT i % 1000 AS k, string_agg(i::VARCHAR, ',') FROM range(5000000) t(i) GROUP BY k",
    "SELECT * FROM range(200000)",
)


def _vm(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    d = Path(tempfile.mkdtemp(prefix="ingero-bench-clients-"))
    sock, db = d / "t.sock", d / "t.duckdb"
    env = {**os.environ, "INGERO_SOCKET": str(sock), "INGERO_DB": str(db)}
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.02)"])
    tracer = subprocess.Popen([sys.executable, "-m", "ingero", "trace", "--pid", str(sleeper.pid),
                               "--duration", "900s"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not sock.exists():
            if tracer.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the tracer did not start: {tracer.stderr.read().decode()}")
            time.sleep(0.2)
        before = _vm(tracer.pid, "VmRSS")
        outcomes: Counter[str] = Counter()
        lock = threading.Lock()

        def one(i: int) -> None:
            try:
                reply = client.query_reply(HEAVY[i % len(HEAVY)], socket_path=sock, timeout_s=60)
                what = "truncated" if reply.get("truncated") else "answered"
            except IngeroError as exc:
                text = str(exc)
                what = ("busy" if "busy" in text else "row too large" if "larger than" in text
                        else "reply too large" if "too large" in text else "interrupted" if "interrupted" in text
                        else "other: " + text[:60])
            with lock:
                outcomes[what] += 1

        t0 = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        peak = _vm(tracer.pid, "VmHWM")
        alive = tracer.poll() is None
        print("| measure | value |")
        print("| --- | --- |")
        print(f"| clients | {CLIENTS} at once, {len(HEAVY)} heavy queries in turn, {elapsed:.0f} s in all |")
        print(f"| outcomes | {', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))} |")
        print(f"| tracer RSS before | {before / 2**20:.0f} MiB |")
        print(f"| tracer peak RSS (VmHWM) | {peak / 2**20:.0f} MiB (bound {BOUND_MIB} MiB) |")
        print(f"| tracer still running | {alive} |")
        ok = peak < BOUND_MIB * 2**20 and alive and sum(outcomes.values()) == CLIENTS
        print(f"| result | {'met' if ok else 'NOT met'} |")
        return 0 if ok else 1
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGTERM)
        tracer.wait(120)
        sleeper.kill()
        sleeper.wait()
        subprocess.run(["rm", "-rf", str(d)], check=False)


if __name__ == "__main__":
    sys.exit(main())
