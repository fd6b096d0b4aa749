"""`ingero report`: one self-contained HTML file, checked as a user sees it in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from export_helpers import make_db
from ingero.cli import main

# replays.py's cache serves this module and the other replay users on one worker
pytestmark = pytest.mark.xdist_group("replays")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr", "--v=0"]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("report")
    db = make_db(d / "cpu.duckdb", "cpu-contention", duration_s=30)
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


def test_chromium_renders_every_chart(page: Path, tmp_path: Path) -> None:
    r, requests = _render(page, tmp_path)
    assert requests == set()  # no request leaves the file
    dom = r.stdout
    charts = re.findall(r'<div id="(chart-\d+)"', dom)
    assert charts == ["chart-0"]  # one traced process
    # plotly draws each chart into its own SVG roots; a chart that failed stays an empty div
    assert dom.count('class="main-svg"') >= 2 * len(charts)
    assert "CUDA ops/s" in dom and "loop thread off CPU" in dom
    # the evidence windows of the HIGH cpu-contention chain, shaded (SHADE["HIGH"])
    assert re.search(r'<path data-index="\d+"[^>]*fill: rgb\(220, 40, 40\); fill-opacity: 0.16', dom)
    assert [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln] == []  # no console message at all


def test_screenshot_of_the_cpu_contention_report(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report-cpu-contention.png"
    r = _chromium(["--window-size=1300,1500", "--virtual-time-budget=10000", f"--screenshot={shot}",
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


def test_demo_writes_the_slow_runs_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo.html"
    assert main(["demo", "cpu-contention", "--synthetic", "--duration", "8s", "--no-fix", "--json",
                 "--report", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["diagnosed"] and result["report"].startswith(f"wrote {out}: ")
    text = out.read_text()
    assert "CPU scheduling contention" in text and '<div id="chart-0"' in text
    assert os.listdir(tmp_path) == ["demo.html"]
    # a --report that cannot be written fails at once, before the runs
    assert main(["demo", "cpu-contention", "--synthetic", "--report", str(tmp_path / "no" / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err
