"""Find kernel headers for BCC, or build a private merged tree of Debian's.

BCC compiles its programs against kernel headers.  In order of preference:
the running kernel's own build tree, the in-kernel /sys/kernel/kheaders.tar.xz,
and else the newest installed Debian ``linux-headers-*-<arch>`` tree merged
with its ``-common`` tree into a private directory (Debian splits them; BCC
needs one tree).  Nothing under /lib/modules is touched.  The result is passed
to BCC through BCC_KERNEL_SOURCE.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ingero.errors import IngeroError

# Where merged trees are built: root's cache, else the user's.
CACHE_ROOT = Path("/var/cache/ingero") if os.geteuid() == 0 else Path.home() / ".cache" / "ingero"
_DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el", "s390x": "s390x"}
_MARKER = ".ingero-merged"


@dataclass(frozen=True)
class KernelHeaders:
    path: Path
    how: str  # one line for the user: which headers and where they came from

    def export(self) -> None:
        """Make BCC use these headers (it reads BCC_KERNEL_SOURCE when compiling)."""
        os.environ["BCC_KERNEL_SOURCE"] = str(self.path)


def _usable(tree: Path) -> bool:
    return (tree / "include" / "linux").is_dir() and (tree / "arch").is_dir()


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", name))


def debian_header_trees(src: Path = Path("/usr/src"), machine: str | None = None) -> list[tuple[Path, Path]]:
    """(arch tree, common tree) pairs of installed Debian linux-headers, newest first."""
    arch = _DEBIAN_ARCH.get(machine or platform.machine(), "amd64")
    pairs = []
    for tree in src.glob(f"linux-headers-*-{arch}"):
        version = tree.name[len("linux-headers-") : -len(f"-{arch}")]
        common = src / f"linux-headers-{version}-common"
        if common.is_dir() and tree.is_dir():
            pairs.append((tree, common))
    return sorted(pairs, key=lambda p: _version_key(p[0].name), reverse=True)


def _link_tree(src: Path, dst: Path) -> None:
    """Mirror src into dst with hard links (no copy of 80 MB); later calls overwrite earlier files."""
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        out = dst / rel
        out.mkdir(parents=True, exist_ok=True)
        for name in dirs + files:
            s = Path(root) / name
            d = out / name
            if s.is_symlink():
                target = os.path.realpath(s)  # Debian's relative links break when moved
                if d.is_symlink() or d.is_file():
                    d.unlink()
                if not d.exists():
                    d.symlink_to(target)
                continue
            if name in dirs:
                continue
            if d.exists() or d.is_symlink():
                d.unlink()
            try:
                os.link(s, d)
            except OSError:
                shutil.copy2(s, d)


def merge_debian_tree(arch_tree: Path, common_tree: Path, cache: Path = CACHE_ROOT) -> Path:
    """Build (once) cache/kheaders/<arch tree name> = common tree overlaid with the arch tree."""
    dst = cache / "kheaders" / arch_tree.name
    if (dst / _MARKER).exists():
        return dst
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    _link_tree(common_tree, tmp)
    _link_tree(arch_tree, tmp)
    (tmp / _MARKER).write_text(f"{common_tree}\n{arch_tree}\n")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


def _from_kheaders_tarball(release: str, cache: Path) -> Path | None:
    tarball = Path("/sys/kernel/kheaders.tar.xz")
    if not tarball.exists():
        return None
    dst = cache / "kheaders" / f"kheaders-{release}"
    if not (dst / _MARKER).exists():
        dst.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball) as tar:
            tar.extractall(dst, filter="data")
        (dst / _MARKER).write_text(f"{tarball}\n")
    return dst


def find_kernel_headers(*, build: bool = True, cache: Path = CACHE_ROOT) -> KernelHeaders:
    """The headers BCC should use, building the merged Debian tree when needed.

    With build=False only reports what would be used (for `ingero check`).
    """
    release = platform.release()
    env = os.environ.get("BCC_KERNEL_SOURCE")
    if env and _usable(Path(env)):
        return KernelHeaders(Path(env), f"kernel headers: {env} (from BCC_KERNEL_SOURCE)")
    for tree in (Path(f"/lib/modules/{release}/build"), Path(f"/lib/modules/{release}/source")):
        if _usable(tree):
            return KernelHeaders(tree, f"kernel headers: {tree} (the running kernel's own)")
    if build:
        try:
            kh = _from_kheaders_tarball(release, cache)
        except (OSError, tarfile.TarError):
            kh = None
        if kh is not None and _usable(kh):
            return KernelHeaders(kh, f"kernel headers: {kh} (from /sys/kernel/kheaders.tar.xz)")
    elif Path("/sys/kernel/kheaders.tar.xz").exists():
        return KernelHeaders(Path("/sys/kernel/kheaders.tar.xz"), "kernel headers: /sys/kernel/kheaders.tar.xz")
    pairs = debian_header_trees()
    if pairs:
        arch_tree, common = pairs[0]
        if not build:
            return KernelHeaders(arch_tree, f"kernel headers: {arch_tree.name} + -common (Debian, merged privately)")
        try:
            merged = merge_debian_tree(arch_tree, common, cache)
        except OSError as exc:
            raise IngeroError(
                f"cannot build the merged kernel header tree under {cache}: {exc}",
                "run as root, or set BCC_KERNEL_SOURCE to a kernel header tree",
            ) from None
        return KernelHeaders(
            merged,
            f"kernel headers: {arch_tree.name} + {common.name} merged into {merged} "
            f"(no headers for the running kernel {release})",
        )
    raise IngeroError(
        f"no kernel headers for {release}",
        f"install them: apt-get install linux-headers-{_DEBIAN_ARCH.get(platform.machine(), 'amd64')} "
        "(or `make setup`)",
    )


def ensure_tracefs() -> str | None:
    """Mount tracefs/debugfs where BCC looks for tracepoint formats; returns what was done, if anything."""
    done = []
    for fstype, where in (("tracefs", "/sys/kernel/tracing"), ("debugfs", "/sys/kernel/debug")):
        probe = Path(where) / ("events" if fstype == "tracefs" else "tracing")
        if probe.exists():
            continue
        result = subprocess.run(["mount", "-t", fstype, fstype, where], capture_output=True, text=True)
        if result.returncode != 0:
            raise IngeroError(
                f"cannot mount {fstype} at {where}: {result.stderr.strip() or result.returncode}",
                "eBPF tracepoints need it: run as root on a kernel with tracefs",
            )
        done.append(f"mounted {fstype} at {where}")
    return "; ".join(done) or None
