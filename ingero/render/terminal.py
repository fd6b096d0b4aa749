"""explain's terminal view: a pure function of a Report, written to a stream.

Per chain, the short form (explain's default) prints the headline with its share, the first
line of its root and of its effect, its first fixes and its evidence line; ``-v`` prints every
line.  Layout (width, colour) is render/layout.py's; every line is sanitised there."""

from __future__ import annotations

import re
from typing import IO, Any

from ingero.analyze import units
from ingero.analyze.model import Chain, Report
from ingero.render import counts, layout

INDENT = "  "


def span_text(seconds: float) -> str:
    """120 -> '2 min', 45 -> '45 s', 5400 -> '1 h 30 min'."""
    s = round(seconds)
    if s < 120:
        return f"{max(seconds, 0):.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if s < 7200:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 and s < 600 else "")
    return f"{s // 3600} h" + (f" {(s % 3600) // 60} min" if (s % 3600) // 60 else "")


def system_line(report: Report) -> str:
    sc = report.system
    parts = []
    if sc.cpu_pct is not None:
        parts.append(f"CPU: {sc.cpu_pct:.1f}%")
    if sc.mem_pct is not None:
        parts.append(f"Memory: {sc.mem_pct:.1f}%")
    if sc.load1 is not None:
        parts.append(f"Load: {sc.load1:.1f} ({sc.ncpu} cores)")
    elif sc.ncpu:
        parts.append(f"{sc.ncpu} cores")
    if sc.swap_used_bytes is not None:
        parts.append(f"Swap: {sc.swap_used_bytes / 1e6:.0f} MB")
    if sc.gpu_util_pct is not None:
        parts.append(f"GPU: {sc.gpu_util_pct:.0f}%")
    else:
        parts.append("GPU: no NVML samples")
    return "System Context: " + " | ".join(parts)


# The parts of a step, in the order a step spends them, as printed.
STEP_PARTS = (("data_wait", "data wait"), ("lock_wait", "lock wait"), ("sleep", "own sleep"),
              ("output_wait", "output wait"), ("host", "host work"), ("launch", "launches"),
              ("copy", "copies"),
              ("device_wait", "device wait"), ("other_cuda", "other CUDA"), ("cpu_wait", "CPU wait"),
              ("faults_io", "faults/I-O"))


# A server's step is a request: its data wait is the wait for the next request.
REQUEST_PARTS = {"data_wait": "waiting for a request", "host": "request path (host)"}


# The short form lists the parts of a step that take at least this share of it (-v: every part).
SHORT_MIN_PART = 0.01


def device_lines(report: Report, verbose: bool = True) -> list[str]:
    """What the device did and how the loop stepped, when known.  Untrusted text in them (an NVTX
    range's name) is sanitised where the lines are written."""
    lines = []
    d = report.device
    if d is not None:
        if d.source == "measured" and d.measured_by:
            lines.append(f"Device: busy {units.pct(d.busy_share)} (measured by {d.measured_by})")
        elif d.source == "measured":
            lines.append(f"Device: busy {units.pct(d.busy_share)} (measured: the trace's device timeline)")
        else:
            nvml = "" if d.nvml_util is None else f"; NVML {units.pct(d.nvml_util)}"
            lines.append(f"Device: busy ~{units.pct(d.busy_share)} (inferred from the CUDA calls: "
                         f"{units.pct(d.low)}-{units.pct(d.high)}{nvml})")
    for w in report.workloads:
        lines.append(f"Workload: {w.name} is an {w.kind}: {w.evidence}")
    st = report.steps
    if st is not None:
        how = {"marked": "ProfilerStep marks", "nvtx": f"NVTX ranges '{st.marker}'"}.get(
            st.source, "the rhythm of the calls")
        # (with several traced processes, whose steps: the main CUDA process')
        whose = f" of PID {st.pid}" if st.pid is not None and len(report.analysed.processes) > 1 else ""
        served = st.unit == "request"
        line = (f"{'Requests' if served else 'Steps'}{whose}: {st.count:,} (from {how}), p50 {st.median_ms:.2f} ms, "
                f"p99 {st.p99_ms:.2f} ms")
        names = dict(STEP_PARTS, **(REQUEST_PARTS if served else {}))
        parts = [f"{names[key]} {units.pct(st.breakdown[key])}" for key, _ in STEP_PARTS
                 if key in st.breakdown and (verbose or st.breakdown[key] >= SHORT_MIN_PART)]
        lines.append(line)
        if parts:
            lines.append(INDENT + f"a {st.unit}: " + " | ".join(parts))
    return lines


def analysed_line(report: Report) -> str:
    a = report.analysed
    span = (a.end_ns - a.start_ns) / 1e9
    procs = len(a.processes)
    followed = f" (+{a.followed:,} followed without CUDA calls)" if a.followed else ""  # no CUDA call: counted
    text = (
        f"Analysed: {a.events:,} events ({a.cuda_events:,} CUDA calls) from {procs} traced "
        f"process{'es' if procs != 1 else ''}{followed} over {span_text(span)} "
        f"({a.windows} window{'s' if a.windows != 1 else ''} of {span_text(a.window_s)}), session {a.session_id}; "
        f"drops: {a.drops_kernel:,} kernel, {a.drops_user:,} user"
    )
    if a.stale_calls:  # calls with no row: counted in BPF when the thread's next call came
        text += "; " + counts.stale_calls_clause(a.stale_calls)
    if a.probe_misses:
        text += "; " + counts.probe_misses_clause(a.probe_misses)
    return text


# Block labels, in the order a chain prints them.
ROOT, EFFECT, CONTRIBUTING, FIX, EVIDENCE = "Root", "Effect", "Contributing", "Fix", "Evidence"
CULPRITS = "Culprits"
SHORT_CULPRITS = 3  # named in the short form (a root's later lines name them in -v)
# The short form (explain without -v) shows this many lines of each block (a chain's lines come
# most telling first: the cause with its count, the effect with its numbers, the fix for the
# loop itself); Contributing shows none.
SHORT = {ROOT: 1, EFFECT: 1, CONTRIBUTING: 0, FIX: 3}
MORE = "ingero explain -v"  # what shows the rest, named by the short form


class _Writer:
    """Lines to a stream, each sanitised, wrapped and coloured as the view says."""

    def __init__(self, out: IO[str], view: layout.View):
        self.out, self.view = out, view

    def put(self, text: str = "", first: str = "", rest: str | None = None, *, command: bool = False,
            severity: str | None = None, keep: tuple[str, ...] = ()) -> None:
        for line in layout.lines(text, self.view, first, rest, command=command, keep=keep):
            self.out.write((layout.coloured(line, severity, self.view) if severity else line) + "\n")

    def block(self, label: str, items: list[str], column: int, *, command: bool = False) -> None:
        """``label:`` and its items, one under the other from ``column``; an item's continuation
        lines two deeper."""
        for i, item in enumerate(items):
            first = (INDENT + f"{label}:" if i == 0 else "").ljust(column)
            self.put(item, first, " " * (column + len(layout.CONTINUATION)), command=command)


def chain_measure(chain: Chain) -> str:
    """What the headline measures: the share of the loop's time the cause took over the analysed
    range (what chains are ranked by; a root's "N% of the loop's time in K of M windows" is the
    share inside its evidence windows), or a notice's own count."""
    return chain.headline or f"{units.pct(chain.share)} of the loop's time in the range"


def evidence_text(chain: Chain) -> str:
    ev = f"{len(chain.evidence_windows)} of {chain.windows_total} windows"
    if chain.correlation is not None:
        ev += f", cause/effect correlation {chain.correlation:+.2f} across {chain.windows_total} windows"
        if chain.correlation_note:
            ev += f" ({chain.correlation_note})"
    return f"{ev}  [{chain.rule_id}]"


def _write_chain(chain: Chain, w: _Writer) -> int:
    """One chain; returns how many of its lines the short form left out."""
    blocks = [(ROOT, chain.root), (EFFECT, chain.effect), (CONTRIBUTING, chain.contributing), (FIX, chain.fix)]
    hidden = 0
    if not w.view.verbose:
        hidden = sum(max(0, len(items) - SHORT[label]) for label, items in blocks)
        blocks = [(label, items[:SHORT[label]]) for label, items in blocks]
        if chain.culprits:  # who did it: the line a reader looks for (in -v, the root's own lines)
            blocks.insert(1, (CULPRITS, [_culprits(chain)]))
    shown = [(label, items) for label, items in blocks if items] + [(EVIDENCE, [evidence_text(chain)])]
    column = len(INDENT) + max(len(label) for label, _ in shown) + 2
    measure = chain_measure(chain)
    w.put(f"[{chain.severity}] {chain.title} — {measure}", rest=INDENT * 2, severity=chain.severity,
          keep=(measure,))
    for label, items in shown:
        w.block(label, items, column, command=label == FIX)
    return hidden


def _culprits(chain: Chain) -> str:
    named = [f"{c.name} ({f'TID {c.tid}' if c.tid else f'PID {c.pid}'})" for c in chain.culprits[:SHORT_CULPRITS]]
    rest = len(chain.culprits) - len(named)
    return ", ".join(named) + (f" and {rest} more" if rest > 0 else "")


def write_chain(chain: Chain, out: IO[str], view: layout.View | None = None) -> int:
    return _write_chain(chain, _Writer(out, view or layout.View()))


def write_chains(report: Report, out: IO[str], heading: str, none: str, view: layout.View | None = None,
                 more: str | None = None) -> None:
    """The report's chains under ``heading`` (``none`` when it has none), then its notes.  The short
    form ends with a line naming ``more``, the command that shows what it left out."""
    w = _Writer(out, _named(report, view or layout.View()))
    hidden = 0
    if report.chains:
        w.put(heading)
        for chain in report.chains:
            w.put()
            hidden += _write_chain(chain, w)
        w.put()
    else:
        w.put(none)
    for note in report.notes:
        w.put(note, "Note: ")
    if hidden and more:
        w.put(f"{hidden} more line{'s' if hidden != 1 else ''} (what contributed, the rest of each root, effect "
              f"and fix): {more}", keep=(more,))


def _named(report: Report, view: layout.View) -> layout.View:
    """The view, knowing the report's process names (kept whole when wrapped)."""
    names = [c.name for ch in report.chains for c in ch.culprits]
    names += [re.sub(r" \(PID \d+\)$", "", p) for p in report.analysed.processes]
    return view.with_names(names)


def _site(item: dict[str, Any]) -> str:
    where = f"{item.get('file') or '?'}:{item.get('line') or '?'}"
    text = (item.get("source") or item.get("function") or "").strip()
    return f"{where}  {text}" if text else where


def _stack_lines(stack: dict[str, Any]) -> list[str]:
    """explain --stack: top callers of CUDA ops and the most preempted source lines."""
    lines: list[str] = []
    if "note" in stack:
        lines.append(f"Stacks: {stack['note']}")
    callers = stack.get("top_callers")
    if callers is not None:
        lines.append("Top callers (CUDA time by source line):")
        for c in callers:
            lines.append(
                f"{INDENT}{_site(c)}   {c.get('op')}: {c.get('calls', 0):,} calls, "
                f"{units.ns(c.get('total_ns'))} total, max {units.ns(c.get('max_ns'))}"
            )
        if not callers:
            # no stacks, or none with a readable call site ([unreadable] innermost frames)
            lines.append(INDENT + "(no call sites in this range: stacks are recorded by `ingero trace --stack`)")
    pre = stack.get("preempted_lines")
    if pre is not None:
        lines.append("Most preempted lines:")
        for p in pre:
            lines.append(
                f"{INDENT}{_site(p)}   {p.get('preemptions', 0):,} preemptions, "
                f"{units.ns(p.get('offcpu_ns'))} off CPU"
            )
        if not pre:
            lines.append(INDENT + "(none)")
    sampled = stack.get("sampled_lines")
    if sampled:
        lines.append("Where the loop's CPU time goes outside CUDA calls (CPU samples at ~99 Hz):")
        for x in sampled:
            lines.append(f"{INDENT}{x.get('share', 0) * 100:5.1f}%  {x.get('text', '')}   "
                         f"({x.get('samples', 0):,} samples, "
                         f"{x.get('idle_samples', 0):,} with nothing queued on the GPU)")
    return lines


def write(report: Report, out: IO[str], view: layout.View | None = None, more: str | None = MORE) -> None:
    """explain's view of ``report``.  ``view``: how (default: every line, unwrapped, uncoloured: the
    text a tracer's socket, MCP and the HTML report carry); ``more``: the command the short form
    names for the rest (None: name none)."""
    view = _named(report, view or layout.View())
    w = _Writer(out, view)
    w.put(system_line(report), keep=tuple(system_line(report).split(" | ")))
    for line in device_lines(report, verbose=view.verbose):
        # the parts of a step ('other CUDA 0.0%') stay whole
        w.put(line, keep=tuple(line.split(" | ")) if " | " in line else ())
    span = (report.analysed.end_ns - report.analysed.start_ns) / 1e9
    write_chains(report, out, f"Causal Chains (last {span_text(span)}):",
                 "No causal chains: nothing on the host explains a slowdown in this range.", view, more)
    if report.stack is not None:
        for line in _stack_lines(report.stack):
            w.put(line)
    w.put(analysed_line(report))
    if not report.chains and report.analysed.processes:
        w.put("Processes: " + ", ".join(report.analysed.processes[:8]))


__all__ = ["write", "span_text", "units"]
