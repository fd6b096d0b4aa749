"""Live: what loading and closing the BPF object leaves behind in this process.

Program.close() hands the uprobe fds to a background closer instead of letting
BCC detach them one by one (~0.1 s each).  BCC counts open uprobes per process
against a quota (BCC_PROBE_LIMIT, 1000 by default) and only its own detach gave
them back: a process that loaded and closed the object some 20 times was then
refused every attach.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from workloads import libcudart, wait_for

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)


def _links_on(path: Path) -> list[dict]:
    """fdinfo of this process' uprobe_multi links on ``path`` (a replaced file's ends " (deleted)")."""
    out = []
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            text = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue
        info = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        if info.get("link_type", "").endswith("probe_multi") and info.get("path", "").startswith(str(path)):
            out.append(info)
    return out


def _private_copy(tmp_path: Path):
    """A copy of the wheel's libcudart of our own (no other tracer on the host touches it), as found."""
    from ingero.collect.libs import LibraryWatcher

    lib = libcudart()
    assert lib is not None, "nvidia-cuda-runtime-cu12 is needed"
    copy = (tmp_path / "cudart-private.so").resolve()
    copy.write_bytes(lib.read_bytes())
    return copy, next(x for x in LibraryWatcher(extra=[copy]).poll() if x.path == copy)


def test_closing_a_program_gives_its_uprobes_back_to_bccs_quota(tmp_path, monkeypatch):
    import bcc

    from ingero.collect.loader import UPROBE_MULTI_ENV, BpfSettings, load_program

    monkeypatch.setenv(UPROBE_MULTI_ENV, "0")  # BCC's perf-event uprobes, as on a kernel without links

    copy, found = _private_copy(tmp_path)
    baseline = bcc._get_num_open_probes()
    attached = []
    for cycle in range(3):
        prog = load_program(BpfSettings(empty=True))
        try:
            ok, failed = prog.attach_library(found.path, found.kind, found.identity, found.symbols)
            assert failed == 0, [r.error for r in prog.records if not r.attached][:1]
            assert bcc._get_num_open_probes() == baseline + ok
            attached.append(ok)
            if cycle == 0:
                # room for exactly one load's probes: the next cycles fit only if this one gave them back
                monkeypatch.setenv("BCC_PROBE_LIMIT", str(baseline + ok))
        finally:
            prog.close()
        assert bcc._get_num_open_probes() == baseline
    assert attached[0] > 20 and attached == [attached[0]] * 3, attached


def test_a_librarys_probes_are_one_link_per_program_and_no_perf_event(tmp_path):
    """Every probe of a library is a uprobe_multi link: one per (BPF program, entry or return), holding
    that program's offsets in that file, and BCC holds no perf-event uprobe (loader.LinkedProbes).
    Closing the program closes every link."""
    import bcc

    from ingero.collect import probes
    from ingero.collect.loader import BpfSettings, load_program

    copy, found = _private_copy(tmp_path)
    plan = probes.plan_library(str(copy), found.kind, frozenset(found.symbols))
    baseline = bcc._get_num_open_probes()
    prog = load_program(BpfSettings(empty=True))
    try:
        ok, failed = prog.attach_library(found.path, found.kind, found.identity, found.symbols)
        assert (ok, failed) == (len(plan), 0), [r.error for r in prog.records if not r.attached][:1]
        assert bcc._get_num_open_probes() == baseline and prog.link_refusal(copy) is None
        infos = _links_on(copy)
        assert len(infos) == len({(a.fn, a.probe_kind) for a in plan})
        assert {i["path"] for i in infos} == {str(copy)}
        assert sorted(i["link_type"] for i in infos).count("uretprobe_multi") == 1  # one return program
        assert sum(int(i["uprobe_cnt"]) for i in infos) == ok
    finally:
        prog.close(wait=True)
    assert _links_on(copy) == []


def test_a_library_replaced_at_its_path_has_links_on_both_files_and_closing_closes_all(tmp_path):
    """An upgrade replaces the file at a path (a new inode) while old processes still map the old
    one: both files keep their own links (the offsets read from each), and none outlives the close."""
    from ingero.collect.libs import LibraryWatcher
    from ingero.collect.loader import BpfSettings, load_program

    copy, found = _private_copy(tmp_path)
    prog = load_program(BpfSettings(empty=True))
    try:
        ok, failed = prog.attach_library(found.path, found.kind, found.identity, found.symbols)
        assert failed == 0
        groups = len(_links_on(copy))
        new = tmp_path / "new.so"
        new.write_bytes(copy.read_bytes())
        os.replace(new, copy)
        again = next(x for x in LibraryWatcher(extra=[copy]).poll() if x.path == copy)
        assert again.identity != found.identity
        assert prog.attach_library(again.path, again.kind, again.identity, again.symbols) == (ok, 0)
        assert sorted(i["path"] for i in _links_on(copy)) == [str(copy)] * groups + [f"{copy} (deleted)"] * groups
    finally:
        prog.close(wait=True)
    assert _links_on(copy) == []


def test_a_library_whose_links_are_refused_part_way_gets_perf_events_and_keeps_no_link(tmp_path, monkeypatch):
    """The kernel refuses the fifth link (as it does where another tool's probe holds an offset):
    the library's probes are all perf-event uprobes, each entry with its return, and the four
    links made before the refusal are closed."""
    import bcc

    from ingero.collect import loader, probes
    from ingero.collect.loader import BpfSettings, load_program

    copy, found = _private_copy(tmp_path)
    plan = probes.plan_library(str(copy), found.kind, frozenset(found.symbols))
    real, calls = loader._bpf_link_uprobe_multi, []

    def refuse_the_fifth(*a, **kw):
        calls.append(a)
        if len(calls) == 5:
            raise OSError(errno.EINVAL, "refused by the test")
        return real(*a, **kw)

    monkeypatch.setattr(loader, "_bpf_link_uprobe_multi", refuse_the_fifth)
    baseline = bcc._get_num_open_probes()
    prog = load_program(BpfSettings(empty=True))
    try:
        ok, failed = prog.attach_library(found.path, found.kind, found.identity, found.symbols)
        assert (ok, failed) == (len(plan), 0) and len(calls) == 5
        assert bcc._get_num_open_probes() == baseline + ok
        assert "refused by the test" in prog.link_refusal(copy)
        kinds = {}
        for r in prog.records:
            if r.target == str(copy) and r.attached:
                kinds.setdefault(r.symbol, set()).add(r.probe_kind)
        assert len(kinds) == len(plan) // 2 and all(k == {"uprobe", "uretprobe"} for k in kinds.values()), kinds
        assert wait_for(lambda: _links_on(copy) == [], timeout=60)  # closed on threads of their own
    finally:
        prog.close(wait=True)


def test_ingeros_uprobes_and_a_budgets_links_share_an_offset_in_either_order(tmp_path, monkeypatch):
    """Two tracers on one library, one with an overhead budget: the kernel keeps one ref_ctr_offset
    per probed offset, and BCC's own attach passes it garbage (0x6 here), which refused every
    uprobe_multi link (ref_ctr_offset 0) at a launch offset a plain trace already probed, and the
    other way round.  Ingero's uprobes pass 0: both tracers get every probe, whichever comes first."""
    from ingero.collect.budget import SWITCHED_OPS
    from ingero.collect.loader import UPROBE_MULTI_ENV, BpfSettings, load_program

    copy, found = _private_copy(tmp_path)

    def plain():
        with monkeypatch.context() as m:  # a plain trace as perf events, as on a kernel without links
            m.setenv(UPROBE_MULTI_ENV, "0")
            prog = load_program(BpfSettings(empty=True))
        ok, failed = prog.attach_library(found.path, found.kind, found.identity, found.symbols)
        assert ok > 20 and failed == 0, [r.error for r in prog.records if not r.attached][:1]
        return prog

    def budgeted():
        prog = load_program(BpfSettings(empty=True))
        links = prog.switchable_probes(SWITCHED_OPS)
        links.attach()
        ok, failed = prog.attach_library(found.path, found.kind, found.identity, found.symbols)
        assert links.refused_why == {} and links.notes == [], links.notes
        assert prog.link_refusal(found.path) is None  # the other probes: links too
        assert failed == 0 and links.switchable(), [r.error for r in prog.records if not r.attached][:1]
        links.detach()
        links.attach()  # the re-attach of every period: refused too, before
        assert links.attached
        return prog

    for order in ((plain, budgeted), (budgeted, plain)):
        progs = []
        try:
            for make in order:
                progs.append(make())
        finally:
            for prog in progs:
                prog.close()


def test_a_budget_cycle_after_the_close_links_nothing(tmp_path):
    """The budget's thread may re-attach its launch probes just as the trace closes the program
    (an error path stops the hooks after the close): a released set links nothing again."""
    from ingero.collect.budget import SWITCHED_OPS
    from ingero.collect.loader import BpfSettings, load_program

    copy, found = _private_copy(tmp_path)
    prog = load_program(BpfSettings(empty=True))
    links = prog.switchable_probes(SWITCHED_OPS)
    links.attach()
    try:
        assert prog.attach_library(found.path, found.kind, found.identity, found.symbols)[1] == 0
        links.detach()
    finally:
        prog.close(wait=True)
    links.attach()
    assert not links.attached and _links_on(copy) == []


def test_a_launch_is_priced_by_the_kind_of_its_entry_in_nvidias_runtime(tmp_path):
    """The calibration times both kinds of entry on this libc, and NVIDIA's launches (each begins
    with a push, which the kernel's uprobe code emulates) are priced as a push (entry_cost.py):
    the mov-entry figure alone made the launch-bound demo "launch-bound only while traced"."""
    from collections import Counter

    from ingero.collect import entry_cost, probes
    from ingero.collect.loader import BpfSettings, load_program
    from ingero.events.ops import LAUNCH_OP_CODES

    copy, found = _private_copy(tmp_path)
    plan = probes.plan_library(str(copy), found.kind, frozenset(found.symbols))
    launches = [a for a in plan if a.probe_kind == "uprobe" and a.op in LAUNCH_OP_CODES]
    prog = load_program(BpfSettings(empty=True))
    try:
        entry_cost.calibrate_links(prog, prog.links)
        assert set(prog.call_costs.by_kind) == {entry_cost.PUSH, entry_cost.OTHER}
        assert prog.call_cost_ns == prog.call_costs.by_kind[entry_cost.PUSH]  # before any library
        ok, failed = prog.attach_library(found.path, found.kind, found.identity, found.symbols)
        assert (ok, failed) == (len(plan), 0)
        assert len(launches) == 6  # cudaLaunchKernel, cudaLaunchKernelExC, cudaGraphLaunch, each with its _ptsz
        assert prog.call_costs.launch_kinds == Counter({entry_cost.PUSH: len(launches)})
        assert prog.call_cost_ns == prog.call_costs.by_kind[entry_cost.PUSH]
    finally:
        prog.close(wait=True)
