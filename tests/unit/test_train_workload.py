"""demos/workloads/train.py: the demo's training loop on the simulated runtime (no BPF needed)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "demos" / "workloads" / "train.py"
LIB = ROOT / "demos" / "build" / "libcudart.so.12"  # built by `make setup`


def _run(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "summary.json"
    subprocess.run([sys.executable, str(TRAIN), "--lib", str(LIB), "--workers", "0", "--kernel-us", "200",
                    "--kernels-per-step", "4", "--host-us", "200", "--batch-bytes", "1MiB",
                    "--summary-json", str(out), *extra], check=True, capture_output=True, timeout=60)
    return json.loads(out.read_text())


def test_without_measure_from_every_step_counts(tmp_path):
    s = _run(tmp_path, "--steps", "50")
    assert (s["steps"], s["measured_from_step"]) == (50, 0)


def test_measure_from_counts_only_steps_after_the_file_appears(tmp_path):
    """The demo's slow run starts clean; before/after must describe it once the cause is on."""
    marker = tmp_path / "cause"
    threading.Timer(1.0, marker.touch).start()
    t = time.monotonic()
    s = _run(tmp_path, "--duration", "2.5", "--measure-from", str(marker))
    total_s = time.monotonic() - t
    assert s["measured_from_step"] > 0  # steps ran before the marker, and were left out
    # the measured span is the part after the marker (1 s of the 2.5 s loop), not the whole run
    assert s["wall_s"] < total_s - 0.9
    assert abs(s["steps_per_s"] - s["steps"] / s["wall_s"]) < 0.5  # rates over the measured span


def test_measure_from_a_file_that_never_appears_measures_the_whole_run(tmp_path):
    s = _run(tmp_path, "--steps", "30", "--measure-from", str(tmp_path / "never"))
    assert (s["steps"], s["measured_from_step"]) == (30, 0)
