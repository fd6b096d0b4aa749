import os

from ingero.sample import memory
from ingero.store.db import Store

import pyarrow as pa


def test_top_processes_include_a_big_allocation_and_extra_pids() -> None:
    hog = bytearray(300 * 2**20)  # 300 MiB resident in this test process
    for i in range(0, len(hog), 4096):
        hog[i] = 1
    rows = memory.sample({1}, top_n=3)
    me = [r for r in rows if r["pid"] == os.getpid()]
    assert me and me[0]["rss_bytes"] >= 300 * 2**20
    assert any(r["pid"] == 1 for r in rows)  # an extra pid is kept even when small
    assert len([r for r in rows if r["pid"] != 1]) <= 3
    s = Store.memory()
    s.append("process_memory", pa.Table.from_pylist([{**r, "session_id": 1} for r in rows]))
    assert s.con.execute("SELECT count(*) FROM process_memory").fetchone()[0] == len(rows)
    del hog


def test_ppid_is_recorded() -> None:
    from ingero.collect.procnames import process_info

    info = process_info(os.getpid())
    assert info is not None and info["ppid"] == os.getppid()
    s = Store.memory()
    s.upsert_process_names([{**info, "session_id": 1, "seen_ns": 5}])
    s.upsert_process_names([{"pid": info["pid"], "name": "x", "comm": "x", "cmdline": "", "session_id": 2,
                             "seen_ns": 6}])
    assert s.con.execute("SELECT ppid, name FROM process_names").fetchone() == (os.getppid(), "x")
