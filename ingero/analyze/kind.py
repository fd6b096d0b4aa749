"""What kind of job the loop is, from what it does: a training loop, or a server waiting for requests.

A server's loop thread blocks on sockets between bursts of GPU work: in recv
or accept (or poll/epoll on a socket fd), woken by a client's send or by the
network (waits.py).  A training loop repeats steps and waits on its data
(DataLoader workers' pipes) or on nothing.  Fixes follow the kind: a server
has no DataLoader; a server that mostly waits for requests needs sizing, not
tuning.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import units
from ingero.analyze.context import Context
from ingero.analyze.waits import SOCKET_CALLS

TRAINING = "training loop"
SERVER = "inference server"

# A loop whose socket waits come at least this often per second, and hold at least this share of
# its blocked time outside CUDA calls, serves requests (a training loop streaming shards over the
# network reads in large chunks: a few waits a second, next to its steps' syncs).
MIN_REQUESTS_PER_S = 2.0
MIN_SOCKET_SHARE = 0.5

SOCKET_WAITS_SQL = """
SELECT b.pid, sum(b.n) FILTER (s), sum(b.ns) FILTER (s), sum(b.ns), count(DISTINCT b.w),
       any_value(b.via_call ORDER BY b.ns DESC) FILTER (s),
       coalesce(sum(b.n) FILTER (list_contains(['accept', 'accept4'], b.via_call)), 0)
FROM (SELECT *, list_contains($socket_calls, via_call) OR via_fd = 'socket' AS s FROM ing_block) b
GROUP BY b.pid
"""


@dataclass(frozen=True)
class Kind:
    pid: int
    kind: str  # TRAINING | SERVER
    evidence: str  # "blocked in recvfrom on a socket between requests, 24.8 requests/s"
    requests_per_s: float | None = None
    wait_share: float = 0.0  # of the loop's wall clock, waiting for a request


def classify(ctx: Context) -> dict[int, Kind]:
    """pid -> its kind, for every loop whose blocked time was attributed (others: training)."""
    out = {}
    wall_s = ctx.window_ns / 1e9
    for pid, n, sock_ns, blocked_ns, nw, call, accepts in ctx.con.execute(
            SOCKET_WAITS_SQL, {"socket_calls": sorted(SOCKET_CALLS)}).fetchall():
        seconds = max(int(nw), 1) * wall_s
        rate = float(n or 0) / seconds
        share = float(sock_ns or 0) / float(blocked_ns) if blocked_ns else 0.0
        wait = float(sock_ns or 0) / (seconds * 1e9)
        if rate >= MIN_REQUESTS_PER_S and share >= MIN_SOCKET_SHARE:
            out[int(pid)] = Kind(int(pid), SERVER, f"blocked in {call or 'a socket wait'} on a socket between "
                                 f"requests, {rate:,.1f} requests/s, waiting for them {units.pct(wait)} of wall clock",
                                 rate, wait)
        elif accepts:
            # the loop thread accepted connections itself: a server whose requests come back to back
            # (its socket reads seldom wait, so they are not counted)
            out[int(pid)] = Kind(int(pid), SERVER, f"the loop thread accepted connections (accept) and reads "
                                 f"its requests from sockets, which seldom made it wait ({units.pct(wait)} of "
                                 "wall clock): requests come back to back", None, wait)
    return out


def of(ctx: Context, pid: int) -> Kind:
    return ctx.derived.kinds.get(pid) or Kind(pid, TRAINING, "")
