"""The HTML report's verdicts: one card per chain, the run's header, and before/after, from explain's model.

Pure functions of ``Report`` objects (never of explain's terminal text), so the
page says what ``explain --json`` says.  Every string that reaches the page
goes through ``esc``: process names, command lines and paths come from the
trace and are untrusted.
"""

from __future__ import annotations

import html
import re
from datetime import datetime, timezone

from ingero.analyze import units
from ingero.analyze.model import Chain, Report
from ingero.render import safe

# A fix line is "command   (why)" or prose; the part before three spaces is the command when it
# reads as one: a program the rules name (taskset, renice, ...), a shell loop, an assignment
# (resources.limits.cpu: "1500m", KEY=value) or a call (DataLoader(...)).
_COMMAND = re.compile(
    r"^(?:(?:sudo|taskset|renice|ionice|nice|chrt|numactl|for|echo|docker|systemctl|kubectl|py-spy|nsys|"
    r"perf|ingero|python3?|torchrun|export|sysctl|ulimit|ip|ethtool|swapoff|mount)\s"
    r"|[A-Za-z_][\w.]*\(|[A-Za-z_][\w.]*:\s|[A-Z_][A-Z0-9_]*=)")
# How many fix lines a card shows before "more": the card must fit above the fold.
FIX_SHOWN = 1
SEV_CLASS = {"HIGH": "high", "MEDIUM": "medium", "LOW": "low"}


def esc(text: object) -> str:
    """Trace text for the page: non-printable characters shown escaped (``\\x1b``, ``\\u202e``: a bidi
    override would reorder what the reader sees), then HTML-escaped."""
    return html.escape(safe.text(text), quote=True)


def clock(ns: int, ms: bool = False) -> str:
    """UTC wall clock of epoch nanoseconds: 'HH:MM:SS' (with '.mmm' when ``ms``)."""
    t = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return t.strftime("%H:%M:%S.%f")[:-3] if ms else t.strftime("%H:%M:%S")


def date(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def split_fix(line: str) -> tuple[str | None, str]:
    """(command, why) of a fix line; (None, line) for prose."""
    head, sep, why = line.partition("   ")
    if _COMMAND.match(head):
        return head.strip(), why.strip().removeprefix("(").removesuffix(")") if sep else ""
    return None, line


def measure(chain: Chain) -> str:
    return chain.headline or f"explains {units.pct(chain.share)} of wall clock"


def _culprits(chain: Chain) -> str:
    """The named causes, one entry per name: "cpu-hog (PID 4301, 4302, 4300)"."""
    by_name: dict[str, list] = {}
    for c in chain.culprits:
        by_name.setdefault(c.name, []).append(c)
    parts = []
    for name, cs in by_name.items():
        pids = ", ".join(str(c.pid) + (f" thread {c.tid}" if c.tid else "") for c in cs)
        detail = cs[0].detail + (" each" if len(cs) > 1 and all(c.detail == cs[0].detail for c in cs) else "")
        parts.append(f"<span title='{esc(detail)}'>{esc(name)} (PID {esc(pids)})</span>")
    return ", ".join(parts)


def _fix_line(line: str) -> str:
    cmd, why = split_fix(line)
    if cmd is None:
        return f"<li class='prose'>{esc(line)}</li>"
    note = f"<span class='why'>{esc(why)}</span>" if why else ""
    return (f"<li><span class='cmdrow'><code class='cmd'>{esc(cmd)}</code>"
            f"<button type='button' class='copy' title='copy the command'>copy</button></span>{note}</li>")


def card(chain: Chain, i: int) -> str:
    sev = SEV_CLASS.get(chain.severity, "low")
    share = min(1.0, max(0.0, chain.share))
    meter = "" if chain.headline else f"<span class='meter'><span style='width:{share * 100:.1f}%'></span></span>"
    rows = [f"<p class='root'><b>Root</b> {esc(chain.root[0])}</p>" if chain.root else ""]
    if chain.culprits:
        rows.append(f"<p class='culprit'><b>Culprit</b> {_culprits(chain)}</p>")
    if chain.effect:
        rows.append(f"<p class='effect'><b>Effect</b> {esc(chain.effect[0])}</p>")
    # the commands first: the card's copyable fix is the first command the rule gives
    order = sorted(chain.fix, key=lambda ln: split_fix(ln)[0] is None)
    shown, rest = order[:FIX_SHOWN], order[FIX_SHOWN:]
    fix = "".join(_fix_line(ln) for ln in shown)
    more = [*(_fix_line(ln) for ln in rest)]
    extra = [f"<p><b>Root</b> {esc(r)}</p>" for r in chain.root[1:]]
    extra += [f"<p><b>Effect</b> {esc(e)}</p>" for e in chain.effect[1:]]
    extra += [f"<p><b>Contributing</b> {esc(c)}</p>" for c in chain.contributing]
    ev = f"{len(chain.evidence_windows)} of {chain.windows_total} windows"
    if chain.correlation is not None:
        ev += f", correlation {chain.correlation:+.2f}" + (f" ({esc(chain.correlation_note)})"
                                                         if chain.correlation_note else "")
    extra.append(f"<p><b>Evidence</b> {ev}</p>")
    details = (f"<details><summary>more: {len(rest)} fix line{'s' if len(rest) != 1 else ''}, the evidence"
               f"</summary>{'<ul class=fix>' + ''.join(more) + '</ul>' if more else ''}{''.join(extra)}</details>")
    return (f"<article class='card {sev}' id='chain-{i}' data-rule='{esc(chain.rule_id)}'>"
            f"<div class='head'><span class='sev'>{esc(chain.severity)}</span>"
            f"<span class='rule'>#{i} {esc(chain.rule_id)}</span><span class='share'>{esc(measure(chain))}</span>"
            f"{meter}</div><h3>{esc(chain.title)}</h3>{''.join(rows)}"
            f"<div class='fixbox'><b>Fix</b><ul class='fix'>{fix}</ul></div>{details}</article>")


def cards(report: Report) -> str:
    if not report.chains:
        a = report.analysed
        return (f"<section id='verdicts' class='cards'><article class='card ok'><h3>No causal chains</h3>"
                f"<p>{a.events:,} events ({a.cuda_events:,} CUDA calls) of {len(a.processes)} traced process"
                f"{'es' if len(a.processes) != 1 else ''} over {a.windows} windows: nothing explains lost time."
                f"</p></article></section>")
    return "<section id='verdicts' class='cards'>" + "".join(
        card(c, i) for i, c in enumerate(report.chains, 1)) + "</section>"


def speedup(before: float, after: float, lower_is_better: bool) -> str:
    """'2.42× faster (−59%)', '1.10× slower (+10%)', 'unchanged'."""
    if before <= 0 or after <= 0:
        return ""
    change = after / before - 1
    if abs(change) < 0.005:
        return "unchanged"
    better = change < 0 if lower_is_better else change > 0
    factor = max(before, after) / min(before, after)
    sign = "−" if change < 0 else "+"
    return f"{factor:.2f}× {'faster' if better else 'slower'} ({sign}{abs(change) * 100:.0f}%)"


def _chain_list(report: Report) -> str:
    if not report.chains:
        return "no causal chains"
    return "<br>".join(f"<span class='sev-{SEV_CLASS.get(c.severity, 'low')}'>[{esc(c.severity)}]</span> "
                       f"{esc(c.rule_id)}: {esc(measure(c))}" for c in report.chains)


def _calls_per_s(report: Report) -> float:
    a = report.analysed
    span = (a.end_ns - a.start_ns) / 1e9
    return a.cuda_events / span if span > 0 else 0.0


def before_after(before: Report, after: Report, after_label: str) -> str:
    """The table of the slow run against the fixed one (the demo's two runs)."""
    rows = []
    bs, as_ = before.steps, after.steps
    if bs is not None and as_ is not None:
        unit = bs.unit
        for label, b, a in ((f"{unit} time, median", bs.median_ms, as_.median_ms),
                            (f"{unit} time, p99", bs.p99_ms, as_.p99_ms)):
            rows.append((label, f"{b:,.2f} ms", f"{a:,.2f} ms", speedup(b, a, True)))
    b_ops, a_ops = _calls_per_s(before), _calls_per_s(after)
    rows.append(("CUDA calls/s", f"{b_ops:,.0f}/s", f"{a_ops:,.0f}/s", speedup(b_ops, a_ops, False)))
    if before.device is not None and after.device is not None:
        rows.append(("device busy", units.pct(before.device.busy_share), units.pct(after.device.busy_share), ""))
    body = "".join(f"<tr><th>{esc(r[0])}</th><td>{esc(r[1])}</td><td>{esc(r[2])}</td><td>{esc(r[3])}</td></tr>"
                   for r in rows)
    body += f"<tr><th>chains</th><td>{_chain_list(before)}</td><td>{_chain_list(after)}</td><td></td></tr>"
    return (f"<table class='ba'><thead><tr><th></th><th>before (slow run)</th><th>after ({esc(after_label)})</th>"
            f"<th>change</th></tr></thead><tbody>{body}</tbody></table>")
