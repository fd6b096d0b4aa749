"""Live: scripts/gpu-check.sh --dry, the first-GPU-run script's loops on the simulated runtime.

The four loops (healthy, a num_workers=0 DataLoader, CPU hogs on the loop's
core, pageable copies) run as on the GPU, each under `ingero trace --cmd`
with CUPTI, here on the simulated runtime and its CUPTI stand-in; the table's
reference column is then the simulator's own busy time.  Asserted: every loop
ran and was explained, CUPTI stored one row per kernel and copy the simulator
ran, each joined to its call, and the measured busy share is within 1 point
of the simulator's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import prereqs
import workloads

pytestmark = [pytest.mark.live, pytest.mark.exact]

REPO = Path(__file__).resolve().parents[2]


def test_the_dry_run_fills_the_table_with_cuptis_measured_timeline(tmp_path: Path, simcuda: Path) -> None:
    prereqs.needs((simcuda.parent / "libcupti.so.13").exists(), "the CUPTI stand-in (demos/build/libcupti.so.13)",
                  "make -C demos, with the CUDA toolkit's CUPTI headers")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), "--dry", "--seconds", "1", "--out",
                           str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=4 * workloads.TRACED_RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert [r["loop"] for r in rows] == ["healthy", "dataloader", "cpu-hogs", "pageable"]
    table = proc.stdout.splitlines()
    assert table[0].startswith("| loop | CUPTI busy | simulator's truth | inferred busy | top chain (CUPTI) |")
    for r in rows:
        assert "error" not in r and "skipped" not in r, r
        assert r["source"] == "measured" and r["steps"] > 0
        kernels, copies = r["device_rows"]["kernel"], r["device_rows"]["memcpy"]
        assert kernels == r["kernels_queued"] and r["joined"] == kernels + copies
        assert abs(r["cupti_busy"] - r["reference_busy"]) <= 0.01, r
        assert r["inferred_busy"] is not None and r["top_chain"]
        assert any(line.startswith(f"| {r['loop']} | {100 * r['cupti_busy']:.1f}% |") for line in table)
