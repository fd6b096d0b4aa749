"""The fleet dataset's tables: one Arrow schema each, one version for all of them.

FLEET_SCHEMA_VERSION is written into every segment's ``nodes`` row (column
``fleet_schema``) and into every file's Parquet key-value metadata
(``ingero.fleet_schema``).  Columns are only ever added; a rename or a removal
bumps the version, and docs/fleet.md has a changelog line for it (a test
checks that every column here is documented there).

Times are nanoseconds since the Unix epoch (each node's realtime clock: see
``nodes.clock_*`` for how far it can be trusted across nodes).
"""

from __future__ import annotations

import pyarrow as pa

from ingero.export.parquet import CHAIN_SCHEMA

FLEET_SCHEMA_VERSION = 1
VERSION_KEY = b"ingero.fleet_schema"

# The hive partition columns every table has (from the path, not stored in the files).
PARTITIONS = ("job", "node", "date", "hour")

EVENTS = pa.schema([
    ("session_id", pa.int32()), ("timestamp", pa.int64()), ("duration_ns", pa.int64()),
    ("pid", pa.int32()), ("tid", pa.int32()), ("op", pa.string()), ("kind", pa.string()),
    ("bytes", pa.int64()), ("stream", pa.uint64()), ("ret", pa.int32()), ("cpu", pa.int16()),
    ("preempted", pa.bool_()), ("other_pid", pa.int32()), ("runq_ns", pa.int64()),
    ("stack_id", pa.int64()), ("in_call", pa.string()), ("queued", pa.bool_()),
    ("comm", pa.uint64()), ("peer", pa.int32()),
])

# ingero.analyze.windows' ing_win: the loop thread's metrics per CUDA process and window.
WINDOW_METRICS = (
    "wall_ns", "ops_n", "launch_n", "launch_ns", "launch_mean_ns", "sync_n", "sync_ns", "sync_p99_ns",
    "copy_n", "copy_ns", "copy_bytes", "sync_copy_ns", "sync_copy_bytes", "small_d2h_n", "off_ns",
    "preempt_ns", "preempt_n", "wake_runq_ns", "cpu_wait_ns", "wait_preempt_ns", "late_hi_ns", "late_ns",
    "sleep_ns", "sleep_out_ns", "sleep_out_idle_ns", "sleep_out_queued_ns", "sleep_sync_ns", "io_ns",
    "io_out_ns", "copy_wait_ns", "faults_n", "faults_ns", "copy_faults_n", "copy_faults_ns",
)
WINDOWS = pa.schema([
    ("session_id", pa.int32()), ("pid", pa.int32()), ("process", pa.string()),
    ("start_ns", pa.int64()), ("window_ns", pa.int64()),
    *[(m, pa.float64()) for m in WINDOW_METRICS],
])

# The store's own per-second summaries (`windows`, store schema 11: docs/schema.md), copied as
# they are: one row per second, thread, op and kind.  Absent from a store before schema 11.
SUMMARIES = pa.schema([
    ("session_id", pa.int32()), ("start_ns", pa.int64()), ("pid", pa.int32()), ("tid", pa.int32()),
    ("op", pa.string()), ("kind", pa.string()), ("in_call", pa.string()), ("queued", pa.bool_()),
    ("other_pid", pa.int32()), ("events_n", pa.int64()), ("first_ns", pa.int64()), ("last_ns", pa.int64()),
    ("duration_ns", pa.int64()), ("overflow_ns", pa.int64()), ("runq_ns", pa.int64()), ("bytes", pa.int64()),
    ("small_copy_n", pa.int64()), ("max_duration_ns", pa.int64()),
    ("duration_hist_bucket", pa.list_(pa.int16())), ("duration_hist_n", pa.list_(pa.int32())),
    ("duration_hist_sum_ns", pa.list_(pa.int64())),
])

CHAINS = pa.schema([
    ("session_id", pa.int32()), ("segment_start_ns", pa.int64()), ("segment_end_ns", pa.int64()),
    *CHAIN_SCHEMA,
])

PROCESSES = pa.schema([
    ("pid", pa.int32()), ("name", pa.string()), ("comm", pa.string()), ("cmdline", pa.string()),
    ("ppid", pa.int32()), ("session_id", pa.int32()), ("first_seen_ns", pa.int64()), ("last_seen_ns", pa.int64()),
])

RANKS = pa.schema([
    ("session_id", pa.int32()), ("pid", pa.int32()), ("seen_ns", pa.int64()), ("source", pa.string()),
    ("comm", pa.uint64()), ("comm_id", pa.string()), ("rank", pa.int32()), ("nranks", pa.int32()),
    ("local_rank", pa.int32()), ("job", pa.string()),
])

NODES = pa.schema([
    ("fleet_schema", pa.int32()), ("session_id", pa.int32()),
    ("segment_start_ns", pa.int64()), ("segment_end_ns", pa.int64()), ("segment_ns", pa.int64()),
    ("written_ns", pa.int64()), ("hostname", pa.string()), ("kernel", pa.string()), ("ncpu", pa.int32()),
    ("gpus", pa.int32()), ("gpu_names", pa.list_(pa.string())), ("nvml", pa.string()),
    ("clock_offset_ns", pa.int64()), ("clock_sync", pa.string()), ("clock_synced", pa.bool_()),
    ("clock_max_error_us", pa.int64()), ("clock_est_error_us", pa.int64()),
    ("events", pa.int64()), ("drops_kernel", pa.int64()), ("drops_user", pa.int64()),
    ("steps", pa.int64()), ("step_median_ms", pa.float64()), ("step_p99_ms", pa.float64()),
    ("device_busy", pa.float64()), ("loop_pids", pa.list_(pa.int32())),
    # the segment's windows summed (the loop threads of its CUDA processes): fleet explain reads
    # these instead of every windows file
    ("loop_wall_ns", pa.float64()), ("loop_cpu_wait_ns", pa.float64()), ("loop_ops", pa.float64()),
    ("loop_launches", pa.float64()), ("loop_windows", pa.int64()),
    # start of the main loop's first and last active window (a launch or a sync) in the segment:
    # a run's first and last windows are partial (start-up, teardown) and fleet explain does not
    # judge them (NULL in segments written before these columns: nothing is trimmed)
    ("loop_first_ns", pa.int64()), ("loop_last_ns", pa.int64()),
    ("host_cpu_pct", pa.float64()), ("load1", pa.float64()),
    ("others_cpu_s", pa.float64()), ("others_top", pa.string()),
    ("ingero_version", pa.string()),
])

TABLES: dict[str, pa.Schema] = {
    "events": EVENTS, "windows": WINDOWS, "summaries": SUMMARIES, "chains": CHAINS, "processes": PROCESSES,
    "ranks": RANKS,
    "nodes": NODES,
}
# Written in this order: `nodes` last, so a segment whose nodes row exists is complete.
WRITE_ORDER = ("events", "windows", "summaries", "chains", "processes", "ranks", "nodes")


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns, in order and types (missing ones NULL).

    A dictionary column of the right value type (the store's ENUMs: op, kind, in_call) stays
    dictionary-encoded: Parquet stores it as the same STRING column, already encoded, instead of
    decoding every row to a string here and encoding it again in the writer."""
    cols, fields = [], []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            if pa.types.is_dictionary(col.type) and col.type.value_type == f.type:
                cols.append(col)
                fields.append(pa.field(f.name, col.type, f.nullable, f.metadata))
                continue
            cols.append(col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
        fields.append(f)
    return pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=schema.metadata))
