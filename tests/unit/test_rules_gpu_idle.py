"""gpu-idle: fires / just below / look-alikes that must not fire.

The trace: one training loop for 20 s (18 steady windows once explain trims
the first and last), NVML samples once a second.  A window is idle when the
GPU's utilisation is below Thresholds.idle_util_pct; the rule needs
min_window_share of the loop's windows idle.
"""

from __future__ import annotations

import pytest

from analyze_helpers import MAIN_PID, SESSION, T0, S, Trace, chains_of, silent
from ingero.analyze.rules import gpu_idle

IDLE_UTIL = 20.0


def run(seconds: float = 20) -> Trace:
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    return tr.system(0, 20).loop(0, seconds)


def gpu(tr: Trace, idle_from_s: int, util: float = IDLE_UTIL, seconds: int = 20) -> Trace:
    """One NVML sample per second: ``util`` from second ``idle_from_s`` on, 95% before."""
    for s in range(seconds):
        tr.gpu.append({"session_id": SESSION, "timestamp": T0 + s * S + S // 2, "gpu": 0, "name": "A100",
                       "util_pct": util if s >= idle_from_s else 95.0})
    return tr


def test_fires_medium_at_the_window_share_threshold():
    # windows 13-18 idle: 6 of 18 = 1/3 >= min_window_share (0.3), < high_window_share
    [chain] = chains_of(gpu(run(), 13).explain(), "gpu-idle")
    assert chain.severity == "MEDIUM"
    assert chain.pids == [MAIN_PID]
    assert chain.numbers["idle_window_share"] == pytest.approx(6 / 18, abs=1e-4)
    assert gpu_idle.T.min_window_share <= 6 / 18 < gpu_idle.T.high_window_share
    assert chain.numbers["util_pct_idle_windows"] == pytest.approx(IDLE_UTIL)
    assert len(chain.evidence_windows) == 6
    assert chain.root == [f"GPU utilisation 20% in 6 of 18 windows while python3 (train.py) (PID {MAIN_PID}) ran"]


def test_one_idle_window_fewer_is_silent():
    # windows 14-18: 5 of 18 = 0.28 < min_window_share
    assert 5 / 18 < gpu_idle.T.min_window_share
    assert chains_of(gpu(run(), 14).explain(), "gpu-idle") == []


def test_utilisation_at_the_idle_threshold_is_not_idle():
    # every window from 8 on at exactly idle_util_pct: not below it, so none is idle
    tr = gpu(run(), 8, util=gpu_idle.T.idle_util_pct)
    assert silent(tr.explain(), "gpu-idle")
    tr = gpu(run(), 8, util=gpu_idle.T.idle_util_pct - 1)
    [chain] = chains_of(tr.explain(), "gpu-idle")
    assert chain.severity == "HIGH"


def test_gpu_idle_after_the_job_ended_is_not_the_job_waiting():
    # the loop runs 0-10 s with the GPU busy; the GPU idles from 10 s on, when no traced process runs
    tr = gpu(run(seconds=10), 10)
    report = tr.explain()
    assert silent(report, "gpu-idle")


def test_without_nvml_samples_it_is_silent():
    # the same loop as the firing case, no gpu_metrics rows (no NVIDIA driver)
    assert silent(run().explain(), "gpu-idle")
