"""One self-contained HTML page: explain's chains, then per traced process its charts per window.

The plotly JavaScript is inlined from the plotly package (no network: the page
opens offline and fetches nothing).  Each chain's evidence windows are shaded
on the charts of the processes it affects, so a reader sees the effect rise
where the cause does.
"""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import IO

from ingero.analyze.model import Report
from ingero.export.report_data import Charts, Series
from ingero.render import terminal

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
SHADE = {"HIGH": "rgba(220,40,40,0.16)", "MEDIUM": "rgba(240,150,0,0.16)", "LOW": "rgba(120,120,120,0.12)"}

_STYLE = """body{font-family:system-ui,sans-serif;margin:24px;max-width:1400px}
pre{background:#f6f6f6;padding:12px;overflow-x:auto;font-size:13px}h2{margin-top:32px}
.legend span{display:inline-block;padding:2px 8px;margin-right:8px}"""


# Every report begins with these characters: how --force knows a file is an earlier report of ours.
PREFIX = "<!DOCTYPE html><html><head><meta charset='utf-8'><title>ingero report: session "


def is_ours(path: Path) -> bool:
    """Whether the regular file at ``path`` is a report ingero wrote (it begins with PREFIX)."""
    with open(path, "rb") as f:
        return f.read(len(PREFIX)) == PREFIX.encode()


def write(report: Report, charts: Charts, out: IO[str]) -> int:
    """Write the page; return the number of charts on it."""
    from plotly.offline import get_plotlyjs

    text = io.StringIO()
    terminal.write(report, text)
    a = report.analysed
    out.write(f"{PREFIX}{a.session_id}</title><style>{_STYLE}</style>\n<script>{get_plotlyjs()}</script></head><body>\n")
    out.write(f"<h1>ingero report — session {a.session_id}</h1>\n<h2>Explain</h2>\n"
              f"<pre>{html.escape(text.getvalue())}</pre>\n")
    legend = "".join(f"<span style='background:{SHADE[c.severity]}'>#{i} [{c.severity}] {html.escape(c.rule_id)}"
                     f"</span>" for i, c in enumerate(report.chains, 1))
    if legend:
        out.write(f"<p class='legend'>Shaded: the evidence windows of {legend}</p>\n")
    n = 0
    for s in charts.processes:
        out.write(f"<h2>{html.escape(s.name)} (PID {s.pid})</h2>\n")
        out.write(_figure(s, charts, report, n))
        n += 1
    out.write("</body></html>\n")
    return n


def _figure(s: Series, charts: Charts, report: Report, idx: int) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = [(title, [(m, lab) for m, lab in lines if any(v is not None for v in s.metrics.get(m, ()))])
            for title, lines in ROWS]
    rows = [r for r in rows if r[1]]
    x = [(w + 0.5) * charts.window_ns / 1e9 for w in range(charts.n_windows)]
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        subplot_titles=[t for t, _ in rows])
    for r, (_, lines) in enumerate(rows, 1):
        for metric, label in lines:
            fig.add_trace(go.Scatter(x=x, y=s.metrics[metric], name=label, mode="lines+markers",
                                     connectgaps=False), row=r, col=1)
    # One shape per run of adjacent evidence windows, spanning every subplot (they share x);
    # set at once: plotly's add_vrect per window is quadratic in the number of shapes.
    shapes = []
    for c in report.chains:
        if c.pids and s.pid not in c.pids:
            continue
        for x0, x1 in _runs(c.evidence_windows):
            shapes.append(dict(type="rect", xref="x", yref="paper", y0=0, y1=1, layer="below", line_width=0,
                               x0=(x0 - charts.start_ns) / 1e9, x1=(x1 - charts.start_ns) / 1e9,
                               fillcolor=SHADE.get(c.severity, SHADE["LOW"])))
    fig.update_layout(shapes=shapes)
    fig.update_xaxes(title_text="seconds since start", row=len(rows), col=1)
    fig.update_layout(height=220 * len(rows) + 80, margin=dict(l=60, r=20, t=40, b=40),
                      legend=dict(orientation="h"))
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{idx}",
                       config={"displaylogo": False})


def _runs(windows) -> list[tuple[int, int]]:
    """Merge windows that touch into [start, end) runs."""
    out: list[list[int]] = []
    for w in sorted(windows, key=lambda w: w.start_ns):
        if out and w.start_ns <= out[-1][1]:
            out[-1][1] = max(out[-1][1], w.end_ns)
        else:
            out.append([w.start_ns, w.end_ns])
    return [(a, b) for a, b in out]
