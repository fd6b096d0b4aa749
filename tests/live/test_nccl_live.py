"""Live: NCCL probes on NVIDIA's own libnccl.so.2 (the nvidia-nccl-cu12 wheel), and on a stand-in.

No GPU here: every NVIDIA call that needs one fails (ncclCommInitRank* with
ncclUnhandledCudaError, the collectives with ncclInvalidArgument for their
NULL comm), but every probe fires with the arguments passed.  What a probe
reads back once a communicator exists (an init's or split's out-pointer,
the comm a collective then passes) is checked on workloads/fake_libnccl.c,
whose calls succeed.  One traced run serves every assert: a shell running
tests/live/workloads/nccl_calls.c on NVIDIA's library, started the way
torchrun starts a rank (RANK, WORLD_SIZE ... in its environment), then on
the stand-in.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

import prereqs
import workloads
from workloads import HERE, Tracer, build, query

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

N = 20
STREAM = 0x5150
UNIQUE_ID = bytes(range(0xA0, 0xB0)).hex()  # nccl_calls fills the ncclUniqueId with 0xa0, 0xa1, ...
ENV = "RANK=1 WORLD_SIZE=4 LOCAL_RANK=1 MASTER_ADDR=10.1.2.3 MASTER_PORT=29500 TORCHELASTIC_RUN_ID=job42"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    lib = prereqs.needs_nvidia_libnccl()
    tmp = tmp_path_factory.mktemp("nccl")
    exe = build("nccl_calls", tmp)
    (tmp / "fake").mkdir()
    fake = tmp / "fake" / "libnccl.so.2"
    subprocess.run([shutil.which("cc") or "gcc", "-O1", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(fake),
                    str(HERE / "fake_libnccl.c")], check=True)
    db = tmp / "t.duckdb"
    tracer = Tracer(db, "--cuda-lib", str(lib), "--cuda-lib", str(fake), "--duration", "90s",
                    "--cmd", f"sh -c 'env {ENV} {exe} {lib} {N} && {exe} {fake} {N}'")
    tracer.wait_started()
    summary = tracer.finish(sig=None, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    assert summary["ended_by"] == "command exited", tracer.stderr
    nvidia_pid, fake_pid = (int(line.split()[1]) for line in tracer.stderr.splitlines() if line.startswith("ok "))
    return db, nvidia_pid, lib, fake_pid


def test_every_probed_call_gives_one_row_with_its_arguments(traced: tuple) -> None:
    db, pid, *_ = traced
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
    db, pid, *_ = traced
    rows = query(db, """SELECT comm, comm_id, rank, nranks, local_rank, job, count(*) FROM ranks
                        WHERE pid = $pid AND source = 'nccl' GROUP BY ALL ORDER BY rank NULLS LAST""", {"pid": pid})
    assert rows == [
        (None, UNIQUE_ID, 1, 4, None, None, N),  # ncclCommInitRank(nranks 4, rank 1)
        (None, UNIQUE_ID, 2, 4, None, None, N),  # ncclCommInitRankConfig(4, rank 2)
        (None, None, None, 2, None, None, N),  # ncclCommInitAll(2 devices): no comms[0], so no rank
    ]  # the failed splits made no communicator: no row


def test_the_torchrun_environment_gives_one_env_row(traced: tuple) -> None:
    db, pid, _, fake_pid = traced
    rows = query(db, """SELECT pid, comm, comm_id, rank, nranks, local_rank, job FROM ranks
                        WHERE source = 'env' AND pid IN ($a, $b)""", {"a": pid, "b": fake_pid})
    assert rows == [(pid, None, None, 1, 4, 1, "job42")]  # the second run's environment names no rank


def test_comms_created_are_read_back_at_return_and_passed_on(traced: tuple) -> None:
    db, *_, pid = traced
    rows = query(db, """SELECT op, count(*), min(comm), max(comm), max(ret) FROM events
                        WHERE pid = $pid AND op LIKE 'nccl%' GROUP BY op ORDER BY op""", {"pid": pid})
    rank1, split3 = 0xC0FFEE01, 0x5B000003
    comms = {
        "ncclCommInitRank": rank1, "ncclCommInitRankConfig": 0xC0DE0002, "ncclCommInitAll": 0xA1100000,
        "ncclCommSplit": split3, "ncclCommDestroy": split3, "ncclGroupStart": None, "ncclGroupEnd": None,
    }
    assert rows == [(op, 2 * N if op == "ncclBroadcast" else N, comms.get(op, rank1), comms.get(op, rank1), 0)
                    for op in sorted(r[0] for r in rows)]
    assert len(rows) == 15
    ranks = query(db, """SELECT comm, comm_id, rank, nranks, count(*) FROM ranks
                         WHERE pid = $pid AND source = 'nccl' GROUP BY ALL ORDER BY comm""", {"pid": pid})
    assert ranks == sorted([
        (rank1, UNIQUE_ID, 1, 4, N),
        (0xC0DE0002, UNIQUE_ID, 2, 4, N),
        (0xA1100000, None, 0, 2, N),  # ncclCommInitAll: comms[0] is rank 0 of 2
        (split3, f"{UNIQUE_ID}/3", None, None, N),  # split of rank1's comm, color 3: its rank is NCCL's to know
    ])


def test_ranks_of_one_job_on_different_libnccl_copies_share_the_comm_id(traced: tuple) -> None:
    db, pid, _, fake_pid = traced
    rows = query(db, "SELECT DISTINCT pid FROM ranks WHERE comm_id = $id ORDER BY pid", {"id": UNIQUE_ID})
    assert rows == sorted([(pid,), (fake_pid,)])


def test_the_probes_table_lists_every_nccl_function_attached(traced: tuple) -> None:
    db, _, lib, _ = traced
    rows = query(db, """SELECT count(DISTINCT symbol), bool_and(attached) FROM probes
                        WHERE target = $lib AND probe_kind = 'uprobe' AND symbol LIKE 'nccl%'""", {"lib": str(lib)})
    assert rows == [(16, True)]  # 15 ops; ncclBcast stored as ncclBroadcast
