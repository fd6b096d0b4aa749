"""Readable process names from a fake /proc tree and from this very process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ingero.collect.procnames import describe_pids, process_info, readable_name, split_cmdline


@pytest.mark.parametrize(
    "argv, comm, expected",
    [
        (["/usr/bin/python3", "train.py", "--epochs", "3"], "pt_main_thread", "python3 (train.py)"),
        (["python3.11", "-u", "/home/a/proj/train.py"], "python3.11", "python3.11 (train.py)"),
        (["python", "-X", "dev", "-W", "ignore", "run.py"], "python", "python (run.py)"),
        (["python3", "-m", "torch.distributed.run", "train.py"], "python3", "torchrun (train.py)"),
        (["python3", "-mhttp.server"], "python3", "python3 (-m http.server)"),
        (["python3", "-c", "import torch"], "python3", "python3 (-c)"),
        (["python3"], "python3", "python3"),
        (["/opt/venv/bin/pypy3", "bench.py"], "pypy3", "pypy3 (bench.py)"),
        (["node", "--require", "ts-node/register", "server.js"], "node", "node (server.js)"),
        (["java", "-Xmx4g", "-jar", "/opt/app/x.jar"], "java", "java (x.jar)"),
        (["java", "-cp", "a.jar:b.jar", "org.example.Main", "arg"], "java", "java (org.example.Main)"),
        (["bash", "script.sh"], "bash", "bash (script.sh)"),
        (["bash", "/dev/fd/3"], "bash", "bash (/dev/fd/3)"),
        (["/bin/sh", "-c", "sleep 1"], "sh", "sleep"),  # sh execs a simple command: it is the job
        (["/bin/sh", "-c", "sleep 1; true"], "sh", "sh (-c)"),
        (["stress-ng", "--cpu", "2"], "stress-ng", "stress-ng"),
        (["/usr/bin/gzip", "-9", "big.tar"], "gzip", "gzip"),
        ([], "kworker/0:1", "kworker/0:1"),
    ],
)
def test_readable_name(argv, comm, expected):
    assert readable_name(argv, comm) == expected


# The argv each stage of a launched job shows in /proc, and the name it gets.
PYENV = "/root/.pyenv"


@pytest.mark.parametrize(
    "argv, expected",
    [
        # pyenv shim: env runs the shim's bash, which execs `pyenv exec`, which execs pyenv-exec, then python
        (["/usr/bin/env", "bash", f"{PYENV}/shims/python3", "loop.py"], "python3 (loop.py)"),
        (["bash", f"{PYENV}/shims/python3", "loop.py", "--steps", "9"], "python3 (loop.py)"),
        (["bash", f"{PYENV}/libexec/pyenv", "exec", "python3", "loop.py"], "python3 (loop.py)"),
        (["bash", f"{PYENV}/libexec/pyenv-exec", "python3", "loop.py"], "python3 (loop.py)"),
        ([f"{PYENV}/versions/3.11.7/bin/python3", "loop.py"], "python3 (loop.py)"),
        # ... while the helpers it forks keep their own names
        (["bash", f"{PYENV}/libexec/pyenv-which", "python3"], "bash (pyenv-which)"),
        (["bash", f"{PYENV}/libexec/pyenv", "version-name"], "bash (pyenv)"),
        (["/usr/bin/basename", "python3"], "basename"),
        # conda run: a python process that spawns the job (through a bash script of its own)
        (["/opt/conda/bin/python", "/opt/conda/bin/conda", "run", "-n", "torch", "python", "train.py"],
         "conda run (train.py)"),
        (["/opt/conda/bin/python", "/opt/conda/bin/conda", "run", "--no-capture-output", "-p", "/envs/x",
          "python", "-m", "trainer"], "conda run (-m trainer)"),
        (["/bin/bash", "/tmp/tmpx7q_2l1"], "bash (tmpx7q_2l1)"),
        (["/opt/conda/envs/torch/bin/python", "train.py"], "python (train.py)"),
        # uv run: spawns the job
        (["uv", "run", "train.py"], "uv run (train.py)"),
        (["/root/.local/bin/uv", "run", "--with", "torch", "--python", "3.12", "python", "train.py"],
         "uv run (train.py)"),
        (["/proj/.venv/bin/python", "train.py"], "python (train.py)"),
        # bash -c: one simple command is exec'd (assignments and `exec` first are fine); a list is not
        (["bash", "-c", "python3 train.py --lr 0.1"], "python3 (train.py)"),
        (["bash", "-lc", "CUDA_VISIBLE_DEVICES=0 exec python3 train.py"], "python3 (train.py)"),
        (["bash", "-c", "python3 'a;b.py'"], "python3 (a;b.py)"),
        (["bash", "-c", "cd /proj && python3 train.py"], "bash (-c)"),
        (["bash", "-c", "python3 train.py | tee log"], "bash (-c)"),
        # env, nice, taskset, numactl (and their kin) exec the command
        (["env", "CUDA_VISIBLE_DEVICES=0", "-u", "HOME", "python3", "train.py"], "python3 (train.py)"),
        (["/usr/bin/env", "-S python3 -u", "train.py"], "python3 (train.py)"),  # a `#!/usr/bin/env -S` shebang
        (["nice", "-n", "10", "python3", "train.py"], "python3 (train.py)"),
        (["nice", "-5", "python3", "train.py"], "python3 (train.py)"),
        (["taskset", "-c", "0", "python3", "train.py"], "python3 (train.py)"),
        (["taskset", "0x3", "python3", "train.py"], "python3 (train.py)"),
        (["numactl", "--cpunodebind=0", "--membind=0", "python3", "train.py"], "python3 (train.py)"),
        (["numactl", "-N", "0", "-m0", "python3", "train.py"], "python3 (train.py)"),
        (["env", "nice", "taskset", "-c", "1", "numactl", "-C", "1", "python3", "-u", "train.py"],
         "python3 (train.py)"),
        (["chrt", "-f", "10", "ionice", "-c", "3", "nohup", "python3", "train.py"], "python3 (train.py)"),
        # acting on a running pid, or running nothing: the tool itself
        (["taskset", "-pc", "0", "1234"], "taskset"),
        (["numactl", "--hardware"], "numactl"),
        (["env"], "env"),
        # fork-and-wait tools stay the parent under their own name
        (["timeout", "60", "python3", "train.py"], "timeout"),
        # torchrun-style: the parent spawns `python -u train.py` workers
        (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py", "--epochs", "3"],
         "torchrun (train.py)"),
        (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc_per_node", "2", "--standalone", "train.py"],
         "torchrun (train.py)"),
        (["python3", "-m", "torch.distributed.run", "--nnodes", "1", "-m", "mypkg.train"], "torchrun (-m mypkg.train)"),
        (["/usr/bin/python3", "-u", "train.py", "--epochs", "3"], "python3 (train.py)"),
    ],
)
def test_launched_job_is_named_after_the_job(argv, expected):
    assert readable_name(argv, "comm") == expected


def test_a_loop_of_launchers_still_gets_a_name():
    assert readable_name(["env"] * 50, "env") == "env"


def test_split_cmdline_nul_separated_and_retitled():
    assert split_cmdline(b"python3\0train.py\0--lr\0\0") == ["python3", "train.py", "--lr"]
    assert split_cmdline(b"python3\0train.py\0") == ["python3", "train.py"]
    # setproctitle / stress-ng workers leave one space-separated string
    assert split_cmdline(b"stress-ng-cpu [run]\0") == ["stress-ng-cpu", "[run]"]
    assert split_cmdline(b"") == []
    assert split_cmdline(b"caf\xe9\0x") == ["caf\ufffd", "x"]


def _fake_proc(root: Path, pid: int, comm: str, cmdline: bytes) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(cmdline)
    (d / "stat").write_text(f"{pid} ({comm}) S 4000 {pid} {pid} 0 -1\n")


def test_process_info_from_fake_proc(tmp_path):
    _fake_proc(tmp_path, 4242, "pt_main_thread", b"/usr/bin/python3\0train.py\0--bs\x0064\x00")
    _fake_proc(tmp_path, 7, "gzip", b"gzip\0-9\0")
    info = process_info(4242, proc=tmp_path)
    assert info == {
        "pid": 4242,
        "name": "python3 (train.py)",
        "comm": "pt_main_thread",
        "cmdline": "/usr/bin/python3 train.py --bs 64",
        "ppid": 4000,
    }
    assert process_info(99999, proc=tmp_path) is None
    rows = describe_pids([7, 99999, 4242, 7], proc=tmp_path)
    assert [(r["pid"], r["name"]) for r in rows] == [(7, "gzip"), (4242, "python3 (train.py)")]


def test_process_info_of_this_process():
    info = process_info(os.getpid())
    assert info is not None
    assert info["pid"] == os.getpid()
    # the kernel's view of our argv is sys.orig_argv: "python -m pytest ..." or "python .../pytest ..."
    assert info["name"] == readable_name(sys.orig_argv, info["comm"])
    assert info["name"].startswith(os.path.basename(sys.orig_argv[0]) + " (")
    assert info["cmdline"] == " ".join(sys.orig_argv)


def test_gone_pid_is_none():
    # pid_max is at most 4194304, so this pid cannot exist
    assert process_info(4194305) is None
