"""The NVTX injection library (nvtx_inject.c): built once per source, and named to --cmd.

NVTX3 is header-only: a process's NVTX ranges go nowhere unless it loads an
injection library named by NVTX_INJECTION64_PATH (how Nsight Systems sees
them).  ``ingero trace --cmd`` builds ingero's from the C source shipped
beside this module with the system compiler, into a cache directory keyed by
the hash of the source and flags (rebuilt only when either changes), and
sets the variable in the command's environment.  ``--pid`` / ``--comm``
cannot: a running process read its environment long ago.

The cache is world-readable (the command may run as the invoking user, not
root), and a build lands under its final name by rename only, so a
half-written file is never loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ingero.collect.kheaders import CACHE_ROOT
from ingero.errors import IngeroError

ENV = "NVTX_INJECTION64_PATH"
SOURCE = Path(__file__).with_name("nvtx_inject.c")
LIB_NAME = "libingero_nvtx.so"
CFLAGS = ("-O2", "-g", "-std=gnu11", "-fPIC", "-fvisibility=hidden", "-shared", "-Wall")
# The functions bpf/nvtx.bpf.c probes (probes.py NVTX_PROBES names them too).
PROBED = ("ingero_nvtx_push", "ingero_nvtx_pop", "ingero_nvtx_start", "ingero_nvtx_end")


def compiler() -> str | None:
    """$CC when set (its first word), else cc on PATH."""
    cc = os.environ.get("CC", "").split()
    return shutil.which(cc[0]) if cc else shutil.which("cc")


def library(cache: Path = CACHE_ROOT, source: Path = SOURCE) -> Path:
    """The built library's path, building it first if this source was never built here.

    IngeroError (one line, exit 2) when there is no compiler or the build fails."""
    text = source.read_bytes()
    key = hashlib.sha256(text + "\0".join(CFLAGS).encode()).hexdigest()[:16]
    out = cache / "nvtx" / key / LIB_NAME
    if out.exists():
        return out
    cc = compiler()
    if cc is None:
        raise IngeroError("NVTX ranges need a C compiler to build ingero's injection library, and none was found "
                          "(cc, or $CC)", "install one (apt-get install gcc), or pass --no-nvtx")
    out.parent.mkdir(parents=True, exist_ok=True)
    # readable by the command when it runs as the invoking user (sudo): dirs 0755, the library 0644
    for d in (cache, cache / "nvtx", out.parent):
        os.chmod(d, 0o755)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        res = subprocess.run([cc, *CFLAGS, "-o", tmp, str(source)], capture_output=True, text=True)
        if res.returncode != 0:
            first = next((ln for ln in res.stderr.splitlines() if "error" in ln), res.stderr.strip()[:200])
            raise IngeroError(f"building the NVTX injection library ({source}) with {cc} failed: {first}",
                              "check the compiler, or pass --no-nvtx")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def command_env(lib: Path, environ: dict[str, str] | None = None) -> tuple[dict[str, str] | None, str | None]:
    """(the --cmd's environment with NVTX_INJECTION64_PATH set, None) or, when the user set it
    already, (None: the environment as it is, a note saying ingero does not see its ranges)."""
    env = dict(os.environ if environ is None else environ)
    mine = env.get(ENV)
    if mine and Path(mine) != lib:
        return None, (f"{ENV} is already set ({mine}): the command's NVTX ranges go to that tool, "
                      "not to ingero's spans")
    env[ENV] = str(lib)
    return env, None
