"""CUDA library discovery on tiny shared libraries built here, a fake /proc tree,
and NVIDIA's real libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel."""

from __future__ import annotations

import glob
import os
import platform
import shutil
import site
import subprocess
from pathlib import Path

import pytest

from ingero.collect import libs
from ingero.collect.libs import (
    DRIVER,
    RUNTIME,
    LibraryWatcher,
    SearchPlaces,
    describe,
    find_cuda_libraries,
    pids_mapping_cuda,
)
from ingero.collect.probes import CUDA_PROBES
from ingero.errors import IngeroError

RUNTIME_C = """
int cudaLaunchKernel(void) { return 0; }
int cudaLaunchKernel_ptsz(void) { return 0; }
int cudaLaunchKernelExC(void) { return 0; }
int cudaMemcpy(void) { return 0; }
int cudaMemcpy_ptds(void) { return 0; }
int cudaMalloc(void) { return 0; }
static int helper(void) { return 1; }
int not_cuda(void) { return helper(); }
int cudaDataSymbol = 3;
"""
DRIVER_C = """
int cuInit(void) { return 0; }
int cuLaunchKernel(void) { return 0; }
int cuLaunchKernel_ptsz(void) { return 0; }
int cuMemAlloc(void) { return 0; }
int cuMemAlloc_v2(void) { return 0; }
int cuMemcpyHtoDAsync_v2_ptsz(void) { return 0; }
int cuMemcpyHtoDAsync_v2(void) { return 0; }
"""
OTHER_C = "int foo(void) { return 0; }\n"
VERSION_SCRIPT = "LIBCUDART_12 { global: *; };\n"


def _cc(tmp: Path, name: str, source: str, versioned: bool = False) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / name
    cmd = ["cc", "-shared", "-fPIC", "-o", str(out), str(src)]
    if versioned:  # like NVIDIA's: every symbol carries @@libcudart.so.12 style versions
        vs = tmp / f"{name}.map"
        vs.write_text(VERSION_SCRIPT)
        cmd.append(f"-Wl,--version-script={vs}")
    subprocess.run(cmd, check=True)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    if shutil.which("cc") is None:
        pytest.fail("a C compiler (cc) is needed to build the fake CUDA libraries")
    tmp = tmp_path_factory.mktemp("built")
    return {
        "runtime": _cc(tmp, "runtime.so", RUNTIME_C, versioned=True),
        "driver": _cc(tmp, "driver.so", DRIVER_C),
        "other": _cc(tmp, "other.so", OTHER_C),
    }


@pytest.fixture
def host(tmp_path, built) -> dict[str, Path]:
    """A fake host: a lib dir with symlinks, a site-packages with a wheel-bundled copy."""
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(built["runtime"], lib / "libcudart.so.12.4.127")
    (lib / "libcudart.so.12").symlink_to("libcudart.so.12.4.127")
    (lib / "libcudart.so").symlink_to("libcudart.so.12")
    os.link(lib / "libcudart.so.12.4.127", lib / "libcudart.so.12.4")  # hard link: same inode
    shutil.copy(built["driver"], lib / "libcuda.so.550.54.14")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.550.54.14")
    shutil.copy(built["other"], lib / "libcudart.so.99")  # right name, no CUDA symbols
    (lib / "libcuda.so").write_text("/* GNU ld script */\nINPUT(libcuda.so.1)\n")  # not ELF
    (lib / "libcudart_static.a").write_bytes(b"!<arch>\n")
    stubs = lib / "stubs"
    stubs.mkdir()
    site_dir = tmp_path / "site-packages"
    bundled = site_dir / "torch.libs"
    bundled.mkdir(parents=True)
    shutil.copy(built["runtime"], bundled / "libcudart-abc12345.so.12")
    elsewhere = tmp_path / "elsewhere"  # known to no static search
    elsewhere.mkdir()
    shutil.copy(built["runtime"], elsewhere / "libcudart.so.12")
    return {"lib": lib, "site": site_dir, "bundled": bundled, "elsewhere": elsewhere, "root": tmp_path}


def _places(host) -> SearchPlaces:
    return SearchPlaces(lib_dirs=(host["lib"],), site_packages=(host["site"],), use_ldconfig=False)


def test_static_search_finds_each_copy_once(host):
    found = find_cuda_libraries(places=_places(host), proc=None)
    assert [(lib.kind, lib.path) for lib in found] == [
        (RUNTIME, host["lib"] / "libcudart.so.12.4.127"),  # four names, one inode
        (RUNTIME, host["site"] / "torch.libs" / "libcudart-abc12345.so.12"),
        (DRIVER, host["lib"] / "libcuda.so.550.54.14"),
    ]
    st = os.stat(host["lib"] / "libcudart.so")
    assert found[0].identity == (st.st_dev, st.st_ino)
    assert len({lib.identity for lib in found}) == 3


def test_symbols_and_variants(host):
    runtime, _, driver = find_cuda_libraries(places=_places(host), proc=None)
    # exported functions only: no static helper, no data object; version suffixes gone
    assert runtime.symbols == {
        "cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchKernelExC",
        "cudaMemcpy", "cudaMemcpy_ptds", "cudaMalloc", "not_cuda",
    }  # fmt: skip
    assert runtime.variants("cudaLaunchKernel") == ["cudaLaunchKernel", "cudaLaunchKernel_ptsz"]
    assert runtime.variants("cudaMemcpy") == ["cudaMemcpy", "cudaMemcpy_ptds"]
    assert runtime.variants("cudaMemcpyAsync") == []
    # ABI revisions are separate entry points, named explicitly by the probe table
    assert driver.variants("cuMemAlloc") == ["cuMemAlloc"]
    assert driver.variants("cuMemAlloc_v2") == ["cuMemAlloc_v2"]
    assert driver.variants("cuMemcpyHtoDAsync") == []
    assert driver.variants("cuMemcpyHtoDAsync_v2") == ["cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"]
    assert driver.variants("cuLaunchKernel") == ["cuLaunchKernel", "cuLaunchKernel_ptsz"]


def test_describe(host):
    runtime = find_cuda_libraries(places=_places(host), proc=None)[0]
    assert describe(runtime, ["cudaLaunchKernel", "cudaMemcpy", "cudaStreamSynchronize", "cudaMemcpy"]) == (
        f"{runtime.path}  runtime  2/3 probed functions exported, 4 symbols with variants (6 API functions)"
    )
    # by default, the probe table's runtime rows: cudaLaunchKernel(+_ptsz), ExC, cudaMemcpy(+_ptds), cudaMalloc
    n_runtime_probes = len({p.symbol for p in CUDA_PROBES if p.library == RUNTIME})
    assert describe(runtime) == (
        f"{runtime.path}  runtime  4/{n_runtime_probes} probed functions exported, "
        "6 symbols with variants (6 API functions)"
    )


def test_extra_paths(host, built, tmp_path):
    odd = tmp_path / "mycudart.so"  # any name: the symbols decide
    shutil.copy(built["runtime"], odd)
    found = find_cuda_libraries([odd], places=SearchPlaces((), (), False), proc=None)
    assert [(lib.path, lib.kind) for lib in found] == [(odd, RUNTIME)]
    found = find_cuda_libraries([host["elsewhere"]], places=SearchPlaces((), (), False), proc=None)
    assert [lib.path for lib in found] == [host["elsewhere"] / "libcudart.so.12"]


@pytest.mark.parametrize(
    "name, message",
    [
        ("missing.so", "no such file or directory"),
        ("lib/libcuda.so", "not an ELF shared library"),
        ("lib/libcudart_static.a", "not an ELF shared library"),
        ("lib/libcudart.so.99", "exports no CUDA runtime or driver functions (nor NCCL ones)"),
        ("lib/stubs", "directory holds no libcudart.so*/libcuda.so*/libnccl.so*"),
    ],
)
def test_bad_extra_path_is_a_user_error(host, name, message):
    bad = host["root"] / name
    with pytest.raises(IngeroError) as err:
        find_cuda_libraries([bad], places=SearchPlaces((), (), False), proc=None)
    assert err.value.message == f"--cuda-lib {bad}: {message}"
    assert err.value.hint and "\n" not in str(err.value)


# ---------------------------------------------------------------- fake /proc


def _proc_entry(proc: Path, pid: int, root: Path, maps: list[str], start: int = 1000, vsize: int = 4096,
                inode: int = 100) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # comm with spaces and a ')' to check the stat parser cuts at the last ')'
    fields = ["S", "1"] + ["0"] * 17 + [str(start), str(vsize)] + ["0"] * 20
    (d / "stat").write_text(f"{pid} (we ird)) " + " ".join(fields) + "\n")
    if not (d / "root").is_symlink():
        (d / "root").symlink_to(root)
    lines = [f"7f00{i:04x}000-7f00{i:04x}fff r-xp 00000000 fe:00 {inode + i} {p}" for i, p in enumerate(maps)]
    lines.append("7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]")
    (d / "maps").write_text("\n".join(lines) + "\n")


@pytest.fixture
def proc(host, tmp_path) -> Path:
    proc = tmp_path / "proc"
    elsewhere = str(host["elsewhere"] / "libcudart.so.12")
    _proc_entry(proc, 100, Path("/"), [elsewhere, "/usr/lib/x86_64-linux-gnu/libc.so.6"])
    # a second process reaching the same file through a symlinked directory
    (host["root"] / "link").symlink_to(host["elsewhere"])
    _proc_entry(proc, 101, Path("/"), [str(host["root"] / "link" / "libcudart.so.12")])
    # a container: the path only exists inside its root
    container = tmp_path / "container"
    inside = container / "opt" / "ingero-test-only" / "lib"
    inside.mkdir(parents=True)
    shutil.copy(host["elsewhere"] / "libcudart.so.12", inside / "libcudart.so.12")
    _proc_entry(proc, 200, container, ["/opt/ingero-test-only/lib/libcudart.so.12"])
    # a process mapping a library that was since deleted: only map_files reaches it
    gone = str(host["root"] / "upgraded" / "libcuda.so.1")
    _proc_entry(proc, 300, Path("/"), [gone + " (deleted)"])
    (proc / "300" / "map_files").mkdir()
    shutil.copy(host["lib"] / "libcuda.so.550.54.14", proc / "300" / "map_files" / "7f000000000-7f000000fff")
    # a kernel thread: no maps, vsize 0
    _proc_entry(proc, 2, Path("/"), [], vsize=0)
    (proc / "self").mkdir()  # not a pid
    return proc


def test_maps_of_processes(host, proc, tmp_path):
    assert not Path("/opt/ingero-test-only").exists()
    mapping = pids_mapping_cuda(proc)
    assert sorted(mapping) == [100, 101, 200, 300]
    assert [lib.path for lib in mapping[100]] == [host["elsewhere"] / "libcudart.so.12"]
    assert mapping[101][0].identity == mapping[100][0].identity
    assert mapping[101][0].path == host["elsewhere"] / "libcudart.so.12"  # symlinks resolved
    container_lib = mapping[200][0]
    assert container_lib.path == proc / "200" / "root" / "opt/ingero-test-only/lib/libcudart.so.12"
    assert container_lib.identity != mapping[100][0].identity
    assert [(lib.path.name, lib.kind) for lib in mapping[300]] == [("7f000000000-7f000000fff", DRIVER)]


def test_find_includes_mapped_copies(host, proc):
    found = find_cuda_libraries(places=_places(host), proc=proc)
    paths = {lib.path for lib in found}
    assert host["elsewhere"] / "libcudart.so.12" in paths
    assert proc / "200" / "root" / "opt/ingero-test-only/lib/libcudart.so.12" in paths
    assert len(found) == 3 + 3  # static three + elsewhere + container + deleted driver


def test_watcher_reports_each_copy_once_and_reads_only_changed_maps(host, proc, tmp_path):
    w = LibraryWatcher(places=_places(host), proc=proc)
    first = w.poll()
    assert len(first) == 6
    assert w.maps_read == 4  # pids 100, 101, 200, 300; not the kernel thread
    assert w.poll() == []
    assert w.maps_read == 0  # nothing new, nothing changed

    # a new process maps a fresh copy: found by the next poll, and only its maps read
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(host["elsewhere"] / "libcudart.so.12", fresh / "libcudart.so.12")
    _proc_entry(proc, 400, Path("/"), [str(fresh / "libcudart.so.12")])
    new = w.poll()
    assert [lib.path for lib in new] == [fresh / "libcudart.so.12"]
    assert w.maps_read == 1

    # a known process dlopens another copy later: its vsize changes, so its maps are read again
    later = tmp_path / "later"
    later.mkdir()
    shutil.copy(host["elsewhere"] / "libcudart.so.12", later / "libcudart-0badc0de.so.12")
    _proc_entry(proc, 100, Path("/"), [str(later / "libcudart-0badc0de.so.12")], vsize=8192)
    assert [lib.path for lib in w.poll()] == [later / "libcudart-0badc0de.so.12"]
    assert w.maps_read == 1

    # pid reuse: same pid, new start time, same vsize -> read again
    _proc_entry(proc, 101, Path("/"), [str(fresh / "libcudart.so.12")], start=5000)
    assert w.poll() == []  # already reported
    assert w.maps_read == 1


def test_watcher_rejects_bad_extra_when_created(host, proc):
    with pytest.raises(IngeroError) as err:
        LibraryWatcher([host["root"] / "nope.so"], places=_places(host), proc=proc)
    assert err.value.message == f"--cuda-lib {host['root'] / 'nope.so'}: no such file or directory"


# ---------------------------------------------------------------- NVIDIA's real libcudart


def _wheel_libcudart() -> Path:
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        hits = glob.glob(os.path.join(sp, "nvidia", "cuda_runtime", "lib", "libcudart.so.1*"))
        if hits:
            return Path(hits[0])
    pytest.fail("nvidia-cuda-runtime-cu12 is not installed in this interpreter; "
                "run: pip install nvidia-cuda-runtime-cu12")


def test_real_nvidia_libcudart_is_found_with_its_variants():
    real = _wheel_libcudart()
    found = find_cuda_libraries(proc=None)  # the default search: this interpreter's site-packages among it
    match = [lib for lib in found if lib.path == real.resolve()]  # the venv may be a symlink
    assert len(match) == 1, [str(lib.path) for lib in found]
    lib = match[0]
    assert lib.kind == RUNTIME
    assert "cudaLaunchKernel_ptsz" in lib.variants("cudaLaunchKernel")
    assert "cudaMemcpy_ptds" in lib.variants("cudaMemcpy")
    assert lib.variants("cudaStreamSynchronize") == ["cudaStreamSynchronize", "cudaStreamSynchronize_ptsz"]
    assert "cudaLaunchKernelExC" not in lib.variants("cudaLaunchKernel")
    assert not any("@" in s for s in lib.symbols)
    assert len(lib.api_functions()) > 300  # CUDA 12 exports ~420 cuda* functions


def test_real_libcudart_in_a_wheel_libs_dir(tmp_path):
    bundled = tmp_path / "site-packages" / "torch.libs"
    bundled.mkdir(parents=True)
    shutil.copy(_wheel_libcudart(), bundled / "libcudart-9b3c1a2e.so.12")
    found = find_cuda_libraries(places=SearchPlaces((), (tmp_path / "site-packages",), False), proc=None)
    assert [lib.path.name for lib in found] == ["libcudart-9b3c1a2e.so.12"]
    assert "cudaMemcpy_ptds" in found[0].variants("cudaMemcpy")


def test_elf_cache_reads_each_file_once(host, monkeypatch):
    calls = []
    real = libs._read_exports
    monkeypatch.setattr(libs, "_read_exports", lambda p: calls.append(p) or real(p))
    libs._elf_cache.clear()
    find_cuda_libraries(places=_places(host), proc=None)
    n = len(calls)
    find_cuda_libraries(places=_places(host), proc=None)
    assert len(calls) == n  # second search parses nothing
    assert n == 5  # runtime, bundled runtime, driver, the no-CUDA .so.99, the ld script


def test_32bit_copy_is_skipped_and_refused_as_extra(host, tmp_path):
    # like NVIDIA's i386 libcuda that ldconfig -p lists next to the 64-bit one
    data = bytearray((host["lib"] / "libcuda.so.550.54.14").read_bytes())
    data[4] = 1  # ELFCLASS32
    data[18:20] = (3).to_bytes(2, "little")  # EM_386
    lib32 = tmp_path / "lib32"
    lib32.mkdir()
    (lib32 / "libcuda.so.1").write_bytes(bytes(data))
    found = find_cuda_libraries(places=SearchPlaces((lib32,), (), False), proc=None)
    assert found == []
    with pytest.raises(IngeroError) as err:
        find_cuda_libraries([lib32 / "libcuda.so.1"], places=SearchPlaces((), (), False), proc=None)
    assert err.value.message == (
        f"--cuda-lib {lib32 / 'libcuda.so.1'}: built for another architecture "
        f"(ELF32 for machine 3, this host is {platform.machine()})"
    )


def test_watcher_first_poll_includes_extra_paths(built, tmp_path):
    odd = tmp_path / "mycudart.so"
    shutil.copy(built["runtime"], odd)
    empty_proc = tmp_path / "proc"
    empty_proc.mkdir()
    w = LibraryWatcher([odd], places=SearchPlaces((), (), False), proc=empty_proc)
    assert [(lib.path, lib.kind) for lib in w.poll()] == [(odd, RUNTIME)]
    assert w.poll() == []


def test_ldconfig_listing_is_filtered_by_name(monkeypatch):
    listing = (
        "612 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12\n"
        "\tlibcudadebugger.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudadebugger.so.1\n"
        "\tlibcudnn.so.9 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so.9\n"
        "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
        "\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n"
        "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n"
    )
    monkeypatch.setattr(
        libs.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=listing, stderr="")
    )
    assert libs._ldconfig_paths() == [
        Path("/usr/local/cuda/lib64/libcudart.so.12"),
        Path("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        Path("/usr/lib/i386-linux-gnu/libcuda.so.1"),  # dropped later by the ELF class check
    ]


# ---------------------------------------------------------------- runtime linked into a program

# A program as `nvcc` (-cudart static) leaves it: the runtime's functions are
# local symbols (nm: t cudaLaunchKernel) or globals of .symtab only, device
# code sits in .nv_fatbin, and the runtime's own strings are in .rodata.
LINKED_IN_C = """
__attribute__((noinline)) static int cudaLaunchKernel(void) { return 35; }
__attribute__((noinline)) static int cudaLaunchKernel_ptsz(void) { return 35; }
__attribute__((noinline)) static int cudaMalloc(void) { return 35; }
__attribute__((noinline)) int cudaStreamSynchronize(void) { return 35; }
__attribute__((used, section(".nv_fatbin"))) static const char fatbin[16] = "fatbin";
__attribute__((used)) const char *rt_strings[] = {"cudaErrorCudartUnloading", "/cudart.shm.%x.%x"};
int main(void) { return cudaLaunchKernel() + cudaLaunchKernel_ptsz() + cudaMalloc() + cudaStreamSynchronize(); }
"""
# A program using the shared runtime: device code too, libcudart.so.12 needed.
SHARED_USER_C = """
extern int cudaMalloc(void);
__attribute__((used, section(".nv_fatbin"))) static const char fatbin[16] = "fatbin";
__attribute__((used)) const char *rt_strings[] = {"cudaErrorCudartUnloading", "/cudart.shm.%x.%x"};
int main(void) { return cudaMalloc(); }
"""


def _program(tmp: Path, name: str, source: str, *link: str) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / name
    subprocess.run(["cc", "-O1", "-Wl,--build-id", "-o", str(out), str(src), *link], check=True)
    return out


def _stripped(path: Path, name: str) -> Path:
    out = path.parent / name
    shutil.copy(path, out)
    subprocess.run(["strip", str(out)], check=True)
    return out


def _nm_local(path: Path, name: str) -> int:
    """The address nm gives a local function symbol ('t')."""
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    (value,) = [line.split()[0] for line in out.splitlines() if line.endswith(f" t {name}")]
    return int(value, 16)


@pytest.fixture
def linked(tmp_path) -> dict[str, Path]:
    from ingero.collect import static_runtime

    static_runtime.reset_caches()  # the caches live for the whole process: each test starts cold
    prog = _program(tmp_path, "app", LINKED_IN_C)
    return {"prog": prog, "stripped": _stripped(prog, "app.stripped")}


def test_runtime_linked_in_is_found_in_symtab_with_local_symbols(linked):
    from ingero.collect import static_runtime

    found = static_runtime.examine(linked["prog"])
    assert found is not None and not found.stripped
    assert set(found.addresses) == {"cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaMalloc", "cudaStreamSynchronize"}
    assert found.addresses["cudaLaunchKernel"] == _nm_local(linked["prog"], "cudaLaunchKernel")
    assert found.build_id and len(found.build_id) == 40


def test_stripped_runtime_is_recognised_and_a_copy_with_symbols_is_not_shadowed(linked, tmp_path):
    from ingero.collect import static_runtime

    stripped = static_runtime.examine(linked["stripped"])
    assert stripped is not None and stripped.stripped and stripped.addresses == {}
    assert static_runtime.symbol_reads == 0
    # the copy with symbols, seen later, still gives its symbols (stripped answers are not cached by build-id)
    assert not static_runtime.examine(linked["prog"]).stripped
    # `strip` keeps the build-id and the code: a new stripped copy is probed at the known addresses
    again = _stripped(linked["prog"], "app.stripped2")
    assert static_runtime.examine(again).addresses == static_runtime.examine(linked["prog"]).addresses


def test_a_fleet_of_identical_binaries_costs_one_symbol_read(linked, tmp_path):
    from ingero.collect import static_runtime

    copies = []
    for i in range(3):
        copies.append(tmp_path / f"copy{i}")
        shutil.copy(linked["prog"], copies[-1])  # a new inode each
    answers = [static_runtime.examine(c) for c in [linked["prog"], *copies]]
    assert static_runtime.symbol_reads == 1
    assert all(a is answers[0] for a in answers)


def test_no_claim_without_the_runtime(linked, tmp_path, built):
    from ingero.collect import static_runtime

    # shared-runtime user: fatbin and strings, but libcudart.so.12 is needed
    libdir = tmp_path / "libdir"
    libdir.mkdir()
    shutil.copy(built["runtime"], libdir / "libcudart.so.12")
    user = _program(tmp_path, "user", SHARED_USER_C, f"-L{libdir}", "-l:libcudart.so.12")
    assert static_runtime.examine(_stripped(user, "user.stripped")) is None
    assert static_runtime.examine(user) is None  # cudaMalloc is an undefined import there
    # NVIDIA's own libraries link the runtime in, stripped: not the program's calls, not reported
    assert static_runtime.examine(_stripped(linked["prog"], "libcublasLt.so.12")) is None
    # a stripped program without device code nor the runtime
    assert static_runtime.examine(_stripped(_program(tmp_path, "plain", OTHER_C + "int main(void){return foo();}\n"),
                                            "plain.stripped")) is None
    assert static_runtime.examine(built["other"]) is None
    assert static_runtime.examine(tmp_path / "missing") is None


def test_watcher_finds_linked_in_runtimes_in_processes_and_says_stripped_once(linked, tmp_path):
    proc = tmp_path / "proc"
    _proc_entry(proc, 500, Path("/"), [str(linked["prog"]), "/usr/lib/x86_64-linux-gnu/libc.so.6"])
    (proc / "500" / "comm").write_text("app\n")
    w = LibraryWatcher(places=SearchPlaces((), (), False), proc=proc,
                       executables=[(linked["stripped"], "the --cmd program")])
    (lib,) = w.poll()
    assert (lib.path, lib.kind, lib.linked_in) == (linked["prog"], RUNTIME, True)
    assert lib.addresses["cudaMalloc"] == _nm_local(linked["prog"], "cudaMalloc")
    assert lib.variants("cudaLaunchKernel") == ["cudaLaunchKernel", "cudaLaunchKernel_ptsz"]
    assert "runtime linked in (probed by address)  3/" in describe(lib)
    (note,) = w.take_notes()
    assert note.startswith(f"{linked['stripped']} (the --cmd program) has the CUDA runtime linked in without symbols")
    assert "nvcc -cudart shared" in note
    assert w.take_notes() == []

    # a process started later runs another stripped copy: said once, naming the process
    other = _stripped(_program(tmp_path, "other", LINKED_IN_C.replace("35", "36")), "other.stripped")
    _proc_entry(proc, 501, Path("/"), [str(other)], start=2000, inode=200)  # maps name each file by dev and inode
    (proc / "501" / "comm").write_text("other\n")
    assert w.poll() == []
    assert w.take_notes() == [libs.static_runtime.stripped_message(other, "pid 501, other")]
    (proc / "501" / "stat").write_text((proc / "501" / "stat").read_text().replace(" 4096 ", " 8192 "))
    assert w.poll() == [] and w.take_notes() == []


def test_process_runtimes_for_check_pid(linked, tmp_path):
    proc = tmp_path / "proc"
    _proc_entry(proc, 600, Path("/"), [str(linked["stripped"])])
    libs_found, notes = libs.process_runtimes(600, proc=proc)
    assert libs_found == [] and len(notes) == 1 and "pid 600" in notes[0]
    _proc_entry(proc, 601, Path("/"), [str(linked["prog"])])
    libs_found, notes = libs.process_runtimes(601, proc=proc)
    assert [lib.path for lib in libs_found] == [linked["prog"]] and notes == []


def test_mapped_code_lists_executable_file_mappings_once():
    data = (b"55d000-55e000 r--p 00000000 fd:01 11 /opt/app\n"
            b"55e000-55f000 r-xp 00001000 fd:01 11 /opt/app\n"
            b"7f0000-7f1000 r-xp 00000000 fd:01 12 /usr/lib/libcudart.so.12\n"
            b"7f1000-7f2000 r-xp 00000000 fd:01 13 /opt/lib/libplugin.so (deleted)\n"
            b"7f2000-7f3000 r-xp 00000000 00:00 0 [vdso]\n"
            b"7f3000-7f4000 rw-p 00000000 00:00 0 \n")
    seen: set[str] = set()
    got = libs._mapped_code(data, 7, seen)
    assert [(m.path, m.deleted, m.node) for m in got] == [("/opt/app", False, "fd:01 11"),
                                                          ("/opt/lib/libplugin.so", True, "fd:01 13")]
    assert libs._mapped_code(data, 8, seen) == []  # every file once, without a stat
