"""loader.load_error: BCC's exception + captured compiler/verifier log -> one IngeroError line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingero.collect.loader import load_error

SRC = Path("/opt/ingero/bpf")

VERIFIER_LOG = """\
bpf: Failed to load program: Permission denied
0: R1=ctx() R10=fp0
; u64 *p = (u64 *)(unsigned long)bpf_get_prandom_u32();
0: (85) call bpf_get_prandom_u32#7    ; R0_w=scalar(smin=0,smax=umax=0xffffffff)
1: (79) r0 = *(u64 *)(r0 +0)
R0 invalid mem access 'scalar'
processed 2 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0

HINT: The invalid mem access 'scalar' error can happen if you try to dereference memory directly.
"""

COMPILE_LOG = """\
In file included from /virtual/main.c:2:
/opt/ingero/bpf/events.h:120:1: error: unknown type name 'this'
this is not C;
^
1 error generated.
"""


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INGERO_BPF_DIR", raising=False)
    monkeypatch.setenv("BCC_KERNEL_SOURCE", "/var/cache/ingero/kheaders/x")


def test_verifier_refusal_names_the_program_and_quotes_the_key_line() -> None:
    err = load_error("Failed to load BPF program b'tracepoint__sched__sched_process_free': Permission denied",
                     VERIFIER_LOG, SRC)
    assert err.message == ("BPF load failed: the kernel verifier refused tracepoint__sched__sched_process_free: "
                           "R0 invalid mem access 'scalar'")
    assert "INGERO_BPF_DIR" not in str(err) and "ingero check" in err.hint


def test_compile_failure_quotes_the_compiler_error_and_the_headers() -> None:
    err = load_error("Failed to compile BPF module b'/opt/ingero/bpf/ingero.bpf.c'", COMPILE_LOG, SRC)
    assert err.message == ("BPF compile failed (/opt/ingero/bpf/ingero.bpf.c, kernel headers "
                           "/var/cache/ingero/kheaders/x): /opt/ingero/bpf/events.h:120:1: "
                           "error: unknown type name 'this'")


def test_sources_from_ingero_bpf_dir_are_named_in_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGERO_BPF_DIR", "/tmp/mine")
    err = load_error("Failed to compile BPF module b'x'", COMPILE_LOG, Path("/tmp/mine"))
    assert err.hint.startswith("INGERO_BPF_DIR=/tmp/mine chose these sources: unset it to use the installed ones")


def test_without_a_log_the_bcc_message_is_the_line() -> None:
    err = load_error("Failed to load BPF program b'x': Invalid argument", "", SRC)
    assert err.message == ("BPF load failed: the kernel verifier refused x: "
                           "Failed to load BPF program b'x': Invalid argument")
