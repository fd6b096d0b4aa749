"""prelaunch.py: the programs a --cmd execs in turn, and the link map ld.so will load for the last one.

Programs and libraries are built here with the system C compiler, with the
RPATH / RUNPATH / LD_LIBRARY_PATH combinations whose order ld.so defines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ingero.collect import prelaunch


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed (make setup installs gcc)")
    return cc


def _lib(out: Path, soname: str, *link: str) -> Path:
    src = out.parent / f"{soname}.c"
    src.write_text(f"int f_{abs(hash(soname)) % 100000}(void) {{ return 1; }}\n")
    subprocess.run([_cc(), "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(src), "-Wl,--no-as-needed",
                    *link], check=True)
    return out


def _exe(out: Path, *link: str) -> Path:
    src = out.parent / "main.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run([_cc(), "-o", str(out), str(src), "-Wl,--no-as-needed", *link], check=True)
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, Path]:
    """prog -> liba (RUNPATH a/), liba -> libb and libcudart.so.12 (RUNPATH $ORIGIN); old: the same with DT_RPATH."""
    root = tmp_path_factory.mktemp("prelaunch")
    a, other = root / "a", root / "other"
    a.mkdir()
    other.mkdir()
    b = _lib(a / "libb.so", "libb.so")
    _lib(other / "libb.so", "libb.so")  # a second copy, found through LD_LIBRARY_PATH
    cudart = _lib(a / "libcudart.so.12", "libcudart.so.12")
    liba = _lib(a / "liba.so", "liba.so", f"-L{a}", "-l:libb.so", "-l:libcudart.so.12", "-Wl,-rpath,$ORIGIN",
                "-Wl,--enable-new-dtags")
    prog = _exe(root / "prog", f"-L{a}", "-l:liba.so", f"-Wl,-rpath,{a}", "-Wl,--enable-new-dtags")
    old_a = root / "old"
    old_a.mkdir()
    _lib(old_a / "libb.so", "libb.so")
    _lib(old_a / "libcudart.so.12", "libcudart.so.12")
    _lib(old_a / "liba.so", "liba.so", f"-L{old_a}", "-l:libb.so", "-l:libcudart.so.12")
    old = _exe(root / "oldprog", f"-L{old_a}", "-l:liba.so", f"-Wl,-rpath,{old_a}", "-Wl,--disable-new-dtags")
    return {"root": root, "a": a, "other": other, "b": b, "cudart": cudart, "liba": liba, "prog": prog,
            "old_a": old_a, "old": old}


def _ours(tree, got: list[Path]) -> list[Path]:
    return [p for p in got if tree["root"] in p.parents]


def test_runpath_origin_and_ld_library_path_resolve_as_ld_so_does(tree) -> None:
    got = prelaunch.link_map(tree["prog"], {}, cache={})
    a = tree["a"]
    assert _ours(tree, got) == [a / "liba.so", a / "libb.so", a / "libcudart.so.12"]  # breadth first
    assert any(p.name == "libc.so.6" for p in got)  # from the system directories
    # LD_LIBRARY_PATH comes before DT_RUNPATH: libb from there, the rest where RUNPATH points
    got = prelaunch.link_map(tree["prog"], {"LD_LIBRARY_PATH": str(tree["other"])}, cache={})
    assert _ours(tree, got) == [a / "liba.so", tree["other"] / "libb.so", a / "libcudart.so.12"]


def test_dt_rpath_comes_before_ld_library_path_and_is_inherited(tree) -> None:
    old_a = tree["old_a"]
    got = prelaunch.link_map(tree["old"], {"LD_LIBRARY_PATH": str(tree["other"])}, cache={})
    # liba has no path of its own: the program's DT_RPATH serves its needs too, before LD_LIBRARY_PATH
    assert _ours(tree, got) == [old_a / "liba.so", old_a / "libb.so", old_a / "libcudart.so.12"]


def test_the_ld_so_cache_is_asked_before_the_system_directories(tree) -> None:
    got = prelaunch.link_map(tree["prog"], {}, cache={"libc.so.6": str(tree["b"])})
    assert tree["b"] in got and not any(p.name == "libc.so.6" for p in got)


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_programs_follow_path_wrappers_shells_and_shebangs(tree, tmp_path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    k = shutil.copy(tree["prog"], bin_dir / "k")
    py = shutil.copy(tree["prog"], bin_dir / "python3")
    script = _script(tmp_path / "train.py", "#!/usr/bin/env python3\nprint(1)\n")
    run = _script(tmp_path / "run.sh", "#!/bin/sh -e\nexec ./k\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    which = {n: Path(shutil.which(n, path=env["PATH"])) for n in ("env", "nice", "sh")}
    cwd = str(tmp_path)
    assert prelaunch.programs(["k", "700"], env, cwd) == [Path(k)]
    assert prelaunch.programs(["env", "A=1", "nice", "-n", "5", "k"], env, cwd) == [
        which["env"], which["nice"], Path(k)]
    assert prelaunch.programs(["sh", "-c", "exec k 700"], env, cwd) == [which["sh"], Path(k)]
    assert prelaunch.programs(["sh", "-c", "k 700; true"], env, cwd) == [which["sh"]]  # more than one command
    assert prelaunch.programs(["./train.py", "--steps", "3"], env, cwd) == [script, Path("/usr/bin/env"), Path(py)]
    assert prelaunch.programs(["./run.sh"], env, cwd) == [run, Path("/bin/sh")]
    assert prelaunch.programs(["./missing"], env, cwd) == []


class _Watcher:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def take_file(self, path, st, who):
        self.calls.append(("file", str(path), who))
        return []

    def take_program(self, path, st, who):
        self.calls.append(("program", str(path), who))
        return []


def test_attach_examines_every_program_and_library_once_before_the_start(tree, tmp_path) -> None:
    watcher = _Watcher()
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""}
    lines = prelaunch.attach(object(), watcher, ["sh", "-c", f"exec {tree['prog']}"], env, lambda *a: "")
    assert lines == []
    sh = os.path.realpath(shutil.which("sh", path=env["PATH"]))
    a = tree["a"]
    ours = [c for c in watcher.calls if c[1] == sh or c[1].startswith(str(tree["root"]))]
    assert ours == [
        ("program", sh, "the --cmd program"),
        ("program", str(tree["prog"]), "a program the --cmd command execs"),
        ("program", str(a / "liba.so"), "a library of the --cmd program"),
        ("program", str(a / "libb.so"), "a library of the --cmd program"),
        ("file", str(a / "libcudart.so.12"), "a library of the --cmd program"),  # a CUDA name: its exports
    ]
    assert any(c[1].endswith("/libc.so.6") for c in watcher.calls)
    assert len({c[1] for c in watcher.calls}) == len(watcher.calls)
