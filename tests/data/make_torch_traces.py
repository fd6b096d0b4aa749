"""Record the two CPU-only torch.profiler traces used as test fixtures (tests/data/torch_cpu_workers{0,2}.json.gz).

Run from the repo root with a CPU-only torch installed (not a project dependency):
    .venv/bin/python tests/data/make_torch_traces.py

A small training loop (an MLP on random data) whose Dataset items each take real
CPU time (a pure-Python loop, ~1 ms), profiled with ProfilerActivity.CPU for a
few steps (a profiler schedule; prof.step() marks ProfilerStep#N), once with num_workers=0 (the main
process builds every batch: enumerate(DataLoader) spans take most of each step)
and once with num_workers=2 (workers build batches ahead).  The exported Chrome
traces are gzip-compressed; record_shapes and stacks stay off to keep them small.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, Dataset

HERE = Path(__file__).resolve().parent
STEPS = 5
BATCH = 8
ITEM_LOOP = 20_000  # iterations of pure Python per item: ~1 ms of CPU, like decoding an image
HIDDEN = 1536  # the model's width: a training step of ~10-20 ms of CPU, longer than 2 workers need per batch


class SlowItems(Dataset):
    """Items that cost CPU time to produce, as decoding and augmenting would."""

    def __len__(self) -> int:
        return BATCH * (STEPS + 4)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        acc = 0
        for k in range(ITEM_LOOP):
            acc = (acc * 31 + k) % 1_000_003
        g = torch.Generator().manual_seed(i + acc % 7)
        return torch.randn(64, generator=g), torch.randint(0, 10, (), generator=g)


def record(num_workers: int, out: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowItems(), batch_size=BATCH, num_workers=num_workers)
    traces = []
    # ProfilerStep#N spans come with a schedule: skip one step, warm up one, record STEPS
    sched = schedule(wait=1, warmup=1, active=STEPS)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=traces.append) as prof:
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
            if step + 1 == 2 + STEPS:
                break
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "trace.json"
        traces[0].export_chrome_trace(str(plain))
        with open(plain, "rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
    print(f"{out.name}: {out.stat().st_size:,} bytes", file=sys.stderr)


def main() -> int:
    torch.set_num_threads(1)
    for workers in (0, 2):
        record(workers, HERE / f"torch_cpu_workers{workers}.json.gz")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
