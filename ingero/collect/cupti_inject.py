"""The CUPTI injection library (cupti_inject.c): built once per source and CUPTI headers, named to --cmd.

The CUDA driver loads the library CUDA_INJECTION64_PATH names at cuInit and
calls its InitializeInjection: ``ingero trace --cmd`` builds ingero's from the
C source beside this module, against NVIDIA's CUPTI headers (a CUDA
toolkit's, or the nvidia-cuda-cupti wheel's), into a cache directory keyed by
the source, the ring header, the flags and the headers (rebuilt only when one
changes), and sets the variable, with INGERO_CUPTI_DIR (where the rings go)
and INGERO_CUPTI_LIB (a libcupti for a process that loads none itself), in
the command's environment.  libcupti itself is loaded at run time by the
library: nothing of CUPTI is linked in.

The device timeline is a bonus on top of the trace: without headers or a
compiler there is none (one line says so and how to get it), never an error.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ingero.collect.kheaders import CACHE_ROOT
from ingero.collect.nvtx_inject import compiler

ENV = "CUDA_INJECTION64_PATH"
DIR_ENV = "INGERO_CUPTI_DIR"
LIB_ENV = "INGERO_CUPTI_LIB"
INCLUDE_ENV = "INGERO_CUPTI_INCLUDE"
# A library built elsewhere (scripts/gpu-check-prepare.sh ships one to machines without a compiler
# or CUPTI headers): used as it is.
PREBUILT_ENV = "INGERO_CUPTI_INJECTION"
SOURCE = Path(__file__).with_name("cupti_inject.c")
RING_HEADER = Path(__file__).with_name("cupti_ring.h")
LIB_NAME = "libingero_cupti.so"
CFLAGS = ("-O2", "-g", "-std=gnu11", "-fPIC", "-fvisibility=hidden", "-shared", "-Wall", "-pthread")
LDFLAGS = ("-ldl",)


@dataclass(frozen=True)
class Built:
    """The library (None: not built) and, when not, why, in one line."""

    path: Path | None
    why_not: str | None = None


def header_dirs() -> list[Path]:
    """Where NVIDIA's cupti.h may be, in order: $INGERO_CUPTI_INCLUDE, CUDA toolkits, the wheels."""
    out: list[Path] = []
    mine = os.environ.get(INCLUDE_ENV)
    if mine:
        out.append(Path(mine))
    for pattern in ("/usr/local/cuda/extras/CUPTI/include", "/usr/local/cuda/include",
                    "/usr/local/cuda-*/extras/CUPTI/include", "/usr/local/cuda-*/include",
                    "/opt/cuda/extras/CUPTI/include"):
        out += [Path(p) for p in sorted(glob.glob(pattern), reverse=True)]
    for site in sys.path:
        out += [Path(p) for p in sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include")), reverse=True)]
        out.append(Path(site) / "nvidia" / "cuda_cupti" / "include")
    out.append(Path("/usr/include"))
    return out


def find_headers() -> Path | None:
    """The first directory holding cupti.h and cupti_activity.h."""
    for d in header_dirs():
        if (d / "cupti.h").is_file() and (d / "cupti_activity.h").is_file():
            return d
    return None


def library(cache: Path = CACHE_ROOT, source: Path = SOURCE, include: Path | None = None) -> Built:
    """The built library, building it first if this source and these headers were never built here
    ($INGERO_CUPTI_INJECTION: that one, built elsewhere)."""
    prebuilt = os.environ.get(PREBUILT_ENV)
    if prebuilt:
        if Path(prebuilt).is_file():
            return Built(Path(prebuilt))
        return Built(None, f"{PREBUILT_ENV}={prebuilt}: no such file")
    include = include or find_headers()
    if include is None:
        return Built(None, "no CUPTI headers found (a CUDA toolkit's cupti.h, or pip install nvidia-cuda-cupti-cu12; "
                           f"{INCLUDE_ENV}=DIR names them)")
    h = hashlib.sha256(source.read_bytes() + RING_HEADER.read_bytes() + "\0".join(CFLAGS).encode())
    for name in ("cupti_activity.h", "cupti_version.h"):
        try:
            h.update((include / name).read_bytes())
        except OSError:
            pass
    out = cache / "cupti" / h.hexdigest()[:16] / LIB_NAME
    if out.exists():
        return Built(out)
    cc = compiler()
    if cc is None:
        return Built(None, "no C compiler to build ingero's CUPTI injection library (cc, or $CC)")
    out.parent.mkdir(parents=True, exist_ok=True)
    # readable by the command when it runs as the invoking user (sudo): dirs 0755, the library 0644
    for d in (cache, cache / "cupti", out.parent):
        os.chmod(d, 0o755)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        res = subprocess.run([cc, *CFLAGS, f"-I{include}", f"-I{RING_HEADER.parent}", "-o", tmp, str(source), *LDFLAGS],
                             capture_output=True, text=True)
        if res.returncode != 0:
            first = next((ln for ln in res.stderr.splitlines() if "error" in ln), res.stderr.strip()[:200])
            return Built(None, f"building the CUPTI injection library against {include} failed: {first}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return Built(out)


def find_libcupti(cuda_libs: list[Path]) -> Path | None:
    """A libcupti for a process that loads none itself: beside the CUDA runtime it uses
    (a toolkit's lib dir, the pip wheels' nvidia/cuda_cupti/lib), else the toolkits'."""
    dirs: list[Path] = []
    for lib in cuda_libs:
        d = Path(lib).resolve().parent
        dirs += [d, d.parent.parent / "cuda_cupti" / "lib", d.parent / "extras" / "CUPTI" / "lib64"]
    for pattern in ("/usr/local/cuda/extras/CUPTI/lib64", "/usr/local/cuda/lib64", "/usr/local/cuda/lib",
                    "/usr/local/cuda-*/extras/CUPTI/lib64", "/usr/local/cuda-*/lib64", "/usr/local/cuda-*/lib",
                    "/usr/lib/x86_64-linux-gnu"):
        dirs += [Path(p) for p in sorted(glob.glob(pattern), reverse=True)]
    for d in dirs:
        found = sorted(glob.glob(str(d / "libcupti.so*")), key=lambda p: (len(p), p))
        if found:
            return Path(found[0])
    return None


def command_env(lib: Path, ring_dir: Path, libcupti: Path | None,
                environ: dict[str, str] | None = None) -> tuple[dict[str, str] | None, str | None]:
    """(the --cmd's environment with the injection set, None) or, when CUDA_INJECTION64_PATH is set
    already (another tool's), (None: the environment as it is, a note saying so)."""
    env = dict(os.environ if environ is None else environ)
    mine = env.get(ENV)
    if mine and Path(mine) != lib:
        return None, (f"{ENV} is already set ({mine}): the device's timeline goes to that tool, not to "
                      "ingero (inferred from the calls instead)")
    env[ENV] = str(lib)
    env[DIR_ENV] = str(ring_dir)
    if libcupti is not None and not env.get(LIB_ENV):
        env[LIB_ENV] = str(libcupti)
    return env, None
