"""Live: NCCL probes on NVIDIA's own libnccl.so.2 (the nvidia-nccl-cu12 wheel).

No GPU here: every call that needs one fails (ncclCommInitRank* with
ncclUnhandledCudaError, the collectives with ncclInvalidArgument for their
NULL comm), but every probe fires with the arguments passed.  One traced run
of tests/live/workloads/nccl_calls.c, started the way torchrun starts a
rank (RANK, WORLD_SIZE ... in its environment), serves every assert.
"""

from __future__ import annotations

import pytest

import prereqs
from workloads import Tracer, build, query

pytestmark = pytest.mark.live

N = 20
STREAM = 0x5150
UNIQUE_ID = bytes(range(0xA0, 0xB0)).hex()  # nccl_calls fills the ncclUniqueId with 0xa0, 0xa1, ...
ENV = "RANK=1 WORLD_SIZE=4 LOCAL_RANK=1 MASTER_ADDR=10.1.2.3 MASTER_PORT=29500 TORCHELASTIC_RUN_ID=job42"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    lib = prereqs.needs_nvidia_libnccl()
    tmp = tmp_path_factory.mktemp("nccl")
    exe = build("nccl_calls", tmp)
    db = tmp / "t.duckdb"
    tracer = Tracer(db, "--cuda-lib", str(lib), "--duration", "90s", "--cmd", f"env {ENV} {exe} {lib} {N}")
    tracer.wait_started()
    summary = tracer.finish(sig=None, timeout=120)
    assert summary["ended_by"] == "command exited", tracer.stderr
    pid = int(next(line.split()[1] for line in tracer.stderr.splitlines() if line.startswith("ok ")))
    return db, pid, lib


def test_every_probed_call_gives_one_row_with_its_arguments(traced: tuple) -> None:
    db, pid, _ = traced
    rows = query(db, """SELECT op, kind, count(*), min(bytes), max(bytes), min(peer), max(peer),
                               min(stream), max(stream), count(comm), min(ret) > 0
                        FROM events WHERE pid = $pid AND op LIKE 'nccl%' GROUP BY ALL ORDER BY ALL""", {"pid": pid})
    s = (STREAM, STREAM)
    assert rows == sorted([
        ("ncclAllReduce", "sum:float32", N, 4000, 4000, None, None, *s, 0, True),
        ("ncclReduceScatter", "max:float16", N, 200, 200, None, None, *s, 0, True),
        ("ncclAllGather", "int8", N, 300, 300, None, None, *s, 0, True),
        ("ncclBroadcast", "float64", N, 400, 400, 2, 2, *s, 0, True),
        ("ncclBroadcast", "uint64", N, 160, 160, 1, 1, *s, 0, True),  # ncclBcast, the in-place one
        ("ncclReduce", "min:int32", N, 40, 40, 3, 3, *s, 0, True),
        ("ncclSend", "uint8", N, 64, 64, 1, 1, *s, 0, True),
        ("ncclRecv", "bfloat16", N, 64, 64, 0, 0, *s, 0, True),
        # NULL comms, nothing created: comm is NULL on every row
        ("ncclCommInitRank", None, N, None, None, None, None, None, None, 0, True),
        ("ncclCommInitRankConfig", None, N, None, None, None, None, None, None, 0, True),
        ("ncclCommInitAll", None, N, None, None, None, None, None, None, 0, True),
        ("ncclCommSplit", None, N, None, None, None, None, None, None, 0, True),
        ("ncclGroupStart", None, N, None, None, None, None, None, None, 0, False),
        ("ncclGroupEnd", None, N, None, None, None, None, None, None, 0, True),
        ("ncclCommDestroy", None, N, None, None, None, None, None, None, 0, False),
        ("ncclCommAbort", None, N, None, None, None, None, None, None, 0, False),
    ])


def test_init_calls_name_the_rank_and_the_unique_id_even_when_they_fail(traced: tuple) -> None:
    db, pid, _ = traced
    rows = query(db, """SELECT comm, comm_id, rank, nranks, local_rank, job, count(*) FROM ranks
                        WHERE pid = $pid AND source = 'nccl' GROUP BY ALL ORDER BY rank NULLS LAST""", {"pid": pid})
    assert rows == [
        (None, UNIQUE_ID, 1, 4, None, None, N),  # ncclCommInitRank(nranks 4, rank 1)
        (None, UNIQUE_ID, 2, 4, None, None, N),  # ncclCommInitRankConfig(4, rank 2)
        (None, None, None, 2, None, None, N),  # ncclCommInitAll(2 devices): no comms[0], so no rank
    ]  # the failed splits made no communicator: no row


def test_the_torchrun_environment_gives_one_env_row(traced: tuple) -> None:
    db, pid, _ = traced
    rows = query(db, "SELECT comm, comm_id, rank, nranks, local_rank, job FROM ranks WHERE pid = $pid AND source = 'env'",
                 {"pid": pid})
    assert rows == [(None, None, 1, 4, 1, "job42")]


def test_the_probes_table_lists_every_nccl_function_attached(traced: tuple) -> None:
    db, _, lib = traced
    rows = query(db, """SELECT count(DISTINCT symbol), bool_and(attached) FROM probes
                        WHERE target = $lib AND probe_kind = 'uprobe' AND symbol LIKE 'nccl%'""", {"lib": str(lib)})
    assert rows == [(16, True)]  # 15 ops; ncclBcast stored as ncclBroadcast
