"""One self-contained HTML page: why the loop was slow first, then when.

Top to bottom: the run (command, host, date), a verdict card per chain
(report_cards.py), where each step's time went window by window, the loop
thread's timeline over a few steps (report_timeline.py), before/after when
the demo ran both, then per traced process its metrics per window.  A series
that stays within FLAT_SHARE of its mean is stated as one number, not drawn.
Times on the axes are UTC wall clock.

The plotly JavaScript is inlined from the plotly package (no network: the page
opens offline and fetches nothing).  Each chain's evidence windows are shaded
on the charts of the processes it affects.  Strings from the trace are
escaped for HTML, and for plotly (which reads a subset of HTML in names and
hover text, and shows entities as their characters).
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from ingero.analyze import units
from ingero.analyze.model import Report
from ingero.analyze.traced_steps import PARTS
from ingero.export import report_cards as rc
from ingero.export.report_data import Charts, Series
from ingero.export.report_timeline import ON_CPU, RUNNABLE, Timeline
from ingero.render import safe

# (row title, [(metric, legend label)]) in display order; a row without data is left out.
ROWS = (
    ("CUDA ops/s", [("ops_s", "ops/s")]),
    ("latency p50 / p99 (ms)", [("sync_p50", "sync p50"), ("sync_p99", "sync p99"), ("copy_p50", "copy p50"),
                                ("copy_p99", "copy p99"), ("launch_p50", "launch p50"),
                                ("launch_p99", "launch p99")]),
    ("loop thread off CPU (share)", [("preempted", "preempted"), ("blocked", "blocked")]),
    ("page faults/s", [("faults_s", "faults/s")]),
    ("block I/O p99 (ms)", [("bio_p99", "block I/O p99")]),
    ("RSS (MB)", [("rss_mb", "RSS")]),
    ("GPU util %", [("gpu_util", "GPU util")]),
)
# One colour per series on the whole page (p99 dashed beside its p50).
COLOURS = {"ops_s": "#1f77b4", "sync_p50": "#d62728", "sync_p99": "#ff7f7f", "copy_p50": "#9467bd",
           "copy_p99": "#c5b0d5", "launch_p50": "#8c564b", "launch_p99": "#c49c94", "preempted": "#e377c2",
           "blocked": "#7f7f7f", "faults_s": "#bcbd22", "bio_p99": "#17becf", "rss_mb": "#ff7f0e",
           "gpu_util": "#2ca02c"}
PART_LABELS = {"data_wait": "data wait (asleep outside CUDA)",
               "lock_wait": "lock wait (a lock or the GIL another thread held)",
               "sleep": "own sleep (time.sleep: its own timer)",
               "output_wait": "output wait (writing into a full pipe or socket)",
               "host": "host work (on CPU outside CUDA)",
               "launch": "kernel launches", "copy": "copies", "device_wait": "device wait (in syncs)",
               "other_cuda": "other CUDA calls", "cpu_wait": "CPU wait (runnable, off CPU)",
               "faults_io": "page faults and I/O"}
PART_COLOURS = {"data_wait": "#17becf", "lock_wait": "#e377c2", "sleep": "#aec7e8", "output_wait": "#98df8a",
                "host": "#1f77b4", "launch": "#8c564b",
                "copy": "#9467bd",
                "device_wait": "#2ca02c", "other_cuda": "#bcbd22", "cpu_wait": "#d62728", "faults_io": "#ff7f0e"}
STATE_COLOURS = {ON_CPU: "#2ca02c", RUNNABLE: "#ff7f0e", "in a kernel launch": "#8c564b", "in a copy": "#9467bd",
                 "in a sync (waiting for the device)": "#1f77b4", "in a collective (NCCL)": "#17becf",
                 "in another CUDA call": "#bcbd22"}
# the processes that preempt the loop, in order of first appearance; then blocked states
PREEMPT_COLOURS = ("#d62728", "#e377c2", "#ff9896", "#c7254e", "#f7b6d2", "#a0522d")
BLOCKED_COLOURS = ("#7f7f7f", "#a6a6a6", "#525252", "#c7c7c7")
SHADE = {"HIGH": "rgba(220,40,40,0.16)", "MEDIUM": "rgba(240,150,0,0.16)", "LOW": "rgba(120,120,120,0.12)"}
# A series whose range (max - min over its windows) is at most this share of its mean is a flat
# line: RSS of a loop that allocates once moved 30.12-30.16 MB (0.13%), which drawn alone
# reads as a trend.
FLAT_SHARE = 0.01
CHART_CONFIG = {"displaylogo": False, "responsive": True,
                "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"]}

_STYLE = """*{box-sizing:border-box}body{font:14px/1.4 system-ui,sans-serif;margin:0 auto;padding:12px 20px;
max-width:1280px;color:#222}h1{font-size:20px;margin:0}h2{font-size:16px;margin:22px 0 4px}
header.run{display:flex;flex-wrap:wrap;gap:4px 18px;align-items:baseline;border-bottom:1px solid #ddd;
padding-bottom:6px}
header.run span{color:#555;overflow-wrap:anywhere}header.run b{color:#222;font-weight:600}
.summary{margin:6px 0;color:#333}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(370px,1fr));gap:10px;margin-top:8px}
.card{border:1px solid #ddd;border-left:6px solid #999;border-radius:4px;padding:8px 10px;font-size:13px;min-width:0}
.card.high{border-left-color:#d62728}.card.medium{border-left-color:#f0a000}.card.low{border-left-color:#999}
.card.ok{border-left-color:#2ca02c}.card h3{font-size:15px;margin:4px 0}.card p{margin:3px 0;overflow-wrap:anywhere}
.head{display:flex;gap:8px;align-items:center;flex-wrap:wrap}
.sev{font-weight:700;padding:0 6px;border-radius:3px;color:#fff;background:#999}
.high .sev{background:#d62728}.medium .sev{background:#c98500}.rule{color:#555}.share{font-weight:600}
.meter{flex:1;min-width:60px;height:8px;background:#eee;border-radius:4px;overflow:hidden}
.meter span{display:block;height:100%;background:#d62728}.medium .meter span{background:#f0a000}
.low .meter span{background:#999}
ul.fix{margin:2px 0;padding-left:0;list-style:none}ul.fix li{margin:3px 0;overflow-wrap:anywhere}
.cmdrow{display:flex;gap:6px;align-items:flex-start}
code.cmd{flex:1;min-width:0;display:block;background:#f4f4f4;border:1px solid #e2e2e2;padding:2px 5px;
font:12px ui-monospace,monospace;white-space:pre-wrap;overflow-wrap:anywhere;user-select:all}
button.copy{font-size:11px;padding:1px 6px;cursor:pointer}.why{color:#555;font-size:12px}
.fixbox>b{display:block}details{margin-top:4px;color:#333}summary{cursor:pointer;color:#555}
.chart{width:100%;min-width:0}.flat{color:#333;margin:4px 0 0 0;padding-left:18px}
.note{color:#555;font-size:13px;overflow-wrap:anywhere}
table.ba{border-collapse:collapse;margin:6px 0;font-size:13px}
table.ba th,table.ba td{border-bottom:1px solid #e5e5e5;padding:3px 10px;text-align:left;vertical-align:top;
overflow-wrap:anywhere}
table.ba td:nth-child(2),table.ba td:nth-child(3){font-variant-numeric:tabular-nums}
.sev-high{color:#d62728;font-weight:600}.sev-medium{color:#c98500;font-weight:600}.sev-low{color:#777}"""

_SCRIPT = """document.addEventListener('click', function (e) {
  var b = e.target.closest('button.copy'); if (!b) return;
  var code = b.parentElement.querySelector('code'), text = code.textContent;
  function done() { b.textContent = 'copied'; setTimeout(function () { b.textContent = 'copy'; }, 1500); }
  function select() {
    var r = document.createRange(); r.selectNodeContents(code);
    var s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
    try { if (document.execCommand('copy')) done(); } catch (err) {}
  }
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, select);
  else select();
});"""


# Every report begins with these characters: how --force knows a file is an earlier report of ours.
PREFIX = "<!DOCTYPE html><html><head><meta charset='utf-8'><title>ingero report: session "


def is_ours(path: Path) -> bool:
    """Whether the regular file at ``path`` is a report ingero wrote (it begins with PREFIX)."""
    with open(path, "rb") as f:
        return f.read(len(PREFIX)) == PREFIX.encode()


def esc(text: object) -> str:
    """Trace text for the page: non-printable characters shown escaped (``\\x1b``, ``\\u202e``: a bidi
    override would reorder what the reader sees), then HTML-escaped."""
    return html.escape(safe.text(text), quote=True)


def is_flat(values: list[float | None]) -> bool:
    v = [x for x in values if x is not None]
    if len(v) < 2:
        return True
    return max(v) - min(v) <= FLAT_SHARE * abs(sum(v) / len(v))


def _x(ns: float) -> str:
    """A plotly date (UTC, read as given: no time zone is applied)."""
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _number(v: float) -> str:
    a = abs(v)
    return f"{v:,.0f}" if a >= 100 else f"{v:,.2f}" if a >= 1 else f"{v:.3g}"


class Page:
    """The charts written so far: ids, and how many of each kind (write() returns the total)."""

    def __init__(self) -> None:
        self.n = 0

    def figure(self, fig, kind: str, series: list[str]) -> str:
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{self.n}", config=CHART_CONFIG)
        self.n += 1
        return f"<div class='chart {kind}' data-series='{esc(','.join(series))}'>{div}</div>\n"


def write(report: Report, charts: Charts, out: IO[str], *, timeline: Timeline | None = None,
          after: Report | None = None, after_label: str = "the fixed run") -> int:
    """Write the page; return the number of charts on it."""
    from plotly.offline import get_plotlyjs

    a = report.analysed
    page = Page()
    out.write(f"{PREFIX}{a.session_id}</title><meta name='viewport' content='width=device-width'>"
              f"<style>{_STYLE}</style>\n<script>{get_plotlyjs()}</script></head><body>\n")
    out.write(_header(report, charts))
    out.write(rc.cards(report))
    out.write(_summary(report))
    if charts.steps is not None:
        out.write(_steps_section(report, charts, page))
    if timeline is not None and timeline.bars:
        out.write(_timeline_section(timeline, page))
    if after is not None:
        out.write(_before_after_section(report, after, after_label, page))
    for s in charts.processes:
        out.write(_process_section(s, charts, report, page))
    out.write(_footer(report))
    out.write(f"<script>{_SCRIPT}</script></body></html>\n")
    return page.n


def _header(report: Report, charts: Charts) -> str:
    a = report.analysed
    s = charts.session
    items = ["<h1>ingero report</h1>"]
    if s is not None:
        if s.targets:
            items.append(f"<span>traced <b>{esc(s.targets)}</b></span>")
        if s.command:
            items.append(f"<span>by <code>{esc(s.command)}</code></span>")
        host = esc(s.hostname) + (f" (kernel {esc(s.kernel)})" if s.kernel else "")
        items.append(f"<span>on <b>{host}</b></span>")
        ended = s.ended_ns or a.end_ns
        items.append(f"<span><b>{rc.date(s.started_ns)}</b>, {units.ns(ended - s.started_ns)}</span>")
        if s.ingero_version:
            items.append(f"<span>ingero {esc(s.ingero_version)}</span>")
    span = (f"analysed {rc.clock(a.start_ns)}–{rc.clock(a.end_ns)} UTC, {a.windows} windows of "
            f"{a.window_s:g} s, session {a.session_id}")
    items.append(f"<span>{span}</span>")
    return "<header class='run'>" + "".join(items) + "</header>\n"


def _summary(report: Report) -> str:
    parts = []
    st = report.steps
    if st is not None:
        parts.append(f"{st.count:,} {st.unit}s, median {st.median_ms:,.2f} ms, p99 {st.p99_ms:,.2f} ms "
                     f"({'from ' + esc(st.marker) + ' ranges' if st.marker else esc(st.source or 'rhythm')})")
    d = report.device
    if d is not None:
        parts.append(f"device busy {'~' if d.source == 'inferred' else ''}{units.pct(d.busy_share)} ({esc(d.source)})")
    for w in report.workloads:
        parts.append(f"{esc(w.name)} (PID {w.pid}) is an {esc(w.kind)}"
                     + (f", {w.requests_per_s:,.1f} requests/s" if w.requests_per_s else ""))
    return f"<p class='summary'>{'; '.join(parts)}</p>\n" if parts else ""


def _layout(fig, height: int, *, date_axis: bool = True, y_title: str = "") -> None:
    fig.update_layout(template="plotly_white", height=height, margin=dict(l=60, r=20, t=28, b=36),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, font=dict(size=11)),
                      hovermode="x unified" if date_axis else "closest", font=dict(size=12))
    if date_axis:
        # whole seconds; ticks closer than a second (a short run) carry their milliseconds
        fig.update_xaxes(type="date", tickformat="%H:%M:%S", hoverformat="%H:%M:%S", title_text="UTC",
                         title_standoff=4, tickformatstops=[dict(dtickrange=[None, 999], value="%H:%M:%S.%L")])
    if y_title:
        fig.update_yaxes(title_text=y_title)


def _shapes(report: Report, pid: int | None) -> list[dict]:
    """One shape per run of adjacent evidence windows of the chains that affect ``pid``."""
    shapes = []
    for c in report.chains:
        if pid is not None and c.pids and pid not in c.pids:
            continue
        for x0, x1 in _runs(c.evidence_windows):
            shapes.append(dict(type="rect", xref="x", yref="paper", y0=0, y1=1, layer="below", line_width=0,
                               x0=_x(x0), x1=_x(x1), fillcolor=SHADE.get(c.severity, SHADE["LOW"])))
    return shapes


def _window_x(charts: Charts) -> list[str]:
    return [_x(charts.start_ns + (w + 0.5) * charts.window_ns) for w in range(charts.n_windows)]


def _steps_section(report: Report, charts: Charts, page: Page) -> str:
    import plotly.graph_objects as go

    sw = charts.steps
    assert sw is not None
    x = _window_x(charts)
    fig = go.Figure()
    drawn = []
    for part in PARTS:
        ys = sw.parts_ms[part]
        if not any(v for v in ys if v is not None):
            continue
        drawn.append(part)
        fig.add_trace(go.Bar(x=x, y=ys, name=PART_LABELS[part], marker_color=PART_COLOURS[part],
                             hovertemplate="%{y:.2f} ms"))
    fig.update_layout(barmode="stack", shapes=_shapes(report, sw.pid), bargap=0.1)
    _layout(fig, 300, y_title=f"ms per {sw.unit}")
    name = next((s.name for s in charts.processes if s.pid == sw.pid), f"pid {sw.pid}")
    return (f"<section id='steps'><h2>Where each {esc(sw.unit)}'s time goes, window by window</h2>"
            f"<p class='note'>The mean {esc(sw.unit)} of {esc(name)} (PID {sw.pid}), loop thread {sw.tid}, split "
            f"by what the thread was doing; shaded: the chains' evidence windows.</p>"
            + page.figure(fig, "steps-chart", drawn) + "</section>\n")


def _state_colours(tl: Timeline) -> dict[str, str]:
    colours = dict(STATE_COLOURS)
    pre = blocked = 0
    for b in tl.bars:
        if b.state in colours:
            continue
        if b.state.startswith("preempted"):
            colours[b.state] = PREEMPT_COLOURS[pre % len(PREEMPT_COLOURS)]
            pre += 1
        else:
            colours[b.state] = BLOCKED_COLOURS[blocked % len(BLOCKED_COLOURS)]
            blocked += 1
    return colours


def _timeline_section(tl: Timeline, page: Page) -> str:
    import plotly.graph_objects as go

    colours = _state_colours(tl)
    states: dict[str, list] = {}
    for b in tl.bars:
        states.setdefault(b.state, []).append(b)
    fig = go.Figure()
    for state, bars in states.items():
        fig.add_trace(go.Bar(
            orientation="h", y=[b.lane for b in bars], base=[(b.start_ns - tl.start_ns) / 1e6 for b in bars],
            x=[(b.end_ns - b.start_ns) / 1e6 for b in bars], name=esc(state), marker_color=colours[state],
            marker_line_width=0, width=0.7,
            hovertext=[esc(f"{state}{': ' + b.detail if b.detail and b.detail not in state else ''}, "
                           f"{units.ns(b.end_ns - b.start_ns)} at +{(b.start_ns - tl.start_ns) / 1e6:.2f} ms")
                       for b in bars],
            hoverinfo="text"))
    span_ms = (tl.end_ns - tl.start_ns) / 1e6
    fig.update_layout(barmode="overlay", xaxis=dict(range=[0, span_ms]),
                      yaxis=dict(categoryorder="array", categoryarray=["CUDA", "CPU"]))
    _layout(fig, 230, date_axis=False)
    fig.update_xaxes(title_text=f"ms after {rc.clock(tl.start_ns, ms=True)} UTC", title_standoff=4)
    return (f"<section id='timeline'><h2>The loop thread over {span_ms:,.1f} ms ({esc(tl.why)})</h2>"
            f"<p class='note'>Thread {tl.tid} of {esc(tl.name)} (PID {tl.pid}) from {rc.clock(tl.start_ns, ms=True)} "
            f"UTC: its CPU state and the CUDA call it was in.</p>"
            + page.figure(fig, "timeline-chart", list(states)) + "</section>\n")


def _before_after_section(before: Report, after: Report, label: str, page: Page) -> str:
    import plotly.graph_objects as go

    body = rc.before_after(before, after, label)
    chart = ""
    bs, as_ = before.steps, after.steps
    if bs is not None and as_ is not None and bs.breakdown and as_.breakdown:
        fig = go.Figure()
        drawn = []
        for part in PARTS:
            vals = [as_.breakdown.get(part, 0.0) * as_.median_ms, bs.breakdown.get(part, 0.0) * bs.median_ms]
            if not any(vals):
                continue
            drawn.append(part)
            fig.add_trace(go.Bar(orientation="h", y=["after", "before"], x=vals, name=PART_LABELS[part],
                                 marker_color=PART_COLOURS[part], hovertemplate="%{x:.2f} ms"))
        fig.update_layout(barmode="stack")
        _layout(fig, 200, date_axis=False)
        fig.update_xaxes(title_text=f"median {bs.unit} (ms), split as the mean {bs.unit}", title_standoff=4)
        chart = page.figure(fig, "before-after-chart", drawn)
    return f"<section id='before-after'><h2>Before and after the fix</h2>{body}{chart}</section>\n"


def _process_section(s: Series, charts: Charts, report: Report, page: Page) -> str:
    import plotly.graph_objects as go

    x = _window_x(charts)
    shapes = _shapes(report, s.pid)
    out = [f"<section class='process'><h2>{esc(s.name)} (PID {s.pid}): per window</h2>"]
    flat_lines = []
    for title, lines in ROWS:
        if title.startswith("loop thread off CPU") and charts.steps is not None and charts.steps.pid == s.pid:
            continue  # the step breakdown above splits the same time finer
        present = [(m, lab) for m, lab in lines if any(v is not None for v in s.metrics.get(m, ()))]
        drawn = []
        for m, lab in present:
            values = s.metrics[m]
            if is_flat(values):
                v = [x for x in values if x is not None]
                mean = sum(v) / len(v)
                spread = ((f" (range {(max(v) - min(v)) / abs(mean):.2%} of it)" if max(v) > min(v) else " (constant)")
                          if mean and len(v) > 1 else "")
                flat_lines.append(f"<li data-series='{esc(m)}'>{esc(title)}, {esc(lab)}: {_number(mean)} "
                                  f"throughout{spread}</li>")
            else:
                drawn.append((m, lab))
        if not drawn:
            continue
        fig = go.Figure()
        for m, lab in drawn:
            fig.add_trace(go.Scatter(x=x, y=s.metrics[m], name=lab, mode="lines+markers", connectgaps=False,
                                     line=dict(color=COLOURS[m], dash="dash" if m.endswith("p99") else "solid"),
                                     marker=dict(size=4)))
        fig.update_layout(shapes=shapes, title=dict(text=title, x=0, font=dict(size=13)))
        _layout(fig, 220)
        fig.update_layout(margin=dict(t=48))
        out.append(page.figure(fig, "metric-chart", [m for m, _ in drawn]))
    if flat_lines:
        out.append("<ul class='flat'>" + "".join(flat_lines) + "</ul>")
    out.append("</section>\n")
    return "".join(out)


def _footer(report: Report) -> str:
    a = report.analysed
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.notes)
    return (f"<section id='analysed'><h2>What was analysed</h2><p class='note'>{a.events:,} events "
            f"({a.cuda_events:,} CUDA calls) of {esc(', '.join(a.processes))}; drops: {a.drops_kernel:,} kernel, "
            f"{a.drops_user:,} user.</p>" + (f"<ul class='note'>{notes}</ul>" if notes else "") + "</section>\n")


def _runs(windows) -> list[tuple[int, int]]:
    """Merge windows that touch into [start, end) runs."""
    out: list[list[int]] = []
    for w in sorted(windows, key=lambda w: w.start_ns):
        if out and w.start_ns <= out[-1][1]:
            out[-1][1] = max(out[-1][1], w.end_ns)
        else:
            out.append([w.start_ns, w.end_ns])
    return [(a, b) for a, b in out]
