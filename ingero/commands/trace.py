"""`ingero trace`: record CUDA calls and host events into the store."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from ingero.commands.options import (COMMAND, COUNT, DURATION, SIZE, Value, db_option, json_option, pid_option,
                                     resolve_db)
from ingero.metrics.bind import DEFAULT_ADDR, parse_address, parse_port
from ingero.values import parse_percent

# Lines of the trace's end that say what the tracer itself did and cost (how its summaries were
# written, how long its holds took, intervals its probes closed by inference): shown with -v, and
# always in --json's summary (bench/ reads them there).  What was recorded or lost is always shown.
DETAIL_NOTES = ("summaries: ", "holds: ", "scheduler: ")
_SUMMARIES_FAILED = "summaries: failed"  # a bug said, not a detail


class TraceCommand(click.Command):
    """Everything after the first word that is not an option is the command to trace, as given:
    `ingero trace -d 60s -- python3 train.py --lr 0.1` (`--` ends ingero's options; the job's own
    options never reach ingero's parser)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # (an empty `--`: ingero trace -d 5s --, which would otherwise trace every process)
        ctx.meta["trace.dashdash"] = "--" in args
        return super().parse_args(ctx, args)


def is_detail(note: str) -> bool:
    return note.startswith(DETAIL_NOTES) and not note.startswith(_SUMMARIES_FAILED)


@click.command("trace", cls=TraceCommand, context_settings={"allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD [ARGS]...]")
@click.option("-d", "--duration", type=DURATION, default=None,
              help="Stop after DURATION (30s, 2m); default: until Ctrl-C.")
@pid_option("Trace these processes and their children.")
@click.option("--comm", default=None, metavar="NAME", help="Trace processes with this name (as in `ps -o comm`).")
@click.option("--cmd", type=COMMAND, default=None,
              help='Start this command line (split like a shell, run without one), trace it and its children; '
                   'ends with it: --cmd "python3 train.py".  Or give the command after --.')
@click.option("--no-nvtx", is_flag=True,
              help="With a command: do not load ingero's NVTX injection library into the command (its NVTX "
                   "ranges are then not stored as spans; the library is built with the system C compiler).")
@click.option("--no-hold", is_flag=True,
              help="Never stop a process: by default one that opens a CUDA / NCCL library nobody had mapped "
                   "(a dlopen), or a traced one that execs a program, waits (at most 200 ms, a few ms as "
                   "measured) until its probes are in, so that its first calls are recorded too.")
@click.option("--no-cupti", is_flag=True,
              help="With a command: do not load ingero's CUPTI injection library into the command (the device's "
                   "kernels and copies are then inferred from the calls, not measured; the library is built "
                   "with the system C compiler against the CUDA toolkit's CUPTI headers).")
@click.option("--cuda-lib", "cuda_libs", multiple=True, type=click.Path(path_type=Path),
              help="Also probe this libcudart/libcuda file (repeatable).")
@click.option("--stack", is_flag=True, help="Record call stacks (Python + native) of CUDA calls and preemptions.")
@click.option("--streams", "launch_streams", is_flag=True,
              help="Also record each kernel launch's stream: read from the caller's memory, it adds "
                   "~0.2 us to every launch (measured on a 2-core VM). Async copies and syncs always "
                   "carry their stream.")
@click.option("--ring-mb", type=COUNT, metavar="MIB", default=128, show_default=True,
              help="Record ring size in MiB (power of two): ~2 s of events at 1 M/s.")
@click.option("--print-bpf", is_flag=True, help="Print the BPF program and compiler flags, then exit.")
@click.option("--retain", type=DURATION, default=None,
              help="Keep only the last DURATION of events (e.g. 24h): for always-on tracing.")
@click.option("--max-db", "max_db", type=SIZE, default=None,
              help="Prune the oldest data to keep the DB under SIZE (e.g. 10GB; at least 64MB).")
@click.option("--no-serve", is_flag=True,
              help="Do not answer `ingero query/explain/status` from other shells over the local socket.")
@click.option("--metrics-port", type=Value("port", parse_port), default=None,
              help="Serve Prometheus metrics on this port (/metrics): CUDA calls, off-CPU time, faults, "
                   "block I/O, tracer health, active causal chains. Off by default.")
@click.option("--metrics-addr", type=Value("address", parse_address), default=None,
              help=f"Address the metrics endpoint binds (default {DEFAULT_ADDR}; 0.0.0.0: every interface).")
@click.option("--overhead-budget", "overhead_budget",
              type=Value("overhead budget", parse_percent, metavar="PCT|off"), default=None,
              help="Keep what tracing costs the traced CUDA threads under PCT of their CPU (e.g. 2%): "
                   "kernel-launch probes are then attached for only a slice of each second and launch "
                   "counts are estimated (explain says so). Default: 2% in daemon mode (no --duration, no "
                   "command), off otherwise (every call traced); `off` traces every call (README: Overhead budget).")
@click.option("--publish", "publish_root", default=None, metavar="ROOT",
              help="Also publish closed Parquet segments to the fleet dataset at ROOT (a shared directory or a "
                   "pyarrow filesystem URL): `ingero fleet explain ROOT` asks every node at once.")
@click.option("--node", default=None, metavar="NAME",
              help="This node's name in the fleet dataset (default: the hostname).")
@click.option("--job", default=None, metavar="ID",
              help="The job's id in the fleet dataset (default: TORCHELASTIC_RUN_ID, "
                                           "SLURM_JOB_ID, the traced ranks' environment, else 'default').")
@click.option("--publish-segment", type=DURATION, default=None,
              help="Length of a published segment (default 5m, 5s-10m): a segment is published once closed.")
@click.option("-v", "--verbose", is_flag=True,
              help="Also print what the tracer did itself at the end (how its per-second summaries were "
                   "written, how long its holds took); --json always carries them.")
@db_option
@json_option
def command(argv, duration, pids, comm, cmd, no_nvtx, no_hold, no_cupti, cuda_libs, stack, launch_streams, ring_mb,
            print_bpf, retain, max_db, no_serve, metrics_port, metrics_addr, publish_root, node, job, publish_segment,
            overhead_budget,
            verbose, db_path, as_json) -> None:
    """Record CUDA runtime calls and the host events around them (needs root).

    \b
    By default every process that calls CUDA is traced, with its scheduling,
    page faults and block I/O; -p/--pid, --comm or a command narrow it down.
    A command (after --, or --cmd "...") is started, traced with its
    children, and ends the trace when it exits; its NVTX ranges
    (torch.cuda.nvtx, nvtx.annotate, nvtxRangePushA) are stored in the spans
    table, category 'nvtx', and the device's kernels, copies and memsets,
    as CUPTI measures them, in device_activity (explain then reads the
    measured timeline).  The command's output is its own: ingero's lines
    (progress, the per-second line, the summary) go to stderr, --json's
    objects to stdout (the command's stdout then goes to stderr).
    Without --duration it runs until Ctrl-C or SIGTERM (daemon mode); while
    it runs, `ingero query`, `explain` and `status` from another shell are
    answered by it over a local socket (root or the `ingero` group).
    \b
      sudo ingero trace -- python3 train.py --epochs 1
      sudo ingero trace -d 60s
      sudo ingero trace --cmd "python3 train.py"         (the same, as one string)
      sudo ingero trace -p 4242,4243 --stack --json
      sudo ingero trace --streams -- python3 train.py     (launch streams too)
      sudo ingero trace --retain 24h --max-db 10GB        (always on)
      sudo ingero trace --retain 24h --metrics-port 9464  (Prometheus scrapes it)
      sudo ingero trace --publish /mnt/shared/ingero -- torchrun train.py   (the fleet dataset)
      sudo ingero trace --overhead-budget 2% -- python3 train.py
    """
    from ingero.collect import session

    cmd = _command_line(argv, cmd, click.get_current_context())
    opts = session.TraceOptions(
        db_path=resolve_db(db_path),
        duration_s=duration,
        pids=list(pids),
        comm=comm,
        cmd=cmd,
        cuda_libs=list(cuda_libs),
        stack=stack,
        launch_streams=launch_streams,
        ring_mb=ring_mb,
        command_line=shlex.join(["ingero", *sys.argv[1:]]) if len(sys.argv) > 1 else "ingero trace",
        cmd_stdout_to_stderr=as_json,
        nvtx=not no_nvtx,
        hold=not no_hold,
        cupti=not no_cupti,
    )
    if print_bpf:
        from ingero.collect.loader import compiled_source

        files, cflags = compiled_source(session.settings_for(opts))
        click.echo(f"// cflags: {' '.join(cflags)}")
        for path, text in files:
            click.echo(f"\n// ===== {path} =====")
            click.echo(text)
        return
    from ingero.render.live import LiveView

    if metrics_addr is not None and metrics_port is None:
        raise click.UsageError("--metrics-addr needs --metrics-port")
    if metrics_port is not None:
        from ingero.metrics.server import MetricsServer

        # bound before anything is loaded or attached: a port in use is one line, nothing traced
        opts.hooks.append(MetricsServer.bind(metrics_addr or DEFAULT_ADDR, metrics_port))
    publisher = None
    if (node or job or publish_segment is not None) and publish_root is None:
        raise click.UsageError("--node, --job and --publish-segment need --publish ROOT")
    if publish_root is not None:
        from ingero.fleet.publish import DEFAULT_SEGMENT_S, MAX_SEGMENT_S, MIN_SEGMENT_S, Publisher

        seg = DEFAULT_SEGMENT_S if publish_segment is None else publish_segment
        if not MIN_SEGMENT_S <= seg <= MAX_SEGMENT_S:
            raise click.UsageError(f"--publish-segment must be {MIN_SEGMENT_S:g}s-{MAX_SEGMENT_S:g}s")
        # ROOT checked before anything is attached: one line, nothing traced
        publisher = Publisher.bind(publish_root, opts.db_path, node=node, job=job, segment_s=seg)
        opts.hooks.append(publisher)
    from ingero.analyze.summaries.hook import SummaryHook
    from ingero.daemon.hook import DaemonHook
    from ingero.sample.hook import SamplerHook

    # what rides on the trace, in this order: the query daemon first (metrics' diagnosis asks its
    # socket), the samplers, the per-second summaries explain reads (written every few flushes)
    opts.hooks[:0] = [DaemonHook(retain_s=retain, max_db_bytes=max_db, serve=not no_serve), SamplerHook(),
                      SummaryHook()]
    from ingero.collect.budget import BudgetHook, budget_in_force

    # daemon mode (no --duration, no command) has a budget unless told otherwise
    overhead_budget = budget_in_force(overhead_budget, daemon=duration is None and cmd is None)
    if overhead_budget:
        # a --cmd job starts after the tracer: its launches are sampled from its first second
        opts.hooks.append(BudgetHook(overhead_budget, start_sampled=cmd is not None))
    # --json: NDJSON on stdout, for a program; else ingero's lines on stderr, the job's output alone on stdout
    view = LiveView(as_json=as_json, stream=sys.stdout if as_json else sys.stderr)
    shown = (lambda notes: notes) if verbose or as_json else (lambda notes: [n for n in notes if not is_detail(n)])

    def on_tick(tick) -> None:
        tick.notes = shown(tick.notes)
        view.tick(tick)

    try:
        summary = session.run_trace(opts, on_tick=on_tick, on_start=view.start)
    finally:
        for hook in opts.hooks:
            hook.close()
    failed = _failed_calls_line(summary)
    if failed:
        summary.notes.append(failed)
    summary.notes = shown(summary.notes)
    view.finish(summary)
    if publisher is not None:
        click.echo(f"ingero: {publisher.summary()}", err=True)


def _command_line(argv: tuple[str, ...], cmd: str | None, ctx: click.Context) -> str | None:
    """The command to start: --cmd's line, or the words after -- joined so that splitting them
    again (the launcher does, like a shell but without one) gives back exactly these words."""
    if argv and cmd is not None:
        raise click.UsageError(f"the command is given twice (--cmd {shlex.quote(cmd)} and {shlex.join(argv)!r} "
                               "after --): give one")
    if argv:
        return shlex.join(argv)
    if ctx.meta.get("trace.dashdash") and cmd is None:
        raise click.UsageError("nothing after --: give the command to trace, e.g. ingero trace -- python3 train.py")
    return cmd


def _failed_calls_line(summary) -> str | None:
    """One line when CUDA calls of the session returned an error (read back from the store)."""
    import duckdb

    from ingero.analyze.return_codes import session_failures
    from ingero.errors import IngeroError
    from ingero.events import ops
    from ingero.render.counts import failed_calls_sentence
    from ingero.store.db import Store

    try:
        store = Store.open(summary.db_path, read_only=True)
    except IngeroError:
        return None  # (the trace's own lines say what happened to the store)
    try:
        failures = session_failures(store.con, summary.session_id)
    except duckdb.Error:
        return None
    finally:
        store.close()
    calls = sum(st.count for name, st in summary.ops.items() if name not in ops.HOST_OPS)
    return failed_calls_sentence(failures, calls) if failures else None
