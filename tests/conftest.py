"""Shared test policy.

Tests marked ``live`` need root and a working eBPF stack.  Locally they skip
with the reason; when ``CI`` is set a missing capability fails the test, so
a CI machine that cannot load BPF never passes quietly.

Any other prerequisite goes through tests/prereqs.py: the same rule, one place.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from prereqs import needs_simcuda, under_ci


@pytest.fixture(scope="session")
def simcuda() -> Path:
    """The simulated CUDA runtime (demos/build/libcudart.so.12), built once per run."""
    return needs_simcuda()


@functools.lru_cache(maxsize=1)
def ebpf_unavailable() -> str | None:
    """Why live tests cannot run here, or None when they can.

    The same proof `ingero check` uses: as root, a sched_switch program is
    compiled against the headers ingero finds, loaded and attached.
    """
    from ingero.check import check_bpf_load

    result = check_bpf_load()
    return None if result.ok else f"{result.detail} ({result.fix})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("live") for item in items):
        return
    reason = ebpf_unavailable()
    if reason is None:
        return
    for item in items:
        # Under CI the autouse fixture below fails these instead.
        if item.get_closest_marker("live") and not under_ci():
            item.add_marker(pytest.mark.skip(reason=f"live test skipped: {reason}"))


@pytest.fixture(autouse=True)
def _fail_live_without_ebpf(request: pytest.FixtureRequest) -> None:
    """Under CI a live test on a machine without eBPF fails with the reason."""
    if request.node.get_closest_marker("live") and under_ci():
        reason = ebpf_unavailable()
        if reason is not None:
            pytest.fail(f"CI requires eBPF for live tests: {reason}", pytrace=False)


@pytest.fixture()
def raw_request():
    """send(socket_path, body) -> the one reply: raw bytes framed as one message, for probing
    the tracer's query server with what its own client never sends (NaN, deep nesting, junk)."""
    import socket
    import struct

    from ingero.daemon import protocol

    def send(sock_path, body: bytes) -> dict:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(120)
        s.connect(str(sock_path))
        try:
            try:
                s.sendall(struct.pack(">I", len(body)) + body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # answered early (busy) and closed: the answer is still there to read
            reply = protocol.recv(s, protocol.MAX_RESPONSE_BYTES)
            try:  # exactly one reply, then the connection closes
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
            return reply
        finally:
            s.close()

    return send


@pytest.fixture()
def short_dir():
    """A fresh directory under /tmp with a short path: a Unix socket's path is limited to 107 bytes
    and pytest's tmp_path can be longer.  World-readable (other users may look in: the socket's and
    the DB's own modes are what tests check)."""
    d = Path(tempfile.mkdtemp(prefix="ing-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
