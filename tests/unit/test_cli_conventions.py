"""The command line as a newcomer meets it (issue 42): `trace -- CMD ARGS`, -p/-d, one --pid syntax,
help placeholders that read as values, bare `ingero`, ingero's lines on stderr, -v, explain --fail-on."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from analyze_helpers import MAIN_PID, SESSION, S, T0, Trace, healthy
from ingero.cli import COMMANDS, cli, main
from ingero.collect import session, targets
from ingero.commands import explain as explain_cmd
from ingero.errors import IngeroError
from ingero.traceapi import OpStats, StartInfo, TickStats, TraceSummary

PIDS_HINT = "pass process ids, comma-separated or repeated: --pid 123,456 or -p 123 -p 456"


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


class Stop(IngeroError):
    """Raised by a fake run_trace once it has seen the options: nothing is traced."""


@pytest.fixture
def trace_opts(monkeypatch):
    """The TraceOptions `ingero trace ...` builds, without tracing anything."""
    seen: dict = {}

    def fake_run_trace(opts, **kw):
        seen["opts"] = opts
        raise Stop("stopped before tracing")

    monkeypatch.setattr(session, "run_trace", fake_run_trace)

    def opts_of(*args: str, capsys) -> session.TraceOptions:
        code, out, err = run(["trace", "--no-serve", *args], capsys)
        assert (code, out, err) == (2, "", "ingero: stopped before tracing\n")
        return seen.pop("opts")

    return opts_of


# -- trace -- CMD ARGS -----------------------------------------------------------------------------

# words a shell would have split, quoted or expanded: after `--` each reaches the job as given
AWKWARD = ["a b", '"q"', "it's", "$HOME", "", "*", "tab\there", "new\nline", "--json", "-p", "--", "ü"]


def test_the_words_after_dashdash_are_the_job_exactly(trace_opts, capsys):
    argv = [sys.executable, "-c", "print(1)", *AWKWARD]
    opts = trace_opts("-d", "5s", "--", *argv, capsys=capsys)
    assert shlex.split(opts.cmd) == argv
    # what the launcher will exec (it splits the line without a shell)
    assert targets.Launcher(opts.cmd).argv == argv
    assert opts.duration_s == 5.0 and opts.pids == []


def test_options_after_the_command_are_the_jobs(trace_opts, capsys):
    # perf and nsys alike: the first word that is not an option starts the job, `--` or not
    opts = trace_opts("--", "python3", "train.py", "-d", "9s", "-p", "1", capsys=capsys)
    assert shlex.split(opts.cmd) == ["python3", "train.py", "-d", "9s", "-p", "1"]
    assert opts.duration_s is None and opts.pids == []
    opts = trace_opts("-p", "7", "python3", "train.py", "--json", capsys=capsys)
    assert shlex.split(opts.cmd) == ["python3", "train.py", "--json"] and opts.pids == [7]


def test_cmd_string_still_works(trace_opts, capsys):
    opts = trace_opts("--cmd", "python3 train.py --lr '0.1 0.2'", capsys=capsys)
    assert opts.cmd == "python3 train.py --lr '0.1 0.2'"
    assert targets.Launcher("sh -c 'echo x'").argv == ["sh", "-c", "echo x"]


def test_a_command_both_ways_is_one_line_exit_2(trace_opts, capsys):
    code, out, err = run(["trace", "--cmd", "python3 a.py", "--", "python3", "b.py"], capsys)
    assert (code, out) == (2, "")
    assert err == ("ingero: the command is given twice (--cmd 'python3 a.py' and 'python3 b.py' after --): "
                   "give one — see `ingero trace --help`\n")


@pytest.mark.parametrize("args", [["--"], ["-d", "5s", "--"]])
def test_nothing_after_dashdash_is_one_line_exit_2(trace_opts, capsys, args):
    # (without the check, an empty command would trace every process on the host)
    code, out, err = run(["trace", *args], capsys)
    assert (code, out) == (2, "")
    assert err == ("ingero: nothing after --: give the command to trace, e.g. ingero trace -- python3 train.py"
                   " — see `ingero trace --help`\n")


def test_short_options_of_trace(trace_opts, capsys):
    opts = trace_opts("-d", "90s", "-p", "12,34", "-p", "56", "-p", "12", capsys=capsys)
    assert opts.duration_s == 90.0 and opts.pids == [12, 34, 56]
    opts = trace_opts("--duration", "2m", "--pid", "12", "--pid", "34,", capsys=capsys)
    assert opts.duration_s == 120.0 and opts.pids == [12, 34]


# -- one --pid syntax --------------------------------------------------------------------------

PID_COMMANDS = [["trace"], ["explain"], ["check"], ["export", "--format", "parquet", "-o", "x"],
                ["report", "-o", "x.html"]]


@pytest.mark.parametrize("cmd", PID_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("value, words", [
    ("x1", "bad --pid: 'x1' is not a process id"),
    ("12,x1", "bad --pid: 'x1' is not a process id"),
    ("-4", "bad --pid: '-4' is not a process id"),
    ("1.5", "bad --pid: '1.5' is not a process id"),
    ("٣", "bad --pid: '٣' is not a process id"),  # a digit to str.isdigit and int(), no pid
    ("", "bad --pid: '' names no process"),
    (",", "bad --pid: ',' names no process"),
    ("0", "bad --pid: '0' is below the minimum of 1"),
    ("99999999", "bad --pid: '99999999' is more than the limit of 4194304"),
])
def test_bad_pids_are_one_line_exit_2_on_every_command(cmd, value, words, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("INGERO_DB", str(tmp_path / "none.duckdb"))
    for flag in ("--pid", "-p"):
        code, out, err = run([*cmd, flag, value], capsys)
        assert (code, out, err) == (2, "", f"ingero: {words} — {PIDS_HINT}\n")


def _explain_db(tmp_path: Path, trace: Trace) -> Path:
    path = tmp_path / "e.duckdb"
    trace.store(path).close()
    return path


def test_explain_takes_pids_repeated_and_comma_separated(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(explain_cmd, "_explain_file", lambda con, opts: seen.append(opts) or
                        {"json": {"chains": []}, "text": "ok\n"})
    db = _explain_db(tmp_path, healthy(10))
    for args in (["-p", "4242,5000", "-p", "5001"], ["--pid", "4242", "--pid", "5000,5001,4242"]):
        res = CliRunner().invoke(cli, ["explain", "--db", str(db), *args])
        assert (res.exit_code, res.output) == (0, "ok\n")
    assert [o.pids for o in seen] == [(4242, 5000, 5001), (4242, 5000, 5001)]


def test_explain_pid_filter_reads_the_same_both_ways(tmp_path):
    db = _explain_db(tmp_path, healthy(10))
    outs = [CliRunner().invoke(cli, ["explain", "--db", str(db), "--json", *args]).output
            for args in (["-p", f"{MAIN_PID},5000"], ["--pid", str(MAIN_PID), "--pid", "5000"])]
    assert outs[0] == outs[1] and json.loads(outs[0])["analysed"]["processes"] == ["python3 (train.py) (PID 4242)"]


def test_export_and_check_take_the_same_pid_lists(tmp_path, monkeypatch):
    from ingero.commands import check as check_cmd
    from ingero.export import run as export_run

    got = {}
    monkeypatch.setattr(export_run, "export",
                        lambda db, fmt, out, opts, force: got.setdefault("export", opts.pids) and "")
    monkeypatch.setattr(check_cmd, "run_checks", lambda db, pids: got.setdefault("check", pids) and [])
    CliRunner().invoke(cli, ["export", "--format", "parquet", "-o", str(tmp_path / "p"), "-p", "3,1", "--pid", "2"])
    CliRunner().invoke(cli, ["check", "-p", "3,1", "--pid", "2"])
    assert got == {"export": (3, 1, 2), "check": (3, 1, 2)}


# -- help ---------------------------------------------------------------------------------------

def helptext(args: list[str], width: int | None = 200) -> str:
    return CliRunner().invoke(cli, [*args, "--help"], prog_name="ingero", terminal_width=width).output


def _every_command() -> list[tuple[str, click.Command]]:
    out = []
    for name in COMMANDS:
        cmd = cli.get_command(click.Context(cli), name)
        out.append((name, cmd))
        if isinstance(cmd, click.Group):
            out += [(f"{name} {sub}", cmd.get_command(click.Context(cmd), sub)) for sub in cmd.list_commands(None)]
    return out


# what click shows when nobody chose a placeholder: a type's name, not a value to type
TYPE_NAMES = {"TEXT", "INTEGER", "FLOAT", "BOOLEAN", "COUNT", "WINDOW", "PIDS", "INTEGER RANGE", "FLOAT RANGE"}


@pytest.mark.parametrize("name, command", _every_command(), ids=lambda v: v if isinstance(v, str) else "")
def test_help_placeholders_read_as_values(name, command):
    text = helptext([*name.split()])
    assert text.startswith(f"Usage: ingero {name} ")
    options = text.split("\nOptions:\n", 1)[1]
    shown = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.is_flag or param.hidden:
            continue
        line = next(ln for ln in options.splitlines() if re.match(rf"\s+(-\w, )?{re.escape(param.opts[-1])} ", ln))
        placeholder = line.split(param.opts[-1] + " ", 1)[1].split("  ", 1)[0]
        shown.append(placeholder)
        assert placeholder not in TYPE_NAMES and " " not in placeholder, (name, param.opts, placeholder)
    assert all(shown), name


def test_the_placeholders_named_in_issue_42():
    def option_line(args: list[str], flag: str) -> str:
        text = helptext(args)
        return next(ln.strip() for ln in text.splitlines() if re.match(rf"\s+(-\w, )?{flag} ", ln))

    assert option_line(["trace"], "--overhead-budget").startswith("--overhead-budget PCT|off  ")
    assert option_line(["trace"], "--duration").startswith("-d, --duration DURATION  ")
    assert option_line(["trace"], "--ring-mb").startswith("--ring-mb MIB  ")
    for args in (["explain"], ["export"], ["report"]):
        assert option_line(args, "--session").startswith("--session ID  ")
    for args in (["trace"], ["explain"], ["check"], ["export"], ["report"]):
        assert option_line(args, "--pid").startswith("-p, --pid PID[,PID...]  "), args
    assert option_line(["explain"], "--fail-on").startswith("--fail-on high|medium|low  ")
    assert helptext(["trace"]).startswith(
        "Usage: ingero trace [OPTIONS] [-- CMD [ARGS]...]\n")


@pytest.mark.parametrize("argv", [[], ["fleet"]])
def test_bare_ingero_prints_the_help_and_exits_0(argv, capsys):
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert out.startswith(f"Usage: ingero {' '.join([*argv, ''])}[OPTIONS] COMMAND [ARGS]...\n")
    assert run([*argv, "--help"], capsys) == (0, out, "")


def test_an_unknown_command_is_still_one_line_exit_2(capsys):
    assert run(["nosuch"], capsys) == (2, "", "ingero: No such command 'nosuch'. — see `ingero --help`\n")


# -- trace's own lines: stderr, details under -v -----------------------------------------------

START = StartInfo(session_id=7, db_path="/tmp/none/t.duckdb", lines=["attached 19 functions to libcudart.so.12"])
DETAILS = ["summaries: 51 flushes summarised in 0.20 CPU-s (making the rows 0.10, storing them 0.10; 13 writes)",
           "holds: 2 mappings / execs of CUDA candidates looked at; 2 held 0.9-74.2 ms (median 74.2)",
           "scheduler: 9 off-CPU interval(s) whose switch back onto a CPU no probe saw; each ends ..."]
KEPT = ["summaries: failed (ZeroDivisionError: division by zero); explain summarises this session's events instead",
        "nvtx: 12 ranges stored as spans (category 'nvtx')"]


@pytest.fixture
def fake_trace(monkeypatch):
    """run_trace replaced by one that shows a start, one second and a summary, as a real one does."""
    def fake_run_trace(opts, on_tick, on_start):
        on_start(START)
        on_tick(TickStats(elapsed_s=1.0, events=100, events_per_s=100.0, drops_kernel=0, drops_user=0,
                          nest_skipped=0, ops={"cudaLaunchKernel": OpStats(100, 1e3, 2e3, 3e3)},
                          notes=["attached 19 functions to libnccl.so.2", DETAILS[1]]))
        return TraceSummary(session_id=7, db_path="/tmp/none/t.duckdb", elapsed_s=1.5, events=100, drops_kernel=0,
                            drops_user=0, nest_skipped=0, ops={}, ended_by="command exited", command_exit=0,
                            notes=[DETAILS[0], KEPT[0], DETAILS[1], KEPT[1], DETAILS[2]])

    monkeypatch.setattr(session, "run_trace", fake_run_trace)


def _text_lines(verbose: bool) -> list[str]:
    shown = [*KEPT[:1], *(DETAILS[1:2] if verbose else []), KEPT[1], *(DETAILS[2:] if verbose else [])]
    return [
        "ingero: attached 19 functions to libcudart.so.12",
        "ingero: session 7 -> /tmp/none/t.duckdb  (Ctrl-C to stop)",
        "ingero: attached 19 functions to libnccl.so.2",
        *(["ingero: " + DETAILS[1]] if verbose else []),
        "   1.0s  100 events  100/s  drops 0  cudaLaunchKernel 100 p99 3.0 µs",
        *(["ingero: " + DETAILS[0]] if verbose else []),
        *("ingero: " + n for n in shown),
        "ingero: session 7 closed (command exited) after 1.5s: 100 events stored in /tmp/none/t.duckdb, 0 dropped",
        "ingero: the command exited with code 0",
        "ingero: next: ingero explain --db /tmp/none/t.duckdb",
    ]


@pytest.mark.parametrize("verbose", [[], ["-v"], ["--verbose"]])
def test_trace_says_everything_on_stderr_and_details_only_under_v(fake_trace, capsys, verbose):
    code, out, err = run(["trace", "--no-serve", *verbose, "--", "python3", "train.py"], capsys)
    assert (code, out) == (0, "")  # stdout is the job's alone
    assert err.splitlines() == _text_lines(bool(verbose))


def test_trace_json_is_on_stdout_with_every_note(fake_trace, capsys):
    code, out, err = run(["trace", "--no-serve", "--json", "--", "python3", "train.py"], capsys)
    assert (code, err) == (0, "")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [x["type"] for x in lines] == ["start", "tick", "summary"]
    assert lines[1]["notes"] == ["attached 19 functions to libnccl.so.2", DETAILS[1]]
    assert lines[2]["notes"] == [DETAILS[0], KEPT[0], DETAILS[1], KEPT[1], DETAILS[2]]  # bench/ reads them here


# -- explain --fail-on ------------------------------------------------------------------------

def _contended() -> Trace:
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.name(7000, "stress", "stress", "stress --cpu 2")
    tr.loop(0, 10).loop(10, 20, preempt_ms=40, preempt_by=7000).loop(20, 30)
    return tr.competitor(7000, "stress", 10, 20).system(0, 30, cpu_pct=91.0, load1=6.1)


def _gpu_idle() -> Trace:
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py").system(0, 20).loop(0, 20)
    for s in range(20):  # NVML: 95% busy, then 20% from second 13 on
        tr.gpu.append({"session_id": SESSION, "timestamp": T0 + s * S + S // 2, "gpu": 0, "name": "A100",
                       "util_pct": 20.0 if s >= 13 else 95.0})
    return tr


@pytest.mark.parametrize("trace, severities, codes", [
    (lambda: healthy(30), [], {"high": 0, "medium": 0, "low": 0}),
    (_gpu_idle, ["MEDIUM"], {"high": 0, "medium": 1, "low": 1}),
    (_contended, ["HIGH"], {"high": 1, "medium": 1, "low": 1}),
], ids=["healthy", "medium", "high"])
def test_fail_on_exit_codes(tmp_path, capsys, trace, severities, codes):
    db = _explain_db(tmp_path, trace())
    code, plain, err = run(["explain", "--db", str(db)], capsys)
    assert (code, err) == (0, "")
    code, doc, _ = run(["explain", "--db", str(db), "--json"], capsys)
    assert [c["severity"] for c in json.loads(doc)["chains"]] == severities
    for level, want in codes.items():  # the output is the same: only the exit code says
        assert run(["explain", "--db", str(db), "--fail-on", level], capsys) == (want, plain, "")
    assert run(["explain", "--db", str(db), "--json", "--fail-on", "MEDIUM"], capsys) == (codes["medium"], doc, "")


@pytest.mark.parametrize("severity, failing", [
    ("HIGH", {"high", "medium", "low"}), ("MEDIUM", {"medium", "low"}), ("LOW", {"low"})])
def test_fail_on_is_at_or_above_the_level(severity, failing):
    payload = {"chains": [{"severity": severity}]}
    assert {lvl for lvl in explain_cmd.FAIL_LEVELS if explain_cmd.failing(payload, lvl)} == failing
    assert not any(explain_cmd.failing({"chains": []}, lvl) for lvl in explain_cmd.FAIL_LEVELS)


@pytest.mark.parametrize("value", ["critical", "", "1"])
def test_bad_fail_on_is_one_line_exit_2(tmp_path, capsys, value):
    db = _explain_db(tmp_path, healthy(10))
    code, out, err = run(["explain", "--db", str(db), "--fail-on", value], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("ingero: Invalid value for '--fail-on': ")
    assert (f"{value!r} is not one of 'high', 'medium', 'low'" in err
            and err.endswith(" — see `ingero explain --help`\n"))


def test_fail_on_is_documented_with_its_exit_code():
    text = helptext(["explain"])
    assert "with --fail-on LEVEL 1 when a chain of LEVEL or above" in " ".join(text.split())


# -- check as a user other than root ------------------------------------------------------------

def test_a_check_that_may_not_read_says_what_and_that_root_is_needed(monkeypatch, tmp_path):
    from ingero import check

    def denied() -> check.Check:
        raise PermissionError(13, "Permission denied", "/sys/kernel/tracing/events")

    monkeypatch.setattr(check, "CHECKS", (check.check_kernel, denied))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    results = check.run_checks(tmp_path / "t.duckdb")
    assert [(c.name, c.ok, c.detail, c.fix) for c in results[1:2]] == [
        ("denied", False, "could not read /sys/kernel/tracing/events as uid 1000 (permission denied): "
                          "reading it needs root", "run as root: sudo ingero check")]


@pytest.mark.parametrize("args", [["--", "nosuchprog", "x"], ["--cmd", "nosuchprog x"], ["60s"]])
def test_a_command_that_is_not_there_is_one_line_exit_2_before_anything(args, capsys, tmp_path, monkeypatch):
    # (`ingero trace 60s`, for -d 60s, says it too; the database is never created)
    monkeypatch.setattr(session, "check_can_trace", lambda: None)  # as any user: the command is looked at first
    db = tmp_path / "t.duckdb"
    word = args[-1].split()[0] if args[0] == "--cmd" else args[1] if args[0] == "--" else args[0]
    code, out, err = run(["trace", "--no-serve", "--db", str(db), *args], capsys)
    assert (code, out) == (2, "")
    assert err == (f"ingero: the command {word!r} is not found or not executable — "
                   "check the command (it runs without a shell)\n")
    assert not db.exists()
