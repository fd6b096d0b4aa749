"""Fixtures shared by the live tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import workloads


@pytest.fixture(scope="session")
def simcuda() -> Path:
    """The simulated CUDA runtime (demos/build/libcudart.so.12), built once per run."""
    return workloads.simcuda()
