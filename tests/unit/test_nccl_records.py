"""NCCL records on hand-made bytes: the kind byte, the extension join, ranks rows, the environment."""

from __future__ import annotations

import numpy as np

from ingero.collect import decode, ranks
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, NCCL_EXT_DTYPE, Kind, nccl_kind_name

OFFSET = 1_000_000_000
UID = (0x0706050403020100, 0x0F0E0D0C0B0A0908)  # ncclUniqueId bytes 00 01 02 ... 0f


def nccl_kind(redop: int, dtype: int) -> int:
    return int(Kind.NCCL) | redop << 4 | dtype


def call(op: Op, *, tid: int = 7, ts: int = 100, dur: int = 10, arg: int = 0, peer: int = -1, kind: int = 15,
         pid: int = 5) -> np.ndarray:
    r = np.zeros(1, EVENT_DTYPE)
    r["op"], r["tid"], r["pid"], r["ts_ns"], r["duration_ns"] = int(op), tid, pid, ts, dur
    r["arg"], r["kind"], r["stack_id"] = arg, kind, -1
    r["other_pid"] = np.array([peer], np.int32).view(np.uint32)
    return r


def ext(call_op: Op, *, tid: int = 7, ts: int = 100, comm: int = 0, uid: tuple = (0, 0), rank: int = -1,
        nranks: int = -1, color: int = -1, pid: int = 5) -> np.ndarray:
    x = np.zeros(1, NCCL_EXT_DTYPE)
    x["op"], x["call_op"], x["tid"], x["pid"], x["ts_ns"] = int(Op.NCCL_EXT), int(call_op), tid, pid, ts
    x["comm"], x["rank"], x["nranks"], x["color"] = comm, rank, nranks, color
    x["id"] = uid
    return x.view(EVENT_DTYPE)


def batch(*recs: np.ndarray) -> np.ndarray:
    return decode.storage_order(np.concatenate(recs))


def test_kind_byte_names_the_reduction_and_the_datatype() -> None:
    assert nccl_kind_name(nccl_kind(0, 7)) == "sum:float32"
    assert nccl_kind_name(nccl_kind(4, 9)) == "avg:bfloat16"
    assert nccl_kind_name(nccl_kind(5, 6)) == "custom:float16"  # ncclRedOpCreatePreMulSum's
    assert nccl_kind_name(nccl_kind(7, 0)) == "int8"  # no reduction (all-gather, send ...)
    assert nccl_kind_name(nccl_kind(7, 15)) == "unknown"
    assert nccl_kind_name(int(Kind.H2D)) is None


def test_extension_gives_its_call_the_comm_and_leaves_no_row() -> None:
    join = ranks.NcclJoin(session_id=1, offset_ns=OFFSET)
    recs = batch(ext(Op.NCCL_ALL_REDUCE, comm=0xABC), call(Op.NCCL_ALL_REDUCE, arg=4000, kind=nccl_kind(0, 7)),
                 call(Op.CUDA_MEMCPY, tid=8, arg=64, kind=1))
    out, comm, rows = join.join(recs)
    assert [Op(o) for o in out["op"]] == [Op.CUDA_MEMCPY, Op.NCCL_ALL_REDUCE]
    table = decode.events_table(out, session_id=1, offset_ns=OFFSET, comm=comm)
    got = table.select(["op", "kind", "bytes", "comm", "peer"]).to_pylist()
    assert got == [
        {"op": "cudaMemcpy", "kind": "H2D", "bytes": 64, "comm": None, "peer": None},
        {"op": "ncclAllReduce", "kind": "sum:float32", "bytes": 4000, "comm": 0xABC, "peer": None},
    ]
    assert rows == []


def test_peer_is_stored_for_point_to_point_and_rooted_calls_only() -> None:
    recs = batch(call(Op.NCCL_SEND, peer=3), call(Op.NCCL_REDUCE, peer=0, tid=8), call(Op.NCCL_ALL_GATHER, tid=9))
    table = decode.events_table(recs, session_id=1, offset_ns=0)
    assert table.select(["op", "peer", "comm"]).to_pylist() == [
        {"op": "ncclAllGather", "peer": None, "comm": None},
        {"op": "ncclReduce", "peer": 0, "comm": None},
        {"op": "ncclSend", "peer": 3, "comm": None},
    ]


def test_an_extension_read_before_its_call_waits_for_the_next_batch() -> None:
    join = ranks.NcclJoin(session_id=1, offset_ns=OFFSET)
    out, comm, rows = join.join(batch(ext(Op.NCCL_COMM_INIT_RANK, comm=0xC0, uid=UID, rank=1, nranks=4)))
    assert len(out) == 0 and comm is None and rows == []
    out, comm, rows = join.join(batch(call(Op.NCCL_COMM_INIT_RANK, ts=100, dur=50)))
    assert comm.tolist() == [0xC0]
    assert rows == [{"session_id": 1, "pid": 5, "seen_ns": OFFSET + 150, "source": "nccl", "comm": 0xC0,
                     "comm_id": bytes(range(16)).hex(), "rank": 1, "nranks": 4, "local_rank": None, "job": None}]


def test_a_split_is_named_after_its_parent_and_color_and_knows_no_rank() -> None:
    join = ranks.NcclJoin(session_id=1, offset_ns=0)
    _, _, rows = join.join(batch(
        ext(Op.NCCL_COMM_INIT_RANK, comm=0xC0, uid=UID, rank=1, nranks=4), call(Op.NCCL_COMM_INIT_RANK),
        ext(Op.NCCL_COMM_SPLIT, ts=300, comm=0x5B, uid=(0xC0, 5), color=3), call(Op.NCCL_COMM_SPLIT, ts=300),
        # a split with NCCL_SPLIT_NOCOLOR creates nothing: no row
        ext(Op.NCCL_COMM_SPLIT, ts=400, comm=0, uid=(0xC0, 5), color=-1), call(Op.NCCL_COMM_SPLIT, ts=400),
    ))
    split = [r for r in rows if r["comm"] == 0x5B]
    assert [(r["comm_id"], r["rank"], r["nranks"]) for r in split] == [(bytes(range(16)).hex() + "/3", None, None)]
    assert len(rows) == 2


def test_a_failed_init_keeps_the_rank_it_asked_for_without_a_comm() -> None:
    join = ranks.NcclJoin(session_id=1, offset_ns=0)
    _, comm, rows = join.join(batch(ext(Op.NCCL_COMM_INIT_ALL, comm=0, rank=-1, nranks=2),
                                    call(Op.NCCL_COMM_INIT_ALL)))
    assert comm.tolist() == [0]  # stored as NULL
    assert [(r["comm"], r["comm_id"], r["rank"], r["nranks"]) for r in rows] == [(None, None, None, 2)]


def test_extensions_whose_call_never_came_are_forgotten() -> None:
    join = ranks.NcclJoin(session_id=1, offset_ns=0)
    join.join(batch(ext(Op.NCCL_SEND, comm=1)))
    for _ in range(3):
        join.join(batch(call(Op.CUDA_MEMCPY)))
    _, comm, _ = join.join(batch(call(Op.NCCL_SEND)))
    assert comm.tolist() == [0]


def test_torchrun_and_slurm_environments() -> None:
    env = ranks.parse_environ(b"PATH=/bin\0RANK=3\0WORLD_SIZE=8\0LOCAL_RANK=1\0MASTER_ADDR=n1\0MASTER_PORT=29500\0")
    row = ranks.env_row(env, session_id=1, pid=9, seen_ns=5)
    assert (row["rank"], row["nranks"], row["local_rank"], row["job"]) == (3, 8, 1, "n1:29500")
    env = ranks.parse_environ(b"SLURM_PROCID=2\0SLURM_NTASKS=4\0SLURM_LOCALID=0\0SLURM_JOB_ID=777\0")
    row = ranks.env_row(env, session_id=1, pid=9, seen_ns=5)
    assert (row["rank"], row["nranks"], row["local_rank"], row["job"]) == (2, 4, 0, "777")
    env = ranks.parse_environ(b"RANK=0\0TORCHELASTIC_RUN_ID=abc\0SLURM_JOB_ID=777\0")
    assert ranks.env_row(env, session_id=1, pid=9, seen_ns=5)["job"] == "abc"
    assert ranks.env_row(ranks.parse_environ(b"HOME=/root\0"), session_id=1, pid=9, seen_ns=5) is None
