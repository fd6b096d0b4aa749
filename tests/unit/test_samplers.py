"""System sampler on scripted psutil readings; GPU sampler on a fake pynvml module."""

from __future__ import annotations

import sys
import time
import types
from collections import namedtuple

import pyarrow as pa
import pytest

import ingero.sample.system as system_mod
from ingero.sample.gpu import NO_NVML_NOTE, GpuSampler, driver_summary
from ingero.sample.system import SystemSampler
from ingero.store.db import Store

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
Swap = namedtuple("Swap", "total used free percent sin sout")
Mem = namedtuple("Mem", "total available percent used free")
CpuStats = namedtuple("CpuStats", "ctx_switches interrupts soft_interrupts syscalls")


def _columns(con, table: str) -> list[str]:
    return [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]


class ScriptedPsutil:
    """Each counter function returns its next scripted reading on each call."""

    def __init__(self, readings: list[dict]):
        self.readings = readings
        self.calls = {"cpu": 0, "swap": 0, "stats": 0}

    def _next(self, key):
        self.calls[key] += 1
        return self.readings[self.calls[key] - 1][key]

    def cpu_times(self, percpu=False):
        assert percpu
        return self._next("cpu")

    def swap_memory(self):
        return self._next("swap")

    def cpu_stats(self):
        return self._next("stats")

    def virtual_memory(self):
        return Mem(total=16_000, available=12_000, percent=25.0, used=3_000, free=9_000)

    def cpu_count(self):
        return 2


def _reading(cpus, sin, sout, ctx, used=0):
    return {
        "cpu": [CpuTimes(*c) for c in cpus],
        "swap": Swap(total=1 << 30, used=used, free=0, percent=0.0, sin=sin, sout=sout),
        "stats": CpuStats(ctx, 0, 0, 0),
    }


def test_system_sampler_turns_counters_into_interval_amounts(monkeypatch, tmp_path):
    # cpu0: 10 s total in the interval, 6 busy (user 4, system 2), 2 iowait, 2 idle
    # cpu1: 10 s total, 1 busy; guest time is inside user already and must not count twice
    zero = (0,) * 10
    readings = [
        _reading([zero, zero], sin=1000, sout=500, ctx=100),
        _reading(
            [(4, 0, 2, 2, 2, 0, 0, 0, 0, 0), (1, 0, 0, 9, 0, 0, 0, 0, 1, 0)],
            sin=5096, sout=500, ctx=350, used=123,
        ),
        _reading(  # swap counters reset (swapoff/swapon): no negative traffic
            [(4, 0, 2, 2, 2, 0, 0, 0, 0, 0), (1, 0, 0, 9, 0, 0, 0, 0, 1, 0)],
            sin=0, sout=0, ctx=350, used=0,
        ),
    ]  # fmt: skip
    monkeypatch.setattr(system_mod, "psutil", ScriptedPsutil(readings))
    monkeypatch.setattr(system_mod.os, "getloadavg", lambda: (1.5, 1.0, 0.5))
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("pgpgin 1\npgmajfault 40\npgmajfault_x 9\n")
    sampler = SystemSampler(vmstat=vmstat)  # primes with reading 0
    vmstat.write_text("pgpgin 1\npgmajfault 47\n")
    before = time.time_ns()
    row = sampler.sample()
    assert before <= row["timestamp"] <= time.time_ns()
    del row["timestamp"]
    assert row == {
        "cpu_pct": 35.0,  # (6 + 1) busy of 20 s
        "cpu_per_core_pct": [60.0, 10.0],
        "iowait_pct": 10.0,  # 2 of 20 s
        "mem_pct": 25.0,
        "mem_used_bytes": 4_000,  # total - available
        "mem_total_bytes": 16_000,
        "swap_used_bytes": 123,
        "swap_in_bytes": 4096,
        "swap_out_bytes": 0,
        "major_faults": 7,
        "ctx_switches": 250,
        "load1": 1.5,
        "ncpu": 2,
    }
    vmstat.unlink()  # unreadable vmstat: unknown, not zero
    row = sampler.sample()
    assert (row["swap_in_bytes"], row["major_faults"], row["ctx_switches"]) == (0, None, 0)
    assert row["cpu_pct"] == 0.0 and row["cpu_per_core_pct"] == [0.0, 0.0]  # no time passed


def test_system_row_fits_the_schema():
    sampler = SystemSampler()
    time.sleep(0.05)
    row = sampler.sample()
    store = Store.memory()
    assert sorted(row) == sorted(c for c in _columns(store.con, "system_metrics") if c != "session_id")
    assert store.append("system_metrics", pa.Table.from_pylist([row])) == 1
    cpu, cores, ncpu = store.con.execute("SELECT cpu_pct, cpu_per_core_pct, ncpu FROM system_metrics").fetchone()
    assert 0.0 <= cpu <= 100.0
    assert len(cores) == ncpu >= 1
    assert row["mem_total_bytes"] > row["mem_used_bytes"] > 0


# ---------------------------------------------------------------- GPU


class NVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict] | None, init_error: bool = False) -> types.ModuleType:
    """A pynvml stand-in: gpus is a list of per-GPU field dicts; a missing field raises NVMLError."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    m.calls = []

    def field(h, key):
        if key not in gpus[h]:
            raise NVMLError("Not Supported")
        return gpus[h][key]

    def init():
        m.calls.append("init")
        if init_error:
            raise NVMLError("Driver Not Loaded")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.14"
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: field(h, "name")
    m.nvmlDeviceGetUtilizationRates = lambda h: field(h, "util")
    m.nvmlDeviceGetMemoryInfo = lambda h: field(h, "mem")
    m.nvmlDeviceGetPowerUsage = lambda h: field(h, "power_mw")
    m.nvmlDeviceGetClockInfo = lambda h, t: field(h, {1: "sm", 2: "memclk"}[t])
    m.nvmlDeviceGetTemperature = lambda h, s: field(h, "temp")
    return m


Util = namedtuple("Util", "gpu memory")
MemInfo = namedtuple("MemInfo", "total free used")

A100 = {
    "name": b"NVIDIA A100-SXM4-40GB",  # older nvidia-ml-py returns bytes
    "util": Util(97, 41),
    "mem": MemInfo(40 << 30, 8 << 30, 32 << 30),
    "power_mw": 251_500,
    "sm": 1410,
    "memclk": 1215,
    "temp": 63,
}
CONSUMER = {"name": "NVIDIA GeForce GTX 1650", "util": Util(5, 1), "mem": MemInfo(4 << 30, 3 << 30, 1 << 30),
            "temp": 40}


def test_gpu_sampler_rows_and_unsupported_fields(monkeypatch):
    nvml = fake_pynvml([A100, CONSUMER])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    g = GpuSampler()
    assert g.available and g.note is None
    rows = g.sample()
    assert len(rows) == 2 and rows[0]["timestamp"] == rows[1]["timestamp"]
    for r in rows:
        del r["timestamp"]
    assert rows[0] == {
        "gpu": 0,
        "name": "NVIDIA A100-SXM4-40GB",
        "util_pct": 97.0,
        "mem_util_pct": 41.0,
        "mem_used_bytes": 32 << 30,
        "mem_total_bytes": 40 << 30,
        "power_w": 251.5,
        "sm_clock_mhz": 1410,
        "mem_clock_mhz": 1215,
        "temperature_c": 63,
    }
    # no power sensor, no clocks: None, the rest still there
    assert rows[1]["gpu"] == 1 and rows[1]["name"] == "NVIDIA GeForce GTX 1650"
    assert (rows[1]["power_w"], rows[1]["sm_clock_mhz"], rows[1]["mem_clock_mhz"]) == (None, None, None)
    assert (rows[1]["util_pct"], rows[1]["temperature_c"]) == (5.0, 40)
    g.close()
    assert nvml.calls == ["init", "shutdown"]
    assert g.sample() == []


def test_call_missing_from_this_pynvml_is_none(monkeypatch):
    nvml = fake_pynvml([A100])
    del nvml.nvmlDeviceGetPowerUsage
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    row = GpuSampler().sample()[0]
    assert (row["power_w"], row["sm_clock_mhz"], row["temperature_c"]) == (None, 1410, 63)


def test_gpu_rows_fit_the_schema(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([A100, CONSUMER]))
    rows = GpuSampler().sample()
    store = Store.memory()
    assert sorted(rows[0]) == sorted(c for c in _columns(store.con, "gpu_metrics") if c != "session_id")
    assert store.append("gpu_metrics", pa.Table.from_pylist(rows)) == 2
    assert store.con.execute("SELECT count(*) FROM gpu_metrics WHERE power_w IS NULL").fetchone()[0] == 1


@pytest.mark.parametrize("how", ["no module", "driver not loaded"])
def test_no_driver_is_a_note_not_an_error(monkeypatch, how):
    if how == "no module":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    else:
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_error=True))
    g = GpuSampler()
    assert (g.available, g.note, g.sample()) == (False, NO_NVML_NOTE, [])
    g.close()
    assert driver_summary() == NO_NVML_NOTE


def test_gpus_that_cannot_be_opened(monkeypatch):
    nvml = fake_pynvml([A100])

    def refuse(i):
        raise NVMLError("No Permission")

    nvml.nvmlDeviceGetHandleByIndex = refuse
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    g = GpuSampler()
    assert (g.available, g.note, g.sample()) == (False, "NVML found no usable GPU: GPU metrics off", [])


def test_driver_summary(monkeypatch):
    nvml = fake_pynvml([A100, CONSUMER])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert driver_summary() == "NVIDIA driver 550.54.14, 2 GPUs: NVIDIA A100-SXM4-40GB, NVIDIA GeForce GTX 1650"
    assert nvml.calls == ["init", "shutdown"]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    assert driver_summary() == "NVIDIA driver 550.54.14, 0 GPUs"


def test_real_nvml_here_never_raises():
    g = GpuSampler()  # no GPU on this project's machines; on a GPU host this must work too
    rows = g.sample()
    assert g.available == bool(rows)
    assert (g.note is None) == g.available
    assert isinstance(driver_summary(), str)
    g.close()

