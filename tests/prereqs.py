"""What a test needs and does not find: skipped locally, failed under CI.

One rule for every prerequisite (the NVIDIA runtime wheel, a C compiler, the
built simulated runtime, another interpreter): a developer's box without it
skips with the fix in the reason; under CI (env CI set) the test fails, so
a CI machine missing a piece never passes quietly.  tests/conftest.py puts
this directory on sys.path (pytest's rootdir conftest), so any test imports
it as ``prereqs``.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]


def under_ci() -> bool:
    return bool(os.environ.get("CI"))


def missing(what: str, fix: str) -> NoReturn:
    """A test cannot run without ``what``: skip locally with ``fix``, fail under CI."""
    message = f"needs {what} ({fix})"
    if under_ci():
        pytest.fail(f"CI requires every test to run: {message}", pytrace=False)
    pytest.skip(message)


def needs(value, what: str, fix: str):
    """``value`` if it is set; otherwise ``missing(what, fix)``."""
    if not value:
        missing(what, fix)
    return value


def nvidia_libcudart() -> Path | None:
    """NVIDIA's libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel, if installed."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations if spec else []:
        for p in sorted(Path(base, "cuda_runtime", "lib").glob("libcudart.so.*")):
            return p.resolve()  # the path the maps show (a venv may sit behind a symlink)
    return None


def needs_nvidia_libcudart() -> Path:
    """The wheel's libcudart (make setup installs it with the `test` extra)."""
    return needs(nvidia_libcudart(), "NVIDIA's libcudart.so.12",
                 "pip install nvidia-cuda-runtime-cu12, or make setup")


def nvidia_libnccl() -> Path | None:
    """NVIDIA's libnccl.so.2 from the nvidia-nccl-cu12 wheel, if installed."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations if spec else []:
        lib = Path(base, "nccl", "lib", "libnccl.so.2")
        if lib.exists():
            return lib.resolve()
    return None


def needs_nvidia_libnccl() -> Path:
    """The wheel's libnccl (make setup installs it with the `test` extra)."""
    return needs(nvidia_libnccl(), "NVIDIA's libnccl.so.2", "pip install nvidia-nccl-cu12, or make setup")


@functools.lru_cache(maxsize=1)
def _build_simcuda() -> tuple[Path | None, str]:
    proc = subprocess.run(["make", "-C", str(REPO / "demos")], capture_output=True, text=True)
    lib = REPO / "demos" / "build" / "libcudart.so.12"
    if proc.returncode != 0 or not lib.exists():
        return None, (proc.stderr.strip().splitlines() or ["make failed"])[-1]
    return lib, ""


def needs_simcuda() -> Path:
    """The simulated CUDA runtime (demos/build/libcudart.so.12), built once per run."""
    lib, err = _build_simcuda()
    return needs(lib, "the simulated CUDA runtime", f"make -C demos: {err}")


def needs_nvtx_package() -> None:
    """NVIDIA's Python nvtx package (make setup installs it with the `test` extra)."""
    import importlib.util

    needs(importlib.util.find_spec("nvtx"), "NVIDIA's Python nvtx package", "pip install nvtx, or make setup")


def needs_nvtx_headers() -> Path:
    """The include directory holding nvtx3/nvToolsExt.h: the newest CUDA toolkit's (/usr/local/cuda*)."""
    import glob

    found = sorted(glob.glob("/usr/local/cuda*/include/nvtx3/nvToolsExt.h"))
    return needs(Path(found[-1]).parents[1] if found else None, "NVTX3's headers (nvtx3/nvToolsExt.h)",
                  "install the CUDA toolkit (/usr/local/cuda*/include)")


def needs_libnvtoolsext() -> Path:
    """NVIDIA's legacy libnvToolsExt.so.1 from the nvidia-nvtx-cu12 12.1 wheel (make setup: the `test` extra)."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    found = [Path(b, "nvtx", "lib", "libnvToolsExt.so.1") for b in (spec.submodule_search_locations if spec else [])]
    return needs(next((p.resolve() for p in found if p.exists()), None), "NVIDIA's libnvToolsExt.so.1",
                 "pip install nvidia-nvtx-cu12==12.1.105, or make setup")
