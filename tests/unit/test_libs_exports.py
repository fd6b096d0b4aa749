"""libs._read_exports: the struct reader of .dynsym gives what pyelftools gives.

A held process waits while its library's exports are read, so they are read
with struct (libs._dynsym_exports); pyelftools stays for the layouts it does
not handle.  Both read a library built here with the cases that matter:
functions (versioned, weak, an IFUNC), a data object, an undefined import.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ingero.collect import libs

SRC = r"""
int cudaMalloc(void **p, unsigned long n) { (void)p; (void)n; return 0; }
__attribute__((weak)) int cudaFree(void *p) { (void)p; return 0; }
static int pick_impl(void) { return 1; }
static void *resolve(void) { return (void *)pick_impl; }
int cudaGetDeviceCount(int *) __attribute__((ifunc("resolve")));
int old_impl(void) { return 1; }
__asm__(".symver old_impl,cudaMemcpy@LIBCUDART_12");
static int hidden(void) { return 2; }
int cudaDataObject = 3;
extern int imported(void);
int uses_import(void) { return imported() + hidden(); }
"""


def test_the_struct_reader_and_pyelftools_agree(tmp_path: Path, monkeypatch) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed (make setup installs gcc)")
    (tmp_path / "l.c").write_text(SRC)
    (tmp_path / "l.map").write_text("LIBCUDART_12 { global: *; };\n")
    lib = tmp_path / "libcudart.so.12"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,--version-script", str(tmp_path / "l.map"), "-o", str(lib),
                    str(tmp_path / "l.c")], check=True)
    fast = libs._read_exports(lib)
    monkeypatch.setattr(libs, "_dynsym_exports", lambda f: None)
    slow = libs._read_exports(lib)
    assert fast == slow
    assert {"cudaMalloc", "cudaFree", "cudaGetDeviceCount", "cudaMemcpy", "old_impl", "uses_import"} <= fast
    assert not {"cudaDataObject", "imported", "hidden", "pick_impl"} & fast
