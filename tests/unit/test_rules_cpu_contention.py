"""cpu-contention: fires on preemption aligned with a slowdown, names the competitor."""

from __future__ import annotations

import pytest

from analyze_helpers import MAIN_PID, MAIN_TID, S, T0, Trace, chains_of, silent
from ingero.analyze.rules import cpu_contention

STRESS = 7000


def contended(preempt_ms: float, **kw) -> Trace:
    tr = Trace()
    tr.name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py --epochs 3")
    tr.name(STRESS, "stress", "stress", "stress --cpu 2")
    tr.loop(0, 10).loop(10, 20, preempt_ms=preempt_ms, preempt_by=STRESS, **kw).loop(20, 30)
    tr.competitor(STRESS, "stress", 10, 20, oncpu=0.9)
    return tr.system(0, 30)


def test_fires_with_culprit_numbers_and_fix():
    report = contended(40).explain()
    [chain] = chains_of(report, "cpu-contention")
    assert chain.severity == "HIGH"
    assert report.chains[0] is chain
    assert chain.culprits[0].pid == STRESS and chain.culprits[0].name == "stress"
    # steps: 30 ms (GPU-bound) clean; 40 ms preempted + 5.3 ms host work when contended
    assert len(chain.evidence_windows) == 10
    assert chain.numbers["cpu_wait_share"] == pytest.approx(40 / 45.3, abs=0.02)
    assert chain.numbers["throughput_drop"] == pytest.approx(1 - 30.05 / 45.3, abs=0.03)
    assert chain.correlation is not None and chain.correlation < -0.9
    assert "taskset -c 1 python3 train.py --epochs 3   (give the loop its own core)" in chain.fix
    assert "renice -n 19 -p 7000" in chain.fix
    assert any("involuntary context switches on python3 (train.py) (PID 4242)" in r for r in chain.root)


def test_where_autogroups_are_on_the_fix_lowers_the_competitors_autogroup():
    """renice alone orders processes inside one session only: the fix must say what reaches."""
    tr = contended(40)
    tr.sched_autogroup = True
    [chain] = chains_of(tr.explain(), "cpu-contention")
    assert "renice -n 19 -p 7000" in chain.fix
    assert ("for p in 7000; do echo 19 > /proc/$p/autogroup; done   "
            "(autogroups are on: renice alone does not reach across sessions)") in chain.fix
    # off (and unknown, in a database older than schema 4): renice is the whole fix
    for setting in (False, None):
        tr.sched_autogroup = setting
        [chain] = chains_of(tr.explain(), "cpu-contention")
        assert not any("autogroup" in f for f in chain.fix)


def test_stale_calls_are_shown_in_what_was_analysed():
    tr = contended(40)
    tr.stale_calls = 3
    report = tr.explain()
    assert report.analysed.stale_calls == 3


def _throughout(preempt_ms: float) -> Trace:
    # host-bound steps (~5.3 ms of host work, 2 ms of GPU work), preempted in every window
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.name(STRESS, "stress", "stress", "stress --cpu 2").competitor(STRESS, "stress", 0, 30)
    return tr.loop(0, 30, device_ms=2, preempt_ms=preempt_ms, preempt_by=STRESS).system(0, 30)


def test_just_below_threshold_is_silent():
    # 0.4 ms of 5.7 ms per step = 7% < min_wait_share (10%)
    assert silent(_throughout(0.4).explain(), "cpu-contention")
    # 0.8 ms of 6.1 ms = 13%: above it, present throughout, under high_wait_share -> LOW
    [chain] = chains_of(_throughout(0.8).explain(), "cpu-contention")
    assert chain.severity == "LOW"
    assert cpu_contention.T.min_wait_share <= chain.numbers["cpu_wait_share"] < cpu_contention.T.high_wait_share


def test_voluntary_sleeps_only_are_not_contention():
    # the same lost time, but sleeping (waiting for data), not runnable
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.loop(0, 10).loop(10, 20, wait_ms=40).loop(20, 30).system(0, 30)
    report = tr.explain()
    assert silent(report, "cpu-contention")


def test_long_sync_waits_are_not_contention():
    # GPU-bound: the loop sleeps 90% of the time inside cudaStreamSync
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.loop(0, 30, device_ms=200).system(0, 30)
    assert silent(tr.explain())


def test_present_throughout_reports_lost_time():
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.name(STRESS, "gzip", "gzip", "gzip -9 big.tar")
    tr.loop(0, 30, preempt_ms=30, preempt_by=STRESS).competitor(STRESS, "gzip", 0, 30).system(0, 30)
    [chain] = chains_of(tr.explain(), "cpu-contention")
    assert chain.severity == "HIGH"
    assert chain.culprits[0].name == "gzip"
    # no clean window: said so, compared with the run itself (runnable vs on CPU), no correlation
    assert chain.effect[0].startswith("no clean window to compare with (CPU wait in 29 of 29 active windows)")
    assert "the loop was runnable" in chain.effect[0] and "waited" in chain.effect[0]
    assert not any("present in every active window" in e for e in chain.effect)
    assert chain.correlation is None and chain.correlation_note == ""


def test_present_throughout_but_varying_compares_least_and_most_contended():
    # contended everywhere, but four times harder in the second half: the least-contended
    # quarter of the run is the baseline, and the effect is the drop against it
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.name(STRESS, "gzip", "gzip", "gzip -9 big.tar").competitor(STRESS, "gzip", 0, 30)
    tr.loop(0, 15, preempt_ms=10, preempt_by=STRESS).loop(15, 30, preempt_ms=60, preempt_by=STRESS)
    [chain] = chains_of(tr.system(0, 30).explain(), "cpu-contention")
    assert chain.effect[0].startswith("no clean window to compare with")
    [line] = [e for e in chain.effect if "in the quarter of windows with the most CPU wait" in e]
    assert "in the quarter with the least" in line and "down" in line
    assert chain.correlation is None


def test_correlation_is_shown_with_its_meaning_only_when_windows_vary():
    chain = chains_of(contended(40).explain(), "cpu-contention")[0]
    assert chain.correlation < 0 and chain.correlation_note == "CUDA ops/s fall as CPU wait rises"


def test_preempted_by_own_workers_is_medium_and_sizes_workers():
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    for k in range(4):
        tr.name(5000 + k, "python3 (train.py)", "pt_data_worker", "python3 train.py")
        tr.worker(5000 + k, 0, 30, oncpu=0.5)
    tr.loop(0, 10).loop(10, 20, preempt_ms=40, preempt_by=5001).loop(20, 30).system(0, 30)
    [chain] = chains_of(tr.explain(), "cpu-contention")
    assert chain.severity == "MEDIUM"
    assert chain.culprits[0].pid == 5001 and "(same job)" in chain.culprits[0].detail
    assert any(f.startswith("DataLoader(num_workers=1,") for f in chain.fix)


def test_generalises_to_other_hosts_names_and_windows():
    # 8 cores, another job name and competitor, 60 s run, 2 s windows, contention in the middle
    tr = Trace(ncpu=8)
    tr.name(9100, "python3 (finetune_llm.py)", "python3", "python3 finetune_llm.py --bs 16")
    tr.name(9200, "ffmpeg", "ffmpeg", "ffmpeg -i in.mp4 out.webm")
    tr.loop(0, 20, pid=9100, tid=9101, device_ms=50)
    tr.loop(20, 44, pid=9100, tid=9101, device_ms=50, preempt_ms=80, preempt_by=9200)
    tr.loop(44, 60, pid=9100, tid=9101, device_ms=50)
    tr.competitor(9200, "ffmpeg", 20, 44).system(0, 60)
    report = tr.explain(window_s=2.0)
    [chain] = chains_of(report, "cpu-contention")
    assert chain.severity == "HIGH" and chain.pids == [9100]
    assert chain.culprits[0].name == "ffmpeg"
    assert len(chain.evidence_windows) == 12
    assert "taskset -c 7 python3 finetune_llm.py --bs 16   (give the loop its own core)" in chain.fix
    assert "taskset -acp 0-6 9200   (keep ffmpeg off it)" in chain.fix


def test_preemption_hidden_behind_gpu_work_is_not_a_chain():
    # 30 ms preempted per step while the GPU works 50 ms: the step does not get longer
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.loop(0, 10, device_ms=50).loop(10, 20, device_ms=50, preempt_ms=30, preempt_by=STRESS).loop(20, 30, device_ms=50)
    tr.name(STRESS, "stress", "stress").competitor(STRESS, "stress", 10, 20).system(0, 30)
    assert silent(tr.explain(), "cpu-contention")


def test_children_of_the_training_process_are_its_workers_not_competitors():
    # an untraced process preempts the loop; process_names says it is a child of the loop's process
    worker = 5001
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.name(worker, "python3 (train.py)", "pt_data_worker", "python3 train.py", ppid=MAIN_PID)
    tr.loop(0, 10).loop(10, 20, preempt_ms=40, preempt_by=worker).loop(20, 30)
    tr.competitor(worker, "pt_data_worker", 10, 20, oncpu=0.9).system(0, 30)
    [chain] = chains_of(tr.explain(), "cpu-contention")
    [culprit] = chain.culprits
    assert culprit.pid == worker and culprit.name == "python3 (train.py), worker (child of PID 4242)"
    assert culprit.detail.endswith("(same job)")
    assert not any(f.startswith("renice") for f in chain.fix)  # not an unrelated competitor
    assert any("workers of PID 4242" in f for f in chain.fix)
    assert chain.severity == "MEDIUM"


def test_names_without_parent_pids_degrade_to_traced_membership():
    # an older database (no ppid column): the same process is then an outsider
    import duckdb

    from ingero.analyze import procs

    con = duckdb.connect()
    con.execute("CREATE TABLE process_names (pid INTEGER, name VARCHAR, comm VARCHAR, cmdline VARCHAR)")
    con.execute("CREATE TABLE process_cpu (pid INTEGER, comm VARCHAR)")
    con.execute("INSERT INTO process_names VALUES (5001, 'python3 (train.py)', 'pt_data_worker', 'python3 x.py')")
    p = procs.lookup(con, [5001])[5001]
    assert p.ppid is None and not p.child_of(MAIN_PID) and p.role(MAIN_PID) == "python3 (train.py)"


def test_the_tracer_itself_is_its_cost_never_a_culprit():
    """Traced with --pid, the ingero process preempting the loop was listed as a culprit and put in
    the taskset and renice fixes; under --cmd, as a process "of the same job" (it is the job's parent)."""
    TRACER = 7300
    tr = contended(40)
    tr.tracer_pid = TRACER
    tr.name(TRACER, "python3 (ingero)", "python3", "python3 -m ingero trace --pid 4242")
    for k in range(50):  # the tracer's own preemptions of the loop: 10 ms each, 1.5 s in all
        tr.switch(T0 + 10 * S + k * S // 5 + 1_000, MAIN_PID, MAIN_TID, 10_000_000, "preempted", other=TRACER)
    tr.competitor(TRACER, "python3", 10, 20, oncpu=0.3)
    [chain] = chains_of(tr.explain(), "cpu-contention")
    assert [c.pid for c in chain.culprits] == [STRESS]
    assert not any("7300" in f for f in chain.fix), chain.fix
    [line] = [c for c in chain.contributing if c.startswith("ingero's own tracer (PID 7300)")]
    assert line.endswith("the cost of tracing, not a culprit")


def test_the_jobs_own_processes_that_are_not_its_workers_get_no_dataloader_fix():
    """A launcher (the loop's parent) preempting the loop is the job's own, but no DataLoader sizes it."""
    LAUNCHER = 4000
    tr = Trace().name(LAUNCHER, "bash (run.sh)", "bash", "bash run.sh", ppid=1)
    tr.name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py", ppid=LAUNCHER)
    tr.loop(0, 10).loop(10, 20, preempt_ms=40, preempt_by=LAUNCHER).loop(20, 30).system(0, 30)
    tr.competitor(LAUNCHER, "bash", 10, 20, oncpu=0.9)
    [chain] = chains_of(tr.explain(), "cpu-contention")
    assert chain.culprits[0].pid == LAUNCHER and "(same job)" in chain.culprits[0].detail
    assert not any("DataLoader" in f for f in chain.fix), chain.fix


def _two_jobs(ncpu: int) -> Trace:
    """Two GPU loops (other scripts, other PIDs) pinned to one core, each preempting the other
    from 10 s to 20 s of 30."""
    a, b = 5100, 5300
    tr = Trace(ncpu=ncpu)
    tr.name(a, "python3 (serve_ranker.py)", "python3", "python3 serve_ranker.py --port 8001", ppid=900)
    tr.name(b, "python3 (embed_batch.py)", "python3", "python3 embed_batch.py --shard 3", ppid=901)
    for me, other in ((a, b), (b, a)):
        tr.loop(0, 10, pid=me, tid=me).loop(10, 20, pid=me, tid=me, preempt_ms=40, preempt_by=other)
        tr.loop(20, 30, pid=me, tid=me)
    return tr.system(0, 30)


@pytest.mark.parametrize("ncpu", [2, 4])
def test_two_gpu_jobs_on_one_core_get_one_split_a_core_each(ncpu):
    chains = chains_of(_two_jobs(ncpu).explain(), "cpu-contention")
    assert sorted(c.pids[0] for c in chains) == [5100, 5300]
    plans = {tuple(f for f in c.fix if f.startswith("taskset")) for c in chains}
    # both chains give the same plan, the two jobs on different cores, and neither is reniced
    assert plans == {(f"taskset -acp {ncpu - 1} 5100   (python3 (serve_ranker.py): a core of its own; every GPU loop "
                      f"here gets one)",
                      f"taskset -acp {ncpu - 2} 5300   (python3 (embed_batch.py): a core of its own; every GPU loop "
                      f"here gets one)")}
    assert not any(f.startswith("renice") for c in chains for f in c.fix)


def test_more_gpu_jobs_than_cores_are_told_no_split_fits():
    [chain, _] = chains_of(_two_jobs(1).explain(), "cpu-contention")
    assert ("2 GPU loops share 1 core (PIDs 5100, 5300): no split gives each a core; run them one after another, "
            "or move one to another host") in chain.fix
