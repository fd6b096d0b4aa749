"""Live: what loading and closing the BPF object leaves behind in this process.

Program.close() hands the uprobe fds to a background closer instead of letting
BCC detach them one by one (~0.1 s each).  BCC counts open uprobes per process
against a quota (BCC_PROBE_LIMIT, 1000 by default) and only its own detach gave
them back: a process that loaded and closed the object some 20 times was then
refused every attach.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads import libcudart

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)


def test_closing_a_program_gives_its_uprobes_back_to_bccs_quota(tmp_path, monkeypatch):
    import bcc

    from ingero.collect.libs import LibraryWatcher
    from ingero.collect.loader import UPROBE_MULTI_ENV, BpfSettings, load_program

    monkeypatch.setenv(UPROBE_MULTI_ENV, "0")  # BCC's perf-event uprobes, as on a kernel without links

    lib = libcudart()
    assert lib is not None, "nvidia-cuda-runtime-cu12 is needed"
    copy = tmp_path / "cudart-private.so"  # a file of our own: other tracers on the host do not touch it
    copy.write_bytes(lib.read_bytes())
    found = next(x for x in LibraryWatcher(extra=[copy]).poll() if x.path == copy)
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
    that program's offsets in that file, and BCC holds no perf-event uprobe (loader.LinkedProbes)."""
    import bcc

    from ingero.collect import probes
    from ingero.collect.libs import LibraryWatcher
    from ingero.collect.loader import BpfSettings, load_program

    lib = libcudart()
    assert lib is not None, "nvidia-cuda-runtime-cu12 is needed"
    copy = tmp_path / "cudart-private.so"
    copy.write_bytes(lib.read_bytes())
    found = next(x for x in LibraryWatcher(extra=[copy]).poll() if x.path == copy)
    plan = probes.plan_library(str(copy), found.kind, frozenset(found.symbols))
    baseline = bcc._get_num_open_probes()
    prog = load_program(BpfSettings(empty=True))
    try:
        ok, failed = prog.attach_library(found.path, found.kind, found.identity, found.symbols)
        assert (ok, failed) == (len(plan), 0), [r.error for r in prog.records if not r.attached][:1]
        assert bcc._get_num_open_probes() == baseline and prog.link_refusal(copy) is None
        infos = [dict(line.split(":\t", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
                      if ":\t" in line) for fd in prog.links._links.values()]
        assert len(infos) == len({(a.fn, a.probe_kind) for a in plan})
        assert {i["path"] for i in infos} == {str(copy.resolve())}
        assert sorted(i["link_type"] for i in infos).count("uretprobe_multi") == 1  # one return program
        assert sum(int(i["uprobe_cnt"]) for i in infos) == ok
    finally:
        prog.close()


def test_ingeros_uprobes_and_a_budgets_links_share_an_offset_in_either_order(tmp_path, monkeypatch):
    """Two tracers on one library, one with an overhead budget: the kernel keeps one ref_ctr_offset
    per probed offset, and BCC's own attach passes it garbage (0x6 here), which refused every
    uprobe_multi link (ref_ctr_offset 0) at a launch offset a plain trace already probed, and the
    other way round.  Ingero's uprobes pass 0: both tracers get every probe, whichever comes first."""
    from ingero.collect.budget import SWITCHED_OPS
    from ingero.collect.libs import LibraryWatcher
    from ingero.collect.loader import UPROBE_MULTI_ENV, BpfSettings, load_program

    lib = libcudart()
    assert lib is not None, "nvidia-cuda-runtime-cu12 is needed"
    copy = tmp_path / "cudart-private.so"  # a file of our own: other tracers on the host do not touch it
    copy.write_bytes(lib.read_bytes())
    found = next(x for x in LibraryWatcher(extra=[copy]).poll() if x.path == copy)

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
        assert links.refused == [] and links.notes == [], links.notes
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
