"""The simulated NCCL (demos/build/libnccl.so.2): collectives really wait for every rank.

Two rank processes share one communicator.  Rank 1 enters each all-reduce
only after rank 0's call has returned (a file handshake) and 10 ms later, so
the order is fixed whatever the load: rank 1 is the last one in every time,
rank 0's part waits for it at least 10 ms per collective and rank 1's never
waits; rank 0's stream sync returns only after rank 1 has entered.  Under
the spin policy and the blocking one (which sleeps on the shared futex).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ingero.collect import probes
from workloads import simcuda

pytestmark = pytest.mark.live

N = 8
DELAY_MS = 10

RANK = r"""
import ctypes, json, os, sys, time
from pathlib import Path
lib_dir, rank, rdzv = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
N, DELAY = int(sys.argv[4]), float(sys.argv[5]) / 1e3
cu = ctypes.CDLL(str(lib_dir / "libcudart.so.12"))
nc = ctypes.CDLL(str(lib_dir / "libnccl.so.2"))
P = ctypes.c_void_p
class Uid(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
nc.ncclCommInitRank.argtypes = [ctypes.POINTER(P), ctypes.c_int, Uid, ctypes.c_int]
nc.ncclAllReduce.argtypes = [P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, P, P]
for f in ("simncclWaitNs", "simncclLastCount", "simncclCollectives"):
    getattr(nc, f).restype = ctypes.c_uint64
    getattr(nc, f).argtypes = [P]
uid = Uid()
if rank == 0:
    assert nc.ncclGetUniqueId(ctypes.byref(uid)) == 0
    (rdzv / "uid.tmp").write_bytes(bytes(uid)); (rdzv / "uid.tmp").rename(rdzv / "uid")
else:
    while not (rdzv / "uid").exists():
        time.sleep(0.001)
    ctypes.memmove(ctypes.byref(uid), (rdzv / "uid").read_bytes(), 128)
comm = P()
assert nc.ncclCommInitRank(ctypes.byref(comm), 2, uid, rank) == 0
stream = P()
assert cu.cudaStreamCreate(ctypes.byref(stream)) == 0
late_returns = 0
for k in range(N):
    if rank == 1:
        while not (rdzv / f"in{k}").exists():  # rank 0 is in collective k
            time.sleep(0.001)
        time.sleep(DELAY)
        (rdzv / f"last{k}").touch()
    assert nc.ncclAllReduce(None, None, 1 << 20, 7, 0, comm, stream) == 0
    if rank == 0:
        (rdzv / f"in{k}").touch()
    assert cu.cudaStreamSynchronize(stream) == 0
    # rank 0's sync can only return once rank 1 has entered (it touched last{k} first)
    late_returns += rank == 0 and (rdzv / f"last{k}").exists()
print(json.dumps({"wait_ns": nc.simncclWaitNs(comm), "last": nc.simncclLastCount(comm),
                  "collectives": nc.simncclCollectives(comm), "synced_after_last": late_returns}))
assert nc.ncclCommDestroy(comm) == 0
"""


@pytest.mark.parametrize("policy", ["spin", "block"])
def test_an_all_reduce_waits_for_the_last_rank(tmp_path, policy):
    lib_dir = simcuda().parent
    env = {**os.environ, "SIMCUDA_SCHEDULE": policy}
    before = set(Path("/dev/shm").glob("simnccl-*"))
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(lib_dir), str(r), str(tmp_path), str(N), str(DELAY_MS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], [err for _, err in outs]
    r0, r1 = (json.loads(out) for out, _ in outs)
    assert r0["collectives"] == r1["collectives"] == N
    assert (r0["last"], r1["last"]) == (0, N)
    assert r0["synced_after_last"] == N
    assert r1["wait_ns"] == 0
    assert r0["wait_ns"] >= N * DELAY_MS * 1_000_000
    # the last rank out removed the shared segment
    assert set(Path("/dev/shm").glob("simnccl-*")) - before == set()


def test_every_probed_nccl_symbol_is_exported():
    lib = simcuda().parent / "libnccl.so.2"
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in out.stdout.splitlines()}
    wanted = {p.symbol for p in probes.CUDA_PROBES if p.library == probes.NCCL}
    assert wanted and wanted <= exported, sorted(wanted - exported)
    soname = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libnccl.so.2]" in soname
