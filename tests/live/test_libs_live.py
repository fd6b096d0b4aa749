"""LibraryWatcher against real processes loading NVIDIA's real libcudart.

Each child loads a COPY of the wheel's libcudart.so.12 from a place no static
search knows, so only /proc/PID/maps can reveal it.  Marked live: it reads
other processes' maps and the container case needs root to unshare a mount
namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prereqs import needs_nvidia_libcudart

from ingero.collect.libs import RUNTIME, LibraryWatcher, pids_mapping_cuda

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

# The child: dlopen the given library when told to (a line on stdin), say so, then wait for EOF.
CHILD = textwrap.dedent(
    """
    import ctypes, sys
    sys.stdin.readline()
    ctypes.CDLL(sys.argv[1])
    print("loaded", flush=True)
    sys.stdin.read()
    """
)


def _wheel_libcudart() -> Path:
    return needs_nvidia_libcudart()


class Child:
    def __init__(self, argv: list[str]):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def load(self) -> None:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        assert line == "loaded\n", f"child failed to load the library (exit {self.p.poll()})"

    def stop(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=10)


@pytest.fixture
def copy_dir(tmp_path) -> Path:
    d = tmp_path / "hidden-cuda"
    d.mkdir()
    shutil.copy(_wheel_libcudart(), d / "libcudart.so.12")
    return d


def test_new_process_loading_a_private_copy_is_found_in_one_poll(copy_dir):
    watcher = LibraryWatcher()
    first = watcher.poll()
    assert copy_dir / "libcudart.so.12" not in {lib.path for lib in first}
    child = Child([sys.executable, "-c", CHILD, str(copy_dir / "libcudart.so.12")])
    try:
        child.load()
        new = watcher.poll()
        assert [lib.path for lib in new] == [copy_dir / "libcudart.so.12"]
        assert new[0].kind == RUNTIME
        assert "cudaLaunchKernel_ptsz" in new[0].variants("cudaLaunchKernel")
        assert watcher.poll() == []
        assert [lib.path for lib in pids_mapping_cuda()[child.p.pid]] == [copy_dir / "libcudart.so.12"]
    finally:
        child.stop()


def test_process_seen_before_it_loads_cuda_is_read_again(copy_dir):
    child = Child([sys.executable, "-c", CHILD, str(copy_dir / "libcudart.so.12")])
    try:
        watcher = LibraryWatcher()
        watcher.poll()  # the child is running but has not loaded anything yet
        assert watcher.poll() == []
        child.load()  # the dlopen adds mappings: its virtual size changes
        assert [lib.path for lib in watcher.poll()] == [copy_dir / "libcudart.so.12"]
    finally:
        child.stop()


def test_copy_only_visible_inside_another_mount_namespace(tmp_path):
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed for the mount-namespace case")
    private = tmp_path / "private"
    private.mkdir()
    src = _wheel_libcudart()
    # In a new mount namespace, a tmpfs over `private` holds the copy: the host sees an empty directory.
    script = (
        f"mount -t tmpfs ingero-test {private} && cp {src} {private}/libcudart.so.12 && "
        f"exec {sys.executable} -c '{CHILD}' {private}/libcudart.so.12"
    )
    child = Child(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    try:
        child.load()
        assert not (private / "libcudart.so.12").exists()
        watcher = LibraryWatcher()
        found = [lib for lib in watcher.poll() if str(lib.path).startswith(f"/proc/{child.p.pid}/")]
        assert [lib.path for lib in found] == [
            Path(f"/proc/{child.p.pid}/root") / str(private).lstrip("/") / "libcudart.so.12"]
        assert os.stat(found[0].path).st_size == src.stat().st_size
    finally:
        child.stop()
