"""Issue 42, explain's text: the short form and -v, wrapping to a width, severity colour only on a
terminal without NO_COLOR, one name per process, the late syncs as a total over a count, the demo's
before/after wording and the explain command that reprints the demo's numbers."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyze_helpers import MAIN_PID, T0, Trace
from ingero.cli import cli
from ingero.render import demo as render_demo
from ingero.render import json as render_json
from ingero.render import layout, terminal
from test_explain import contended

HOG = 7100  # a hog that named itself: comm 'cpu-hog', readable name from its command line
HOG_NAME = "python3 (-m ingero.demo.interference)"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def text_of(report, view: layout.View, more: str | None = terminal.MORE) -> str:
    out = io.StringIO()
    terminal.write(report, out, view, more=more)
    return out.getvalue()


@pytest.fixture(scope="module")
def report():
    return contended().explain()


SHORT_CHAIN = """\
[HIGH] CPU scheduling contention → CUDA calls delayed — 29.5% of the loop's time in the range
  Root:     884 involuntary context switches on python3 (train.py) (PID 4242)
  Culprits: stress (PID 7000)
  Effect:   CUDA ops/s down 33.3% from clean windows (1,386 → 924)
  Fix:      taskset -c 1 python3 train.py   (give the loop its own core)
            taskset -acp 1 4242   (the same for the running process)
            taskset -acp 0 7000   (keep stress off it)
  Evidence: 10 of 28 windows, cause/effect correlation -1.00 across 28 windows (CUDA ops/s fall as
              CPU wait rises)  [cpu-contention]

5 more lines (what contributed, the rest of each root, effect and fix): ingero explain -v
"""

VERBOSE_CHAIN = """\
[HIGH] CPU scheduling contention → CUDA calls delayed — 29.5% of the loop's time in the range
  Root:         884 involuntary context switches on python3 (train.py) (PID 4242)
                waiting for a CPU 8.8 s of 10.0 s (88.3% of the loop's time in 10 of 28 windows)
                CPU taken by stress (PID 7000)
  Effect:       CUDA ops/s down 33.3% from clean windows (1,386 → 924)
  Contributing: 1 busy process (stress) on 2 cores
                preempted 10.0 ms inside syncs that spin or yield: 0 ns while the GPU was still busy \
(no delay, not counted), 10.0 ms right before the sync returned (the GPU finished meanwhile: 1 sync \
returned 5.0 ms late in total, 5.0 ms each on average)
  Fix:          taskset -c 1 python3 train.py   (give the loop its own core)
                taskset -acp 1 4242   (the same for the running process)
                taskset -acp 0 7000   (keep stress off it)
                renice -n 19 -p 7000
  Evidence:     10 of 28 windows, cause/effect correlation -1.00 across 28 windows \
(CUDA ops/s fall as CPU wait rises)  [cpu-contention]

Analysed:"""


def test_the_short_form_is_the_headline_root_effect_fixes_and_evidence(report):
    text = text_of(report, layout.View(verbose=False, width=100))
    assert text.startswith("System Context: CPU: 91.0% | Memory: 40.0% | Load: 6.1 (2 cores) | Swap: 0 MB | "
                           "GPU: no NVML samples\n"
                           "Device: busy ~80.7% (inferred from the CUDA calls: 54.9%-100.0%)\n"
                           "Steps: 886 (from the rhythm of the calls), p50 30.05 ms, p99 45.28 ms\n"
                           # the short form lists the parts of at least 1% of a step
                           "  a step: host work 14.6% | device wait 53.0% | CPU wait 31.6%\n"
                           "Causal Chains (last 30 s):\n\n")
    assert SHORT_CHAIN in text
    assert text.endswith("Analysed: 38,804 events (37,254 CUDA calls) from 1 traced process over 30 s "
                         "(30 windows of 1 s),\n  session 1; drops: 0 kernel, 0 user\n")


def test_verbose_shows_every_line_and_every_step_part(report):
    text = text_of(report, layout.View(verbose=True, width=None))
    assert VERBOSE_CHAIN in text
    assert ("  a step: data wait 0.0% | lock wait 0.0% | own sleep 0.0% | output wait 0.0% | host work 14.6% | "
            "launches 0.7% | copies 0.1% | device wait 53.0% | other CUDA 0.0% | CPU wait 31.6% | "
            "faults/I-O 0.0%\n") in text
    assert "more line" not in text  # nothing left out: no pointer to -v


def test_the_default_view_is_every_line_unwrapped_for_the_socket_mcp_and_the_html_report(report):
    out = io.StringIO()
    terminal.write(report, out)
    assert VERBOSE_CHAIN in out.getvalue()
    assert render_json.explain_payload(report)["text"] == text_of(report, layout.View(), more=None)


@pytest.mark.parametrize("width", [40, 60, 80, 100, 132])
def test_wrapped_to_the_width_never_inside_a_number_a_name_or_a_command(report, width):
    text = text_of(report, layout.View(verbose=True, width=width))
    lines = text.splitlines()
    # a line runs past the width only when it holds one piece that cannot break (a fix's command,
    # a name with its PID, the headline's share) and no room is left beside it
    whole = {"taskset -c 1 python3 train.py", "python3 (train.py) (PID 4242)", "29.5% of the loop's time in the range"}
    long = [re.sub(r"^\s*(\w+:)?\s*", "", line) for line in lines if len(line) > width]
    assert set(long) <= whole, long
    assert long == [] or width < 60
    # the same words in the same order: wrapping only moved line breaks
    assert text.split() == text_of(report, layout.View(verbose=True, width=None)).split()
    for line in lines:
        # a continuation starts two deeper than its item, never with a unit or a PID's number
        assert not re.match(r"\s*(ms|s|µs|%|\d+\))\b", line), line
        assert not line.endswith(("(PID", " python3")), line
    joined = "\n".join(lines)
    for whole in ("884 involuntary", "8.8 s", "10.0 ms", "python3 (train.py) (PID 4242)", "stress (PID 7000)",
                  "taskset -c 1 python3 train.py", "taskset -acp 0 7000", "renice -n 19 -p 7000", "1,386"):
        assert whole in joined, (whole, width)


def test_continuation_lines_are_indented_under_their_item():
    view = layout.View(width=40)
    assert layout.lines("one two three four five six seven eight nine ten eleven", view, "  Root:   ",
                        " " * 12) == ["  Root:   one two three four five six",
                                      "            seven eight nine ten eleven"]
    assert layout.lines("  a step: aaaa bbbb cccc dddd eeee ffff gggg hhhh", view) == [
        "  a step: aaaa bbbb cccc dddd eeee ffff", "    gggg hhhh"]
    # a number and its unit, a PID, a command: kept whole, a command even past the width
    assert layout.lines("waited for a CPU 12345678901234567890 12.4 s of it", view) == [
        "waited for a CPU 12345678901234567890", "  12.4 s of it"]
    assert layout.lines("taskset -acp 0 101 102 103 104 105 106 107 108   (keep them off it)", view,
                        command=True) == ["taskset -acp 0 101 102 103 104 105 106 107 108", "  (keep them off it)"]


def test_colour_only_on_a_terminal_without_no_color(report):
    view = layout.for_stream(Tty(), verbose=False)
    assert view.colour is layout.colour_wanted(Tty()) and view.width >= layout.MIN_WIDTH
    assert layout.colour_wanted(Tty(), {"TERM": "xterm"}) is True
    assert layout.colour_wanted(Tty(), {"TERM": "xterm", "NO_COLOR": "1"}) is False
    assert layout.colour_wanted(Tty(), {"TERM": "xterm", "NO_COLOR": ""}) is True  # no-color.org: set and not empty
    assert layout.colour_wanted(Tty(), {"TERM": "dumb"}) is False
    assert layout.colour_wanted(io.StringIO(), {"TERM": "xterm"}) is False  # a pipe or a file
    coloured = text_of(report, layout.View(verbose=False, width=100, colour=True))
    assert "\x1b[1;31m[HIGH]\x1b[0m CPU scheduling contention" in coloured
    # the colours are the only escapes, and take no columns: the text is the plain one around them
    assert coloured.replace("\x1b[1;31m", "").replace(layout.RESET, "") == text_of(
        report, layout.View(verbose=False, width=100))
    assert layout.coloured("[MEDIUM] x", "MEDIUM", layout.View(colour=True)) == "\x1b[1;33m[MEDIUM]\x1b[0m x"
    assert layout.coloured("[LOW] x", "LOW", layout.View(colour=True)) == "\x1b[2m[LOW]\x1b[0m x"


def test_width_is_the_terminals_and_100_elsewhere(monkeypatch):
    monkeypatch.setenv("COLUMNS", "72")
    assert layout.width_of(Tty()) == 72
    assert layout.width_of(io.StringIO()) == layout.DEFAULT_WIDTH == 100  # not a terminal: COLUMNS aside
    monkeypatch.setenv("COLUMNS", "12")
    assert layout.width_of(Tty()) == layout.MIN_WIDTH


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "ingero.duckdb"
    contended().store(path).close()
    return path


def test_cli_short_by_default_v_for_every_line_and_never_colour_in_a_pipe(db: Path):
    runner = CliRunner()
    short = runner.invoke(cli, ["explain", "--db", str(db)], env={"NO_COLOR": None, "TERM": "xterm"})
    assert short.exit_code == 0, short.output
    assert SHORT_CHAIN in short.output and "\x1b" not in short.output
    for flag in ("-v", "--verbose"):
        full = runner.invoke(cli, ["explain", "--db", str(db), flag])
        assert full.exit_code == 0, full.output
        assert "  Contributing: 1 busy process (stress) on 2 cores\n" in full.output
        assert "more line" not in full.output
        assert max(len(line) for line in full.output.splitlines()) <= 100  # a pipe: 100 columns
    as_json = runner.invoke(cli, ["explain", "--db", str(db), "--json", "-v"])
    assert "\x1b" not in as_json.output and json.loads(as_json.output)["chains"][0]["rule_id"] == "cpu-contention"


def test_a_tracers_reply_is_laid_out_by_the_client_from_its_json(db: Path, report, monkeypatch):
    # the tracer renders every line unwrapped; the client lays it out again for its own terminal
    from ingero.daemon import client
    from ingero.store import db as store_db

    def locked(*a, **k):
        raise store_db.DatabaseLocked(db, "Conflicting lock is held")

    payload = json.loads(json.dumps(render_json.explain_payload(report), default=str))  # through the socket
    monkeypatch.setattr(store_db.Store, "open", classmethod(lambda cls, *a, **k: locked()))
    monkeypatch.setattr(client, "find_socket", lambda path, **kw: Path("/run/ingero.sock"))
    monkeypatch.setattr(client, "explain", lambda **kw: payload)
    res = CliRunner().invoke(cli, ["explain", "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert res.output == text_of(report, layout.View(verbose=False, width=100))


def test_from_dict_rebuilds_the_report(report):
    doc = render_json.to_dict(report)
    again = render_json.from_dict(json.loads(json.dumps(doc, default=str)))
    assert render_json.to_dict(again) == json.loads(json.dumps(doc, default=str))
    with pytest.raises(ValueError):
        render_json.from_dict({**doc, "format_version": 99})
    with pytest.raises(TypeError):
        render_json.from_dict({k: v for k, v in doc.items() if k != "analysed"})


def named_hog() -> Trace:
    """A hog whose comm ('cpu-hog', set with prctl) is not its readable name."""
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.name(HOG, HOG_NAME, "cpu-hog", "python3 -m ingero.demo.interference cpu-hog 0")
    tr.loop(0, 10).loop(10, 20, preempt_ms=40, preempt_by=HOG).loop(20, 30)
    return tr.competitor(HOG, "cpu-hog", 10, 20).system(0, 30, cpu_pct=91.0, load1=6.1)


def test_one_name_per_process_everywhere_in_the_output():
    report = named_hog().explain()
    text = text_of(report, layout.View(verbose=True, width=None))
    chain = report.chains[0]
    assert chain.rule_id == "cpu-contention"
    assert "cpu-hog" not in text  # its comm is never a second name for it
    assert f"CPU taken by {HOG_NAME} (PID {HOG})" in chain.root
    assert f"1 busy process ({HOG_NAME}) on 2 cores" in chain.contributing
    assert f"taskset -acp 0 {HOG}   (keep {HOG_NAME} off it)" in chain.fix
    assert [c.name for c in chain.culprits] == [HOG_NAME]


def test_the_two_shares_of_a_chain_are_named_by_what_they_measure(report):
    chain = report.chains[0]
    assert terminal.chain_measure(chain) == "29.5% of the loop's time in the range"
    assert chain.root[1] == "waiting for a CPU 8.8 s of 10.0 s (88.3% of the loop's time in 10 of 28 windows)"


@pytest.mark.parametrize(("before", "after", "smaller", "says"), [
    (34.51, 14.07, "faster", "2.45× faster (−59%)"),  # a step time: issue 42's example
    (14.07, 34.51, "faster", "2.45× slower (+145%)"),
    (12.52, 34.89, "slower", "2.79× faster (+179%)"),  # steps/s: more is faster
    (34.89, 12.52, "slower", "2.79× slower (−64%)"),
    (99.93, 126.10, "shorter", "1.26× longer (+26%)"),  # a wait
    (16.96, 16.96, "shorter", "no change"),
    (10.0, 27.9, None, "+17.9 points"),  # a share
    (44.8, 44.8, None, "no change"),
    (0.0, 5.0, "faster", ""),
])
def test_speed_ups_say_how_many_times_faster_and_the_change(before, after, smaller, says):
    assert render_demo.change_text(before, after, smaller) == says


def test_before_after_is_aligned_with_a_unit_on_every_row():
    before = {"step_ms_mean": 34.51, "step_ms_p99": 191.93, "sync_ms_p99": 99.93, "steps_per_s": 12.52,
              "device_busy_pct": 10.0}
    after = {"step_ms_mean": 14.07, "step_ms_p99": 1809.55, "sync_ms_p99": 8.74, "steps_per_s": 34.89,
             "device_busy_pct": 27.9}
    assert render_demo.before_after(before, after) == [
        "                      before             after          change",
        "  step time (mean)     34.51 ms          14.07 ms       2.45× faster (−59%)",
        "  step time (p99)     191.93 ms       1,809.55 ms       9.43× slower (+843%)",
        "  sync p99             99.93 ms           8.74 ms       11.43× shorter (−91%)",
        "  throughput           12.52 steps/s     34.89 steps/s  2.79× faster (+179%)",
        "  device busy           10.0 %            27.9 %        +17.9 points",
    ]


def test_the_demo_names_the_explain_that_prints_its_numbers():
    cmd = render_demo.explain_command(Path("/tmp/cpu.duckdb"), 1_796_184_393_116_334_058)
    assert cmd == "ingero explain --db /tmp/cpu.duckdb --from 1796184393.116334058"
    assert render_demo.explain_command(Path("/tmp/a b.duckdb"), None) == "ingero explain --db '/tmp/a b.duckdb'"
    assert render_demo.explain_command(None, 5) is None
    # and that --from reads back to the nanosecond the demo's explain started at
    from ingero.values import parse_time
    assert parse_time("1796184393.116334058") == 1_796_184_393_116_334_058
    assert parse_time("1796184393.5") == 1_796_184_393_500_000_000


def test_the_demo_explain_command_reprints_the_demos_numbers(tmp_path: Path):
    # the demo explains from the loop's first step (runner.explain_db); the command it prints
    # must give the same text, not the whole session's
    from ingero.demo import runner

    path = tmp_path / "kept.duckdb"
    named_hog().store(path).close()
    from_ns = T0 + 3 * 10**9 + 123_456_789  # the loop's first step: between whole seconds
    report, _ = runner.explain_db(path, from_ns)
    cmd = render_demo.explain_command(path, from_ns)
    args = cmd.split()[1:]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert res.output == text_of(report, layout.View(verbose=False, width=100))
    whole = CliRunner().invoke(cli, ["explain", "--db", str(path)])
    assert whole.output != res.output  # the range matters: the whole session reads other numbers


def test_with_colour_on_the_only_escapes_are_the_severity_colours():
    # a process named with escapes is shown escaped (render/safe.py) before the colours go in
    from test_safe_text import SHOWN, hostile_trace

    text = text_of(hostile_trace().explain(), layout.View(verbose=True, width=80, colour=True))
    plain = text.replace("\x1b[1;31m", "").replace("\x1b[1;33m", "").replace("\x1b[2m", "").replace(layout.RESET, "")
    assert text != plain and "\x1b" not in plain
    assert [c for c in plain if not c.isprintable() and c != "\n"] == []
    assert SHOWN in plain  # (it holds no space: never broken)
