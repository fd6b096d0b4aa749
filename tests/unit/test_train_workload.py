"""demos/workloads/train.py: the demo's training loop on the simulated runtime (no BPF needed)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "demos" / "workloads" / "train.py"


def _cmd(lib: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(TRAIN), "--lib", str(lib), "--workers", "0", "--kernel-us", "200",
            "--kernels-per-step", "4", "--host-us", "200", "--batch-bytes", "1MiB",
            "--summary-json", str(out), *extra]


def _run(lib: Path, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "summary.json"
    subprocess.run(_cmd(lib, out, *extra), check=True, capture_output=True, timeout=60)
    return json.loads(out.read_text())


def test_without_measure_from_every_step_counts(simcuda, tmp_path):
    s = _run(simcuda, tmp_path, "--steps", "50")
    assert (s["steps"], s["measured_from_step"]) == (50, 0)


def test_measure_from_counts_only_steps_after_the_file_appears(simcuda, tmp_path):
    """The demo's slow run starts clean; before/after must describe it once the cause is on."""
    marker, out = tmp_path / "cause", tmp_path / "summary.json"
    t = time.monotonic()
    proc = subprocess.Popen(_cmd(simcuda, out, "--steps", "200", "--progress", "1", "--measure-from", str(marker)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # the marker appears once step 20 is done (its progress line), not after a timer
        for line in proc.stderr:
            if line.startswith("step 20:"):
                break
        t_marker = time.monotonic()
        marker.touch()
        proc.stderr.read()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    total_s = time.monotonic() - t
    s = json.loads(out.read_text())
    assert s["measured_from_step"] >= 20  # steps ran before the marker, and were left out
    assert s["measured_from_step"] + s["steps"] == 200
    # the measured span starts after the marker appeared, so it is not the whole run: it fits
    # between the touch and the exit (wall_s is rounded to 1 ms)
    assert s["wall_s"] < total_s
    assert s["wall_s"] <= time.monotonic() - t_marker + 0.0005
    # rates over the measured span; wall_s is rounded to 1 ms, so the rate recomputed from it
    # is off by up to 0.5 ms / wall_s of itself (0.14% of ~500 steps/s over 0.35 s)
    assert s["steps_per_s"] == pytest.approx(s["steps"] / s["wall_s"], rel=0.0005 / s["wall_s"] + 1e-4)


def test_measure_from_a_file_that_never_appears_measures_the_whole_run(simcuda, tmp_path):
    s = _run(simcuda, tmp_path, "--steps", "30", "--measure-from", str(tmp_path / "never"))
    assert (s["steps"], s["measured_from_step"]) == (30, 0)


def test_warmup_counts_only_the_steps_after_it(simcuda, tmp_path):
    s = _run(simcuda, tmp_path, "--warmup-s", "0.3", "--duration", "0.3")
    assert s["measured_from_step"] > 0 and s["steps"] > 0


@pytest.mark.parametrize("option", ["--warmup-s", "--duration"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "abc"])
def test_bad_seconds_are_one_line_exit_2(simcuda, tmp_path, option, value):
    proc = subprocess.run(_cmd(simcuda, tmp_path / "s.json", option, value), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"train.py: error: argument {option}: "), proc.stderr
    assert not (tmp_path / "s.json").exists()
