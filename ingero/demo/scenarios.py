"""The demo scenarios: each one a real failure mode of a GPU training job.

A scenario is data: the workload's flags (demos/workloads/train.py) for the
slow run and for the run with the fix applied, the interference processes
that run beside it, the explain rule expected to name the cause, and the
physics the synthetic replay reproduces when eBPF is not available, and the
wait policy of its CUDA runtime (how a sync waits for the device).

Both cores of these machines are used deliberately: the training loop is
pinned to LOOP_CPU, hogs to the same core when contention is the point, and
the fix moves the loop to FIX_CPU (or removes the cause).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ingero.errors import IngeroError

# The training loop's core and the one a fix moves it to (2-core machines).
LOOP_CPU = 0
FIX_CPU = 1

# Each scenario runs this long by default (brief: <= 60 s each), split
# between the slow run and the fixed run.
DEFAULT_DURATION_S = 40.0

# The slow run starts clean and the cause arrives after this share of it, so
# explain has baseline windows from the same session to compare against.
BASELINE_SHARE = 0.3

# How a thread waits for the device (cudaSetDeviceFlags' cudaDeviceSchedule*;
# SIMCUDA_SCHEDULE for the simulated runtime).  auto is CUDA's default: spin
# while the process has no more active contexts than the host has logical
# CPUs, else yield.  spin and yield stay on the CPU; block sleeps.
POLICIES = ("auto", "spin", "yield", "block")
DEFAULT_POLICY = "auto"


def wait_policy(policy: str, *, contexts: int = 1, ncpu: int | None = None) -> str:
    """The policy a wait follows: spin, yield or block (``auto`` resolved by CUDA's rule)."""
    if policy not in POLICIES:
        raise IngeroError(f"unknown wait policy {policy!r}", "choose one of: " + ", ".join(POLICIES))
    if policy != "auto":
        return policy
    return "spin" if contexts <= (ncpu or os.cpu_count() or 1) else "yield"


@dataclass(frozen=True)
class Interferer:
    """A real process doing real work beside the workload (ingero.demo.interference)."""

    kind: str  # cpu-hog | fsync-writer | memory-churn | cache-evictor
    args: tuple[str, ...] = ()
    count: int = 1
    cpu: int | None = None  # pin to this core (None: anywhere)


@dataclass(frozen=True)
class Physics:
    """What the synthetic replay generates per step (same shape as the live run)."""

    kernels: int = 8
    kernel_us: float = 2000.0
    copy_bytes: int = 8 << 20
    copy_sync: bool = False  # pageable: synchronous cudaMemcpy, staged
    copy_gbps: float = 12.0
    syncs: int = 1
    data_wait_us: float = 0.0  # loop waits on the DataLoader
    launch_us: float = 18.0  # host time per launch (ctypes + driver + uprobe)
    host_us: float = 500.0
    preempt_share: float = 0.0  # share of wall the loop is runnable but off-CPU
    faults_per_step: int = 0  # page faults taken by the loop thread
    fault_us: float = 0.0  # each fault's cost
    block_ios_per_step: int = 0  # block I/O requests around the step
    block_io_us: float = 0.0
    hogs: int = 0  # busy competitor processes (process_cpu rows)
    # data-parallel ranks, one process each, all-reducing per step; with more than one,
    # preempt_share and hogs hit the last rank only (the straggler), the others wait for it
    ranks: int = 1


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    story: str  # one sentence: what goes wrong
    expected_rule: str | None  # rule id explain should rank first (None: healthy)
    workload: tuple[str, ...]
    fix_workload: tuple[str, ...]
    fix: str  # what the fixed run changes, in words
    interference: tuple[Interferer, ...] = ()
    fix_interference: tuple[Interferer, ...] | None = None  # None: same as interference
    fix_renice: bool = False  # renice the interference to 19 in the fixed run
    needs_dataset: bool = False
    physics: Physics = field(default_factory=Physics)
    fix_physics: Physics = field(default_factory=Physics)
    # the wait policy of the CUDA runtime it runs on (SIMCUDA_SCHEDULE); every scenario runs
    # under CUDA's default, and its diagnosis must hold under each (tests/unit/test_policy_matrix.py)
    policy: str = DEFAULT_POLICY


_LOOP = ("--cpu", str(LOOP_CPU), "--worker-cpus", str(FIX_CPU))
_FIXED_LOOP = ("--cpu", str(FIX_CPU), "--worker-cpus", str(LOOP_CPU))
# A data-parallel job: rank 0 on LOOP_CPU, rank 1 on FIX_CPU, each with its DataLoader workers.
_RANKS = ("--ranks", "2", "--rank-cpus", f"{LOOP_CPU},{FIX_CPU}")
_BASE = ("--kernel-us", "2000", "--kernels-per-step", "8", "--batch-bytes", "8MiB", "--workers", "2",
         "--decode-us", "100", "--host-us", "500")

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="cpu-contention",
        title="CPU hogs on the training loop's core",
        story="three busy processes share core 0 with the training loop, which waits for a CPU "
              "between every CUDA call",
        expected_rule="cpu-contention",
        workload=(*_BASE, "--kernel-us", "1000", "--workers", "0", "--host-us", "4000", "--cpu", str(LOOP_CPU)),
        fix_workload=(*_BASE, "--kernel-us", "1000", "--workers", "0", "--host-us", "4000",
                      "--cpu", str(FIX_CPU)),
        fix="taskset -c 1 (the loop gets its own core) and renice -n 19 the hogs",
        interference=(Interferer("cpu-hog", (str(LOOP_CPU),), count=3),),
        fix_renice=True,
        physics=Physics(kernel_us=1000, host_us=4800, preempt_share=0.6, hogs=3),
        fix_physics=Physics(kernel_us=1000, host_us=4800, hogs=3),
    ),
    Scenario(
        name="memcpy-bottleneck",
        title="large pageable host-to-device copies",
        story="each step copies 64 MiB from pageable memory: staged through a bounce buffer on the "
              "loop thread, synchronous, at a fraction of pinned bandwidth",
        expected_rule="transfer-bound",
        workload=(*_BASE, "--batch-bytes", "64MiB", "--pageable", *_LOOP),
        fix_workload=(*_BASE, "--batch-bytes", "64MiB", "--pinned", *_LOOP),
        fix="pinned memory (cudaMallocHost / DataLoader(pin_memory=True)) and cudaMemcpyAsync",
        physics=Physics(copy_bytes=64 << 20, copy_sync=True, copy_gbps=4.7),
        fix_physics=Physics(copy_bytes=64 << 20),
    ),
    Scenario(
        name="dataloader-starvation",
        title="too few, too slow DataLoader workers",
        story="one worker fetches (4.5 ms) and decodes (1.5 ms CPU) 8 samples per batch, a batch "
              "every 48 ms; the loop's step is 24 ms of device work, so it waits ~24 ms per batch "
              "while the device idles",
        expected_rule="input-bound",
        workload=(*_BASE, "--kernel-us", "3000", "--workers", "1", "--fetch-us", "4500",
                  "--decode-us", "1500", *_LOOP),
        fix_workload=(*_BASE, "--kernel-us", "3000", "--workers", "4", "--fetch-us", "4500",
                      "--decode-us", "1500", "--prefetch", "4", "--cpu", str(LOOP_CPU)),
        fix="DataLoader(num_workers=4, prefetch_factor=4, persistent_workers=True)",
        physics=Physics(kernel_us=3000, data_wait_us=26000),
        fix_physics=Physics(kernel_us=3000, data_wait_us=3000),
    ),
    Scenario(
        name="io-stall",
        title="cold dataset reads behind an fsync-heavy writer",
        story="the loader reads 32 samples of 64 KiB per batch from disk (O_DIRECT: ~0.2 ms each "
              "here) while two checkpoint writers fsync 8 MiB at a time on the same disk (~5 ms each)",
        expected_rule="io-stall",
        workload=(*_BASE, "--workers", "1", "--reads-per-batch", "32", "--read-bytes", "64KiB",
                  "--direct-reads", "--read-path", "{dataset}", *_LOOP),
        fix_workload=(*_BASE, "--workers", "1", "--reads-per-batch", "32", "--read-bytes", "64KiB",
                      "--direct-reads", "--read-path", "{dataset}", *_LOOP),
        fix="move the checkpoint writer off the dataset's disk (or write checkpoints between epochs)",
        interference=(Interferer("fsync-writer", ("{workdir}", "8"), count=2, cpu=FIX_CPU),),
        fix_interference=(),
        needs_dataset=True,
        physics=Physics(data_wait_us=20000, block_ios_per_step=16, block_io_us=1500),
        fix_physics=Physics(),
    ),
    Scenario(
        name="memory-pressure",
        title="page-fault pressure on the training thread",
        story="each step collates a batch from a memory-mapped dataset whose pages an evicter keeps "
              "dropping (what reclaim does under pressure; this box has no swap) while a hog churns "
              "anonymous memory: the loop thread takes thousands of faults per step",
        expected_rule="memory-pressure",
        workload=(*_BASE, "--batch-bytes", "32MiB", "--pinned", "--mmap-path", "{dataset}", *_LOOP),
        fix_workload=(*_BASE, "--batch-bytes", "32MiB", "--pinned", *_LOOP),
        fix="stop the memory hog and keep the dataset resident (preloaded, not re-faulted from disk)",
        interference=(Interferer("cache-evictor", ("{dataset}",), cpu=FIX_CPU),
                      Interferer("memory-churn", ("512",), cpu=FIX_CPU)),
        fix_interference=(),
        needs_dataset=True,
        physics=Physics(copy_bytes=32 << 20, faults_per_step=8192, fault_us=2.0),
        fix_physics=Physics(copy_bytes=32 << 20),
    ),
    Scenario(
        name="launch-bound",
        title="many tiny kernels",
        story="500 kernels of 5 us per step: the host spends longer launching than the device "
              "spends running them",
        expected_rule="launch-bound",
        workload=(*_BASE, "--kernel-us", "5", "--kernels-per-step", "500", *_LOOP),
        fix_workload=(*_BASE, "--kernel-us", "250", "--kernels-per-step", "10", *_LOOP),
        fix="fuse kernels (torch.compile) or capture the step in a CUDA graph (cudaGraphLaunch)",
        physics=Physics(kernels=500, kernel_us=5),
        fix_physics=Physics(kernels=10, kernel_us=250),
    ),
    Scenario(
        name="sync-heavy",
        title="a sync after every kernel (.item() in the loop)",
        story="the loop calls cudaStreamSynchronize after each of 32 kernels, so the host and "
              "device take turns instead of overlapping",
        expected_rule="sync-heavy",
        workload=(*_BASE, "--kernel-us", "40", "--kernels-per-step", "32", "--syncs-per-step", "32",
                  "--host-us", "200", *_LOOP),
        fix_workload=(*_BASE, "--kernel-us", "40", "--kernels-per-step", "32", "--syncs-per-step", "1",
                      "--host-us", "200", *_LOOP),
        fix="one sync per step: accumulate losses on the device, .item() once per log interval",
        physics=Physics(kernels=32, kernel_us=40, syncs=32, host_us=200),
        fix_physics=Physics(kernels=32, kernel_us=40, syncs=1, host_us=200),
    ),
    Scenario(
        name="straggler",
        title="one rank of a data-parallel job shares its core with CPU hogs",
        story="two ranks (one per core) all-reduce their gradients every step; three busy processes "
              "share rank 1's core, so rank 1 enters the all-reduce late and rank 0 waits for it "
              "every step",
        expected_rule="straggler",
        workload=(*_BASE, "--kernel-us", "1000", "--workers", "1", "--host-us", "4000", *_RANKS),
        fix_workload=(*_BASE, "--kernel-us", "1000", "--workers", "1", "--host-us", "4000", *_RANKS),
        fix="renice -n 19 the hogs on rank 1's core (what the chain's fix says; or move them off it)",
        interference=(Interferer("cpu-hog", (str(FIX_CPU),), count=3),),
        fix_renice=True,
        physics=Physics(kernel_us=1000, host_us=4800, preempt_share=0.6, hogs=3, ranks=2),
        fix_physics=Physics(kernel_us=1000, host_us=4800, hogs=3, ranks=2),
    ),
    Scenario(
        name="healthy",
        title="a healthy run",
        story="enough workers, pinned copies, one sync per step, the loop alone on its core",
        expected_rule=None,
        workload=(*_BASE, *_LOOP),
        fix_workload=(*_BASE, *_LOOP),
        fix="nothing to fix",
    ),
)

BY_NAME = {s.name: s for s in SCENARIOS}


def names() -> list[str]:
    return [s.name for s in SCENARIOS]


def get(name: str) -> Scenario:
    """The scenario called ``name``; an unknown name lists the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise IngeroError(
            f"unknown demo scenario {name!r}",
            "choose one of: " + ", ".join(names()) + " (ingero demo --list)",
        ) from None
