"""Shared test policy.

Tests marked ``live`` need root and a working eBPF stack.  Locally they skip
with the reason; when ``CI`` is set a missing capability fails the test, so
a CI machine that cannot load BPF never passes quietly.
"""

from __future__ import annotations

import functools
import os

import pytest


@functools.lru_cache(maxsize=1)
def ebpf_unavailable() -> str | None:
    """Why live tests cannot run here, or None when they can (root + BCC + a BPF program loads)."""
    if os.geteuid() != 0:
        return "needs root (eBPF)"
    try:
        import bcc  # noqa: F401
    except ImportError as exc:
        return f"BCC not importable ({exc}); run `make setup`"
    try:
        from ingero.collect.kheaders import ensure_tracefs, find_kernel_headers

        ensure_tracefs()
        find_kernel_headers().export()
        from bcc import BPF

        BPF(text=b"int probe(void *ctx) { return 0; }").load_func("probe", BPF.SOCKET_FILTER)
    except Exception as exc:  # any failure to load a trivial program means no eBPF here
        return f"cannot load a BPF program: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("live") for item in items):
        return
    reason = ebpf_unavailable()
    if reason is None:
        return
    for item in items:
        # Under CI the autouse fixture below fails these instead.
        if item.get_closest_marker("live") and not os.environ.get("CI"):
            item.add_marker(pytest.mark.skip(reason=f"live test skipped: {reason}"))


@pytest.fixture(autouse=True)
def _fail_live_without_ebpf(request: pytest.FixtureRequest) -> None:
    """Under CI a live test on a machine without eBPF fails with the reason."""
    if request.node.get_closest_marker("live") and os.environ.get("CI"):
        reason = ebpf_unavailable()
        if reason is not None:
            pytest.fail(f"CI requires eBPF for live tests: {reason}", pytrace=False)
