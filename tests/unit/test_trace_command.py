"""`ingero trace` errors and --print-bpf, without eBPF (CliRunner, in-process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingero.cli import cli
from ingero.collect import loader, probes, session, targets
from ingero.errors import IngeroError


def run(*args: str):
    return CliRunner().invoke(cli, ["trace", *args], standalone_mode=False, catch_exceptions=True)


def test_not_root_is_one_exact_line(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(IngeroError) as exc:
        session.run_trace(session.TraceOptions())
    assert str(exc.value) == "trace needs root (eBPF): run with sudo"


def test_pid_that_does_not_exist(tmp_path):
    (tmp_path / "1").mkdir()  # a fake /proc holding only pid 1
    targets.check_pids([1], proc=tmp_path)
    with pytest.raises(IngeroError, match="no process with pid 999999"):
        targets.check_pids([1, 999999], proc=tmp_path)


def test_a_pid_that_exits_while_the_probes_go_in_is_said(tmp_path):
    (tmp_path / "10").mkdir()  # a fake /proc: pid 10 still runs, 11 exited during the compile
    spec = targets.TargetSpec(pids=[10, 11])
    assert targets.exited_while_attaching(spec, False, 6.34, proc=tmp_path) == [
        "pid 11 exited while the probes went in (6.3 s after the start): nothing of it is recorded"]
    assert targets.exited_while_attaching(targets.TargetSpec(pids=[10]), False, 6.3, proc=tmp_path) == []
    # something else to trace (a --comm, a --cmd): said, and the trace goes on
    alone = targets.TargetSpec(pids=[11], comm="python3")
    assert len(targets.exited_while_attaching(alone, False, 6.3, proc=tmp_path)) == 1
    assert len(targets.exited_while_attaching(targets.TargetSpec(pids=[11]), True, 6.3, proc=tmp_path)) == 1


def test_every_pid_gone_before_the_attach_is_an_error():
    with pytest.raises(IngeroError, match=r"every --pid target exited while the probes went in \(5.0 s after "
                                          r"the start\): pid 11, 12; nothing was traced — trace the job from "
                                          r"its start instead: ingero trace -- COMMAND"):
        targets.exited_while_attaching(targets.TargetSpec(pids=[11, 12]), False, 5.0, proc=Path("/nonexistent"))


def test_ring_size_must_be_a_power_of_two():
    assert loader.ring_bytes_from_mb(64) == 64 << 20
    with pytest.raises(IngeroError, match="not a power of two"):
        loader.ring_bytes_from_mb(48)


def test_print_bpf_shows_flags_and_every_compiled_file():
    result = run("--print-bpf", "--comm", "python3", "--ring-mb", "16")
    assert result.exception is None, result.output
    out = result.output
    assert out.startswith("// cflags: -I")
    assert '-DRING_PAGES=4096' in out and "-DTRACE_ALL_CUDA=0" in out and '-DTARGET_COMM="python3"' in out
    for name in ("ingero.bpf.c", "events.h", "cuda.bpf.c", "sched.bpf.c", "mm.bpf.c", "blockio.bpf.c"):
        assert f"/{name} =====" in out
    assert "bench.bpf.c =====" not in out  # not compiled without -DINGERO_BENCH
    assert "TRACEPOINT_PROBE(sched, sched_switch)" in out


def test_default_mode_traces_cuda_callers():
    flags = session.settings_for(session.TraceOptions()).cflags(loader.bpf_dir())
    assert "-DTRACE_ALL_CUDA=1" in flags
    assert not any(f.startswith("-DLAUNCH_STREAMS") for f in flags)  # launch streams cost time: opt-in


def test_streams_flag_compiles_launch_stream_reads():
    settings = session.settings_for(session.TraceOptions(launch_streams=True))
    assert settings.launch_streams and "-DLAUNCH_STREAMS=1" in settings.cflags(loader.bpf_dir())
    out = run("--print-bpf", "--streams").output
    assert out.splitlines()[0].endswith(" -DLAUNCH_STREAMS=1")
    assert "LAUNCH_STREAMS" not in run("--print-bpf").output.splitlines()[0]


def test_every_probe_entry_function_exists_in_the_bpf_source():
    """probes.py and the BPF programs cannot drift: each named function is defined."""
    src = (loader.bpf_dir() / "ingero.bpf.c").read_text()
    every = probes.CUDA_PROBES + probes.NVTX_PROBES
    for fn in {p.entry_fn for p in every} | {p.return_fn for p in every if p.return_fn is not None}:
        assert f"UPROBE_PROGRAM({fn})" in src, fn


def test_nvtx_probes_are_entries_only_on_the_injection_library_functions():
    from ingero.collect import nvtx_inject

    plan = probes.plan_library("/c/libingero_nvtx.so", probes.NVTX, frozenset(nvtx_inject.PROBED))
    assert sorted((a.symbol, a.fn, a.probe_kind) for a in plan) == [
        ("ingero_nvtx_end", "nvtx_end_enter", "uprobe"), ("ingero_nvtx_pop", "nvtx_pop_enter", "uprobe"),
        ("ingero_nvtx_push", "nvtx_push_enter", "uprobe"), ("ingero_nvtx_start", "nvtx_start_enter", "uprobe")]
    # every probed function is defined, out of line, in the library's source
    src = nvtx_inject.SOURCE.read_text()
    assert all(f"PROBED void {name}(" in src for name in nvtx_inject.PROBED)


def test_variants_attach_every_exported_per_thread_stream_build():
    exported = {"cudaMemcpy", "cudaMemcpy_ptds", "cudaMemcpyAsync", "cudaMemcpyAsync_ptsz", "cudaMemcpyPeer"}
    assert probes.variants("cudaMemcpy", exported) == ["cudaMemcpy", "cudaMemcpy_ptds"]
    plan = probes.plan_library("/x/libcudart.so.12", "runtime", exported)
    got = {(a.symbol, a.probe_kind) for a in plan}
    assert got == {(s, k) for s in ("cudaMemcpy", "cudaMemcpy_ptds", "cudaMemcpyAsync", "cudaMemcpyAsync_ptsz")
                   for k in ("uprobe", "uretprobe")}


def test_compiler_key_line_is_quoted():
    log = ("In file included from x\n/work/bpf/cuda.bpf.c:12:3: error: use of undeclared identifier 'foo'\n"
           "1 error generated.")
    assert loader._key_line(log, "fallback") == "/work/bpf/cuda.bpf.c:12:3: error: use of undeclared identifier 'foo'"
    assert loader._key_line("", "fallback") == "fallback"


@pytest.mark.parametrize("flags, cupti", [([], True), (["--no-cupti"], False)])
def test_no_cupti_turns_the_device_timeline_off(monkeypatch, flags, cupti):
    seen = {}

    def fake_run_trace(opts, **kw):
        seen["cupti"], seen["nvtx"] = opts.cupti, opts.nvtx
        raise IngeroError("stop here")

    monkeypatch.setattr(session, "run_trace", fake_run_trace)
    result = run("--cmd", "true", "--no-serve", *flags)
    assert isinstance(result.exception, IngeroError) and seen == {"cupti": cupti, "nvtx": True}
