"""NCCL calls' extension records, and which rank of which job each traced process is.

An NCCL call leaves two records in the ring (bpf/nccl.bpf.c): a struct
ingero_nccl_ext (op NCCL_EXT), then the call's own struct ingero_event.
``NcclJoin`` takes the extension records out of a batch, gives each call
row its comm (events.comm), and turns init / split calls into ``ranks``
rows.  The extension is claimed first, so it is read in the same batch as
its call or an earlier one, never a later one: what waits here is only
extensions whose call record is still to come.

``env_row`` reads a process's torchrun / Slurm environment from
/proc/PID/environ (once per traced process, as its name is read): the
'env' row of ``ranks``.  Nothing here guesses a rank: a process whose
communicator was created before the trace began has its environment row,
or none.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from ingero.events.ops import NCCL_OPS, Op
from ingero.events.records import NCCL_EXT_DTYPE

PROC = Path("/proc")

# Calls that create a communicator: each makes a 'nccl' row of ranks.
_INIT_OPS = frozenset({Op.NCCL_COMM_INIT_RANK, Op.NCCL_COMM_INIT_RANK_CONFIG, Op.NCCL_COMM_INIT_ALL})
_NCCL_MASK = np.zeros(256, dtype=bool)
_NCCL_MASK[[int(o) for o in NCCL_OPS]] = True
# Extensions whose call never came (its record was dropped: the ring was
# full) are forgotten after this many joins; a call's record follows its
# extension within microseconds, so one join later at most.
_KEEP_JOINS = 3


class NcclJoin:
    """Extension records -> events.comm and ranks rows, across flushes."""

    def __init__(self, session_id: int, offset_ns: int):
        self.session_id = session_id
        self.offset_ns = offset_ns
        # (tid, ts_ns) -> (join number, the extension's fields as a tuple)
        self._waiting: dict[tuple[int, int], tuple[int, tuple]] = {}
        self._joins = 0
        # (pid, comm) -> comm_id: a split's new communicator is named after its parent's
        self._comm_ids: dict[tuple[int, int], str | None] = {}

    def join(self, recs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, list[dict[str, Any]]]:
        """(recs without extension records, events.comm per record or None, ranks rows)."""
        self._joins += 1
        op = recs["op"]
        is_ext = op == int(Op.NCCL_EXT)
        if is_ext.any():
            ext = np.ascontiguousarray(recs[is_ext]).view(NCCL_EXT_DTYPE)
            for x in ext:
                self._waiting[(int(x["tid"]), int(x["ts_ns"]))] = (self._joins, _fields(x))
            recs = recs[~is_ext]
            op = recs["op"]
        rows: list[dict[str, Any]] = []
        calls = np.flatnonzero(_NCCL_MASK[op])
        comm = None
        if len(calls):
            # in time order: storage_order groups and reverses runs, and a split's row
            # needs its parent's comm_id, noted by an init of the same process earlier
            calls = calls[np.argsort(recs["ts_ns"][calls], kind="stable")]
            comm = np.zeros(len(recs), dtype=np.uint64)
            for i in calls.tolist():
                r = recs[i]
                got = self._waiting.pop((int(r["tid"]), int(r["ts_ns"])), None)
                if got is None:
                    continue
                x = got[1]
                comm[i] = x["comm"]
                # A failed split made no communicator and knows no rank: nothing to
                # say.  A failed init still says which rank of which job was meant.
                if x["call_op"] in _INIT_OPS or (x["call_op"] == Op.NCCL_COMM_SPLIT and x["comm"]):
                    rows.append(self._rank_row(r, x))
        stale = [k for k, (n, _) in self._waiting.items() if self._joins - n >= _KEEP_JOINS]
        for k in stale:
            del self._waiting[k]
        return recs, comm, rows

    def _rank_row(self, rec: np.void, x: dict[str, Any]) -> dict[str, Any]:
        pid = int(rec["pid"])
        if x["call_op"] == Op.NCCL_COMM_SPLIT:
            # Ranks passing the same color to a split of one parent form one
            # communicator: the parent's id and the color name it alike in each.
            parent_id = self._comm_ids.get((pid, x["id"][0]))
            comm_id = f"{parent_id}/{x['color']}" if parent_id is not None and x["color"] >= 0 else None
        elif x["call_op"] == Op.NCCL_COMM_INIT_ALL:
            comm_id = None  # NCCL makes its own unique id inside
        else:
            comm_id = struct.pack("<QQ", *x["id"]).hex()
        if x["comm"]:
            self._comm_ids[(pid, x["comm"])] = comm_id
        return {
            "session_id": self.session_id,
            "pid": pid,
            "seen_ns": int(rec["ts_ns"]) + int(rec["duration_ns"]) + self.offset_ns,
            "source": "nccl",
            "comm": x["comm"] or None,
            "comm_id": comm_id,
            "rank": x["rank"] if x["rank"] >= 0 else None,
            "nranks": x["nranks"] if x["nranks"] >= 0 else None,
            "local_rank": None,
            "job": None,
        }


def _fields(x: np.void) -> dict[str, Any]:
    return {
        "comm": int(x["comm"]),
        "id": (int(x["id"][0]), int(x["id"][1])),
        "rank": int(x["rank"]),
        "nranks": int(x["nranks"]),
        "color": int(x["color"]),
        "call_op": int(x["call_op"]),
    }


# ---------------------------------------------------------------- environment

# The variables torchrun (torch.distributed.run) and Slurm set for each rank.
_RANK_VARS = ("RANK", "SLURM_PROCID")
_WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS")
_LOCAL_VARS = ("LOCAL_RANK", "SLURM_LOCALID")
_WANTED = frozenset(_RANK_VARS + _WORLD_VARS + _LOCAL_VARS + (
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"))


def parse_environ(raw: bytes) -> dict[str, str]:
    """The variables of a /proc/PID/environ block that name a rank or a job."""
    out = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            key = name.decode("ascii", "replace")
            if key in _WANTED:
                out[key] = value.decode("utf-8", "replace")
    return out


def _int(env: dict[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            continue
    return None


def env_row(env: dict[str, str], *, session_id: int, pid: int, seen_ns: int) -> dict[str, Any] | None:
    """The 'env' ranks row of a process with this environment; None when nothing in it names a rank or job."""
    rank, nranks, local = _int(env, _RANK_VARS), _int(env, _WORLD_VARS), _int(env, _LOCAL_VARS)
    job = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID")
    if not job and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        job = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    if rank is None and nranks is None and local is None and not job:
        return None
    return {"session_id": session_id, "pid": pid, "seen_ns": seen_ns, "source": "env", "comm": None,
            "comm_id": None, "rank": rank, "nranks": nranks, "local_rank": local, "job": job or None}


def read_environ(pid: int, proc: Path = PROC) -> dict[str, str] | None:
    """parse_environ of a live process; None when it is gone or unreadable."""
    try:
        return parse_environ((proc / str(pid) / "environ").read_bytes())
    except OSError:
        return None
