"""GPU metrics through NVML (nvidia-ml-py), one ``gpu_metrics`` row per GPU per call.

No driver, no NVML, or NVML failing to start is a normal condition (every
machine of this project has no GPU): the sampler says so once in ``note``,
reports ``available = False`` and returns no rows.  It never raises.  A
field a GPU does not support (power on many consumer boards, clocks under
some virtualization) is None in the row, and the rest of the row stays.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable

NO_NVML_NOTE = "no NVIDIA driver (NVML unavailable): GPU metrics off"


def _load_nvml() -> Any | None:
    """The initialised pynvml module, or None when NVML cannot be used here."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    return nvml


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class GpuSampler:
    def __init__(self) -> None:
        self.note: str | None = None
        self.available = False
        self._handles: list[tuple[int, Any, str | None]] = []
        self._nvml = _load_nvml()
        if self._nvml is None:
            self.note = NO_NVML_NOTE
            return
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            self.note = f"NVML started but cannot count GPUs ({_text(e)}): GPU metrics off"
            return
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError:
                continue  # a GPU NVML cannot open (lost, no permission): the others still count
            self._handles.append((index, handle, self._get(lambda h=handle: _text(nvml.nvmlDeviceGetName(h)))))
        if not self._handles:
            self.note = "NVML found no usable GPU: GPU metrics off"
            return
        self.available = True

    def _get(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except self._nvml.NVMLError:
            return None
        except AttributeError:  # an nvidia-ml-py too old or too new to have this call
            return None

    def sample(self) -> list[dict]:
        if not self.available:
            return []
        nvml, get = self._nvml, self._get
        rows = []
        now = time.time_ns()
        for index, h, name in self._handles:
            util = get(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
            mem = get(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
            power_mw = get(lambda: nvml.nvmlDeviceGetPowerUsage(h))
            rows.append(
                {
                    "timestamp": now,
                    "gpu": index,
                    "name": name,
                    "util_pct": float(util.gpu) if util is not None else None,
                    "mem_util_pct": float(util.memory) if util is not None else None,
                    "mem_used_bytes": int(mem.used) if mem is not None else None,
                    "mem_total_bytes": int(mem.total) if mem is not None else None,
                    "power_w": power_mw / 1000.0 if power_mw is not None else None,  # NVML reports mW
                    "sm_clock_mhz": get(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
                    "mem_clock_mhz": get(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
                    "temperature_c": get(lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
                }
            )
        return rows

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None
            self.available = False


def driver_summary() -> str:
    """One line for ``ingero check``: driver version and GPUs, or why there are none."""
    nvml = _load_nvml()
    if nvml is None:
        return NO_NVML_NOTE
    try:
        try:
            version = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            version = "version unknown"
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            return f"NVIDIA driver {version}, cannot count GPUs ({_text(e)})"
        names = []
        for index in range(count):
            try:
                names.append(_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index))))
            except nvml.NVMLError:
                names.append("?")
        listed = f": {', '.join(names)}" if names else ""
        return f"NVIDIA driver {version}, {count} GPU{'s' if count != 1 else ''}{listed}"
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
