"""What explain produces: plain dataclasses, shared by every renderer.

A rule returns ``Chain`` objects; ``explain`` wraps them in a ``Report`` with
what was analysed.  Renderers (terminal, JSON) are pure functions of a
Report, so both views always carry the same content.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("HIGH", "MEDIUM", "LOW")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Culprit:
    """A process named as (part of) the cause."""

    pid: int
    name: str
    detail: str = ""  # e.g. "1,204 preemptions, 31.0 s on CPU"
    tid: int | None = None  # a thread of it named as the cause (a lock or GIL holder); None: the process


@dataclass(frozen=True)
class Window:
    """One evidence window: [start_ns, end_ns)."""

    start_ns: int
    end_ns: int


@dataclass
class Chain:
    """Cause -> effect, with the numbers and the fix."""

    rule_id: str
    severity: str  # HIGH | MEDIUM | LOW
    title: str
    root: list[str]
    effect: list[str]
    fix: list[str]
    contributing: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # processes that suffer the effect
    culprits: list[Culprit] = field(default_factory=list)
    evidence_windows: list[Window] = field(default_factory=list)
    windows_total: int = 0  # active windows of the affected process
    # Pearson correlation, across the affected process' active windows, of the
    # cause metric with the effect metric (None when either is constant).
    # None too when no window is free of the cause (nothing to correlate) or
    # when the sign contradicts the chain; ``correlation_note`` says what was
    # correlated and which way, e.g. "CUDA ops/s fall as CPU wait rises".
    correlation: float | None = None
    correlation_note: str = ""
    # Share of the affected loop's wall clock in the evidence windows that the
    # cause took (time lost to it over those windows' time), 0-1.  Every rule
    # measures it the same way; explain turns it into ``share``.
    impact: float = 0.0
    # Share of the affected loop's whole analysed wall clock (every window it
    # was active in) that the cause explains, 0-1: the ranking key, printed
    # as "N% of the loop's time in the range".  Set by explain from impact.
    share: float = 0.0
    numbers: dict[str, float] = field(default_factory=dict)  # key numbers, machine readable
    # What the chain measures when it is no share of wall clock (a notice: "306,000 of 306,000
    # CUDA calls failed"), printed instead of "N% of the loop's time in the range"; "" for timing chains.
    headline: str = ""

    def sort_key(self) -> tuple[float, int]:
        return (-self.share, SEVERITY_RANK.get(self.severity, 9))


@dataclass
class SystemContext:
    cpu_pct: float | None = None
    mem_pct: float | None = None
    load1: float | None = None
    ncpu: int | None = None
    swap_used_bytes: int | None = None
    iowait_pct: float | None = None
    gpu_util_pct: float | None = None  # None: no NVML samples


@dataclass
class Analysed:
    """What explain looked at, printed on every run (and alone on a healthy one)."""

    session_id: int | None
    start_ns: int
    end_ns: int
    window_s: float
    windows: int
    events: int
    cuda_events: int
    processes: list[str]  # "python3 (train.py) (PID 4242)": the processes that made CUDA calls
    drops_kernel: int = 0
    drops_user: int = 0
    stale_calls: int = 0  # CUDA calls that never returned: counted, never stored as rows
    probe_misses: int = 0  # BPF program runs the kernel skipped: each may have lost a row
    followed: int = 0  # other traced processes (no CUDA calls: launcher helpers, DataLoader workers)


@dataclass
class DeviceBusy:
    """How busy the device was over the analysed span (the steps' span when steps are known,
    else the span of the CUDA calls): measured from a device timeline (an imported profiler
    trace, or CUPTI in a traced --cmd), or inferred from the CUDA call stream, with the bounds
    the calls allow."""

    busy_share: float  # 0..1, the point estimate (= low = high when measured)
    low: float
    high: float
    source: str  # 'measured' | 'inferred'
    span_ns: int = 0
    # NVML's utilization of the one sampled GPU over the same span, 0..1 (None: not one GPU
    # sampled): the share of time a kernel of any process ran there, copies not counted
    nvml_util: float | None = None
    # measured live, by whom ('CUPTI': ingero's injection library in the traced command);
    # None: inferred, or an imported trace's own timeline
    measured_by: str | None = None


@dataclass
class StepStats:
    """The loop's steps: ProfilerStep#N marks where a trace has them, step-named NVTX ranges where
    a live trace has them, else the rhythm of the calls."""

    count: int
    median_ms: float
    p99_ms: float
    source: str = ""  # 'marked' (ProfilerStep#N) | 'nvtx' | 'rhythm'
    marker: str | None = None  # 'nvtx': the ranges' name, numbers as '#' ("step #")
    pid: int | None = None  # the process whose steps these are ('nvtx', 'rhythm': the main CUDA process)
    # share of the mean step spent in each part (data wait, host work, launches, copies,
    # device wait, CPU wait, faults and I/O, ...): adds up to 1 where known
    breakdown: dict[str, float] = field(default_factory=dict)
    unit: str = "step"  # 'request' when the process is a server (analyze/kind.py): a step serves one


@dataclass(frozen=True)
class Workload:
    """What a traced CUDA process is, from what it did (analyze/kind.py): only servers are listed."""

    pid: int
    kind: str  # 'inference server'
    name: str
    evidence: str
    requests_per_s: float | None = None


@dataclass
class Report:
    analysed: Analysed
    system: SystemContext
    chains: list[Chain]
    notes: list[str] = field(default_factory=list)
    stack: dict[str, Any] | None = None  # explain --stack: top callers / preempted lines
    device: DeviceBusy | None = None  # None: neither measured nor inferable (no CUDA calls)
    steps: StepStats | None = None
    workloads: list[Workload] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
