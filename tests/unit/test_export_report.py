"""`ingero report`: one self-contained HTML file, checked as a user sees it in headless Chromium."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import duckdb
import numpy as np
import pytest

from export_helpers import make_db
from replays import START_NS
from ingero.cli import main

# replays.py's cache serves this module and the other replay users on one worker
pytestmark = pytest.mark.xdist_group("replays")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr", "--v=0"]


# A competitor named like markup (a process names itself: untrusted), and the loop's RSS moving
# 30.12-30.16 MB (0.13% of its mean: noise, stated as one number, never drawn).
HOSTILE = "<img src=x onerror=alert(1)>hog"
RSS_MB = [30.12, 30.16, 30.14]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("report")
    db = make_db(d / "cpu.duckdb", "cpu-contention", duration_s=30)
    con = duckdb.connect(str(db))
    for table in ("process_names", "process_history"):
        con.execute(f"UPDATE {table} SET name = $n, comm = $n WHERE pid = 424301", {"n": HOSTILE})
    con.execute("INSERT INTO process_memory SELECT 1, $t0 + i * 1000000000, 424242, 'python3', "
                "CAST($rss[1 + i % 3] * 1e6 AS BIGINT), 0 FROM range(30) t(i)", {"t0": START_NS, "rss": RSS_MB})
    con.close()
    out = d / "report.html"
    assert main(["report", "--html", "--db", str(db), "-o", str(out)]) == 0
    return out


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI requires chromium (apt-get install chromium) for the report tests")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=180)


def _page_requests(net_log: Path) -> set[str]:
    """URLs the page itself asked for (the browser's own update/account pings carry no file:// key)."""
    events = json.loads(net_log.read_text())["events"]
    return {e["params"]["url"] for e in events
            if "file://" in str(e.get("params", {}).get("network_isolation_key", ""))
            and not e["params"].get("url", "file:").startswith("file:")}


def _render(page: Path, tmp: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    log = tmp / "net.json"
    r = _chromium([f"--log-net-log={log}", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()], tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    return r, _page_requests(log)


def test_the_request_check_sees_a_fetching_page(tmp_path: Path) -> None:
    """Control: the net-log check below does catch a page that fetches, and console errors show."""
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><img src="https://example.invalid/x.png"><script>console.error("boom")'
                   "</script></body></html>")
    r, requests = _render(bad, tmp_path)
    assert requests == {"https://example.invalid/x.png"}
    assert any("CONSOLE" in ln and "boom" in ln for ln in r.stderr.splitlines())


def test_page_is_self_contained(page: Path) -> None:
    text = page.read_text()
    assert page.stat().st_size <= 5_000_000
    assert "CPU scheduling contention" in text and "cpu-contention" in text
    # nothing the browser would fetch: no external script, style, image or frame
    assert not re.search(r"""<(script|link|img|iframe)[^>]+(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert not re.search(r"<script[^>]*\bsrc\s*=", text)  # plotly's JavaScript is inline


# Appended to a copy of the page: after load, what the layout engine made of it, as JSON in
# <pre id=probe> (read back from --dump-dom): the cards' boxes, every element reaching past the
# viewport or scrolling sideways, and per chart its kind, series and the traces plotly drew.
PROBE = """<script>window.addEventListener('load', function () { setTimeout(function () {
  var vw = document.documentElement.clientWidth, over = [];
  function cls(el) { return el.tagName + '.' + (el.getAttribute('class') || ''); }
  document.querySelectorAll('body *').forEach(function (el) {
    var r = el.getBoundingClientRect(), st = getComputedStyle(el);
    if (r.width > 0 && r.height > 0 && r.right > vw + 0.5) over.push(cls(el));
    if (st.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1) over.push('scrolls: ' + cls(el));
  });
  var cards = [].map.call(document.querySelectorAll('article.card'), function (c) {
    var r = c.getBoundingClientRect(); return {id: c.id, top: r.top, bottom: r.bottom, right: r.right,
      code: c.querySelectorAll('.fixbox code.cmd').length, text: c.textContent};
  });
  var charts = [].map.call(document.querySelectorAll('div.chart'), function (d) {
    return {kind: d.getAttribute('class'), series: d.dataset.series, traces: d.querySelectorAll('g.trace').length,
            svgs: d.querySelectorAll('svg.main-svg').length, top: d.getBoundingClientRect().top};
  });
  var flat = [].map.call(document.querySelectorAll('ul.flat li'), function (li) {
    return [li.dataset.series, li.textContent]; });
  var pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify({vw: vw, vh: window.innerHeight, docw: document.documentElement.scrollWidth,
    cards: cards, over: over, charts: charts, flat: flat, imgs: document.images.length});
  document.body.appendChild(pre);
}, 0); });</script>"""


def _probe(page: Path, tmp: Path) -> dict:
    probed = tmp / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    log = tmp / "net.json"
    r = _chromium([f"--log-net-log={log}", "--window-size=1280,800", "--virtual-time-budget=10000", "--dump-dom",
                   probed.as_uri()], tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', r.stdout, re.S)
    assert m, "the probe did not run"
    return {"probe": json.loads(html.unescape(m.group(1))), "dom": r.stdout, "requests": _page_requests(log),
            "console": [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln]}


@pytest.fixture(scope="module")
def layout(page: Path, tmp_path_factory) -> dict:
    return _probe(page, tmp_path_factory.mktemp("layout"))


def test_the_layout_probe_sees_what_it_checks(tmp_path: Path) -> None:
    """Control: a box scrolling sideways, an element past the viewport and a card below the fold show."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body style='margin:0'><pre class='wide' style='overflow-x:auto;width:200px'>"
                   + "x" * 400 + "</pre><div class='past' style='width:1400px;height:5px'></div>"
                   "<div style='height:900px'></div><article class='card' id='chain-1'>late</article></body></html>")
    p = _probe(bad, tmp_path)["probe"]
    assert "scrolls: PRE.wide" in p["over"] and "DIV.past" in p["over"]
    assert p["cards"][0]["id"] == "chain-1" and p["cards"][0]["bottom"] > 800


def _non_flat(values) -> bool:
    """The report's rule, restated: a series moving more than 1% of its mean is drawn."""
    v = np.array([x for x in values if x is not None], dtype=float)
    return len(v) >= 2 and float(v.max() - v.min()) > 0.01 * abs(float(v.mean()))


def test_layout_at_1280x800(layout: dict, page: Path) -> None:
    p = layout["probe"]
    assert layout["requests"] == set() and layout["console"] == []  # offline, and no script error
    # the layout is 1280 px wide less the scrollbar (--dump-dom's window keeps room for a frame, so
    # its innerHeight is under 800: the fold is measured from the page's top, at scroll 0)
    assert 1240 <= p["vw"] <= 1280
    # a verdict card per chain, each wholly above the fold, each with a copyable command
    assert [c["id"] for c in p["cards"]] == ["chain-1", "chain-2"]
    assert all(0 <= c["top"] < c["bottom"] <= 800 and c["right"] <= p["vw"] for c in p["cards"]), p["cards"]
    assert [c["code"] for c in p["cards"]] == [1, 1]
    first = p["cards"][0]["text"]
    assert "CPU scheduling contention" in first and "explains 23.7% of wall clock" in first
    assert "taskset -c 1 python3 demos/workloads/train.py" in p["cards"][0]["text"]
    assert "host-bound" in p["cards"][1]["text"]
    # nothing reaches past the viewport or scrolls sideways
    assert p["over"] == [] and p["docw"] <= p["vw"]
    # the charts: the step breakdown (rendered, starting above the fold), the loop thread's
    # timeline, then one chart per metric row that has a series moving more than 1%
    kinds = [c["kind"].split()[1] for c in p["charts"]]
    assert kinds[:2] == ["steps-chart", "timeline-chart"]
    assert p["charts"][0]["top"] < 800
    assert all(c["svgs"] >= 2 for c in p["charts"])  # plotly drew each (a failed one stays an empty div)
    from ingero.analyze.context import Options
    from ingero.analyze.explain import explain
    from ingero.export import report_data, report_html
    from ingero.export.selection import select
    from ingero.store.db import Store

    store = Store.open(page.parent / "cpu.duckdb", read_only=True)
    try:
        rep = explain(store.con, Options())
        charts = report_data.collect(store.con, select(store.con, Options()), Options(), rep.steps)
    finally:
        store.close()
    (s,) = charts.processes
    rows = [[m for m, _ in lines if m in s.metrics and _non_flat(s.metrics[m])]
            for title, lines in report_html.ROWS if not title.startswith("loop thread off CPU")]
    expected = [",".join(r) for r in rows if r]
    metric = [c for c in p["charts"] if "metric-chart" in c["kind"]]
    assert [c["series"] for c in metric] == expected == ["ops_s", "sync_p50,sync_p99,copy_p99,launch_p50,launch_p99"]
    assert [c["traces"] for c in metric] == [len(r.split(",")) for r in expected]
    # the flat series are stated as one number each: RSS 30.12-30.16 MB among them
    flat = dict(p["flat"])
    assert set(flat) == {"rss_mb", "copy_p50"}
    assert "RSS (MB), RSS: 30.14 throughout (range 0.13% of it)" == flat["rss_mb"]
    assert not any("rss_mb" in c["series"] for c in p["charts"])
    # the hostile name reads as text wherever it is shown, and makes no element
    assert p["imgs"] == 0
    assert "&lt;img src=x onerror=alert(1)&gt;hog (PID 424301" in layout["dom"]  # the card's culprit
    # plotly showed the entity as its character: the legend's text is the name itself
    assert re.search(r'<text[^>]*class="legendtext"[^>]*>preempted by &lt;img src=x onerror=alert\(1\)&gt;hog '
                     r'\(PID 424301\)</text>', layout["dom"])
    # the evidence windows of the HIGH cpu-contention chain, shaded (SHADE["HIGH"])
    assert re.search(r'<path data-index="\d+"[^>]*fill: rgb\(220, 40, 40\); fill-opacity: 0.16', layout["dom"])


def test_header_and_timeline(page: Path) -> None:
    text = page.read_text()
    # command, host, date; clock time on the axes (plotly's date axis, UTC, HH:MM:SS)
    assert "ingero demo cpu-contention (cpu-contention spin, synthetic replay, spin waits)" in text
    assert "<b>vm (kernel " in text and "2025-11-22 08:26:40 UTC" in text
    assert '"tickformat":"%H:%M:%S"' in text and "seconds since start" not in text
    # the loop thread's span: where the HIGH chain's evidence is, the competitors named
    assert "The loop thread over " in text and "in the evidence of [HIGH] cpu-contention" in text
    assert "preempted by cpu-hog (PID 424300)" in text
    # escaped for plotly too: it reads tags in names (its JSON writes "<" as an escape; the entity stays)
    assert "preempted by &lt;img src=x onerror=alert(1)&gt;hog (PID 424301)" in text


def test_screenshot_of_the_cpu_contention_report(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report-cpu-contention.png"
    r = _chromium(["--window-size=1280,800", "--virtual-time-budget=10000", f"--screenshot={shot}",
                   page.as_uri()], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert shot.stat().st_size > 50_000  # a blank page is a few kB
    keep = os.environ.get("INGERO_TEST_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)


def test_empty_selection_and_existing_file(page: Path, tmp_path: Path, capsys) -> None:
    db = page.parent / "cpu.duckdb"
    out = tmp_path / "r.html"
    assert main(["report", "--db", str(db), "--pid", "999999", "-o", str(out)]) == 2
    assert "holds no events" in capsys.readouterr().err
    assert main(["report", "--db", str(db), "-o", str(page)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_demo_writes_before_and_after(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo.html"
    assert main(["demo", "cpu-contention", "--synthetic", "--duration", "8s", "--json", "--report", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["diagnosed"] and result["report"].startswith(f"wrote {out}: ")
    assert "before/after" in result["report"]
    text = out.read_text()
    assert "CPU scheduling contention" in text and "class='chart steps-chart'" in text
    assert "<h2>Before and after the fix</h2>" in text and "class='chart before-after-chart'" in text
    before, after = result["before"]["explain"]["steps"], result["after"]["explain"]["steps"]
    from ingero.export.report_cards import speedup

    assert f"<td>{before['median_ms']:,.2f} ms</td><td>{after['median_ms']:,.2f} ms</td>" in text
    assert speedup(before["median_ms"], after["median_ms"], True) in text
    assert os.listdir(tmp_path) == ["demo.html"]
    # --no-fix: the slow run's page, no before/after
    assert main(["demo", "cpu-contention", "--synthetic", "--duration", "4s", "--no-fix", "--json",
                 "--report", str(out)]) == 0
    assert "before/after" not in json.loads(capsys.readouterr().out)["report"]
    assert "Before and after" not in out.read_text() and "class='chart steps-chart'" in out.read_text()
    # a --report that cannot be written fails at once, before the runs
    assert main(["demo", "cpu-contention", "--synthetic", "--report", str(tmp_path / "no" / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err


def test_fix_lines_speedups_and_flat_series() -> None:
    from ingero.export.report_cards import speedup, split_fix
    from ingero.export.report_html import is_flat

    assert split_fix("taskset -c 1 python3 train.py   (give the loop its own core)") == (
        "taskset -c 1 python3 train.py", "give the loop its own core")
    assert split_fix("DataLoader(num_workers=2, pin_memory=True)   (2 workers)") == (
        "DataLoader(num_workers=2, pin_memory=True)", "2 workers")
    assert split_fix("renice -n 19 -p 4301") == ("renice -n 19 -p 4301", "")
    assert split_fix("this host has 2 CPUs: workers share them") == (None, "this host has 2 CPUs: workers share them")
    assert speedup(34.51, 14.07, True) == "2.45× faster (−59%)"
    assert speedup(10.0, 11.0, True) == "1.10× slower (+10%)"
    assert speedup(480, 740, False) == "1.54× faster (+54%)"
    assert speedup(5.0, 5.01, True) == "unchanged"
    assert is_flat([30.12, 30.16, None, 30.14]) and not is_flat([30.0, 30.4])
    assert is_flat([0.0, 0.0]) and is_flat([7.0]) and not is_flat([0.0, 0.1])
