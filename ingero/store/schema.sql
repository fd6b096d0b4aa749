-- ingero store schema.  The only DDL in the project.
--
-- These tables are a public API: users write SQL against them, so columns
-- are only ever added, never renamed.  A change bumps SCHEMA_VERSION in
-- store/db.py, adds a migration there, and updates docs/schema.md (which a
-- test checks against this file).
--
-- Units are in the names: *_ns nanoseconds, *_bytes bytes, *_pct percent.
-- Timestamps are nanoseconds since the Unix epoch.

-- Store bookkeeping: the schema version and the like.
CREATE TABLE IF NOT EXISTS meta (
    key VARCHAR PRIMARY KEY,   -- 'schema_version', ...
    value VARCHAR
);

-- One row per `ingero trace` run (or demo): when, what, how many events, drops.
CREATE TABLE IF NOT EXISTS sessions (
    session_id INTEGER PRIMARY KEY,
    started_ns BIGINT NOT NULL,      -- wall clock at start
    ended_ns BIGINT,                 -- NULL while running or after a crash
    status VARCHAR NOT NULL,         -- 'running' | 'closed' | 'crashed'
    hostname VARCHAR,
    kernel VARCHAR,                  -- uname -r
    ingero_version VARCHAR,
    command VARCHAR,                 -- the ingero command line
    targets VARCHAR,                 -- what was traced, human readable
    tracer_pid INTEGER,              -- pid of the ingero process that wrote it
    heartbeat_ns BIGINT,             -- last flush; tells how much a crash lost
    events BIGINT DEFAULT 0,         -- rows stored in events
    drops_kernel BIGINT DEFAULT 0,   -- ring-buffer reserve failures in BPF
    drops_user BIGINT DEFAULT 0,     -- records lost in user space
    ncpu INTEGER,                    -- CPUs on the host
    stale_calls BIGINT DEFAULT 0,    -- CUDA calls whose return was never seen (longjmp, exception), counted when the thread's next call replaced them; no row was stored for them; NULL: before schema 2
    sched_autogroup BOOLEAN,         -- the kernel's sched_autogroup_enabled at start: when true, nice orders processes only within one session (setsid), so a fix for CPU contention must lower the competitor's autogroup; NULL: before schema 4
    probe_misses BIGINT DEFAULT 0,   -- runs of ingero's BPF programs the kernel skipped because another BPF program or a bpf() map syscall held the CPU (recursion_misses of each program); each may have lost a row (an off-CPU interval, a call); NULL: before schema 6
    imported_from VARCHAR,           -- `ingero import`: the trace file the session came from (or was joined with); NULL for a traced session
    rank INTEGER,                    -- imported: distributedInfo.rank of the traced process
    world_size INTEGER,              -- imported: distributedInfo.world_size
    device_properties VARCHAR,       -- imported: the trace's deviceProperties (JSON text: name, memory, SMs per GPU)
    import_unused VARCHAR,           -- imported: JSON object, what the trace held that was not stored (kind -> count), e.g. CUDA calls without an op name
    clock_offset_ns BIGINT,          -- imported: ns added to the trace's timestamps (a join aligns them to the traced session's clock)
    notes VARCHAR,                   -- what the trace could not see and why, one line each (a program with a stripped CUDA runtime linked in: which file, which process, the fix); NULL when nothing; NULL: before schema 8
    summaries_pending_ns BIGINT,     -- the first second (epoch ns) whose windows rows the tracer still held in memory at its last flush (it writes them every few flushes); windows rows from it on are incomplete, and readers summarise those seconds from events (analyze/summaries/__init__.py); NULL: every stored event is in windows (schema 13)
    call_cost_ns DOUBLE,             -- what tracing one CUDA call costs its thread here, in CPU ns: the entry and return uprobes, calibrated at the trace's start on a probed libc call (the launch-bound rule takes it out of a launch's time); NULL: not calibrated (an imported trace, a kernel without uprobe_multi links, before schema 14)
    switch_holder BOOLEAN            -- true: a blocked sched_switch row's other_pid is the process the thread waited behind for a CPU once woken (the task leaving the CPU as it came back; 0 when it waited for none); NULL: before schema 17, when it was the process that ran next at the switch-out
);

-- The op names (ingero/events/ops.py), stored as one byte each (schema 11; a test keeps the
-- list equal to ops.py's but its NVTX records', which become spans rows, never events
-- rows; and EVENT_KIND's to events/records.py's).  Sorted, so ORDER BY op orders as text does; compared,
-- matched (LIKE), grouped and selected as text: op = 'sched_switch' and a name that
-- is no op (op = 'foo' is false) behave as with VARCHAR.  A file recorded before
-- schema 11 keeps VARCHAR op, kind and in_call (the migration does not rewrite events).
CREATE TYPE IF NOT EXISTS OP_NAME AS ENUM (
    'bench', 'block_io', 'cpu_sample', 'cuCtxSynchronize', 'cuGraphLaunch', 'cuLaunchKernel', 'cuMemAlloc',
    'cuMemFree', 'cuMemcpy', 'cuMemcpyAsync', 'cuStreamSynchronize', 'cudaDeviceSync',
    'cudaEventSync', 'cudaFree', 'cudaGraphLaunch', 'cudaHostRegister', 'cudaLaunchKernel',
    'cudaMalloc', 'cudaMallocHost', 'cudaMemcpy', 'cudaMemcpyAsync', 'cudaStreamSync',
    'ncclAllGather', 'ncclAllReduce', 'ncclBroadcast', 'ncclCommAbort', 'ncclCommDestroy',
    'ncclCommInitAll', 'ncclCommInitRank', 'ncclCommInitRankConfig', 'ncclCommSplit',
    'ncclGroupEnd', 'ncclGroupStart', 'ncclRecv', 'ncclReduce', 'ncclReduceScatter', 'ncclSend',
    'nccl_ext', 'none', 'page_fault', 'proc_exec', 'proc_exit', 'sched_switch'
);

-- events.kind's vocabulary (events/records.py: copy directions, off-CPU and block I/O
-- kinds, NCCL reduction ops and data types), one byte each, sorted, read as text.
CREATE TYPE IF NOT EXISTS EVENT_KIND AS ENUM (
    'D2D', 'D2H', 'H2D', 'H2H', 'avg:bfloat16', 'avg:float16', 'avg:float32', 'avg:float64',
    'avg:float8e4m3', 'avg:float8e5m2', 'avg:int32', 'avg:int64', 'avg:int8', 'avg:uint32',
    'avg:uint64', 'avg:uint8', 'avg:unknown', 'bfloat16', 'custom:bfloat16', 'custom:float16',
    'custom:float32', 'custom:float64', 'custom:float8e4m3', 'custom:float8e5m2', 'custom:int32',
    'custom:int64', 'custom:int8', 'custom:uint32', 'custom:uint64', 'custom:uint8',
    'custom:unknown', 'default', 'discard', 'float16', 'float32', 'float64', 'float8e4m3',
    'float8e5m2', 'flush', 'int32', 'int64', 'int8', 'io', 'max:bfloat16', 'max:float16',
    'max:float32', 'max:float64', 'max:float8e4m3', 'max:float8e5m2', 'max:int32', 'max:int64',
    'max:int8', 'max:uint32', 'max:uint64', 'max:uint8', 'max:unknown', 'min:bfloat16',
    'min:float16', 'min:float32', 'min:float64', 'min:float8e4m3', 'min:float8e5m2', 'min:int32',
    'min:int64', 'min:int8', 'min:uint32', 'min:uint64', 'min:uint8', 'min:unknown', 'other',
    'preempted', 'prod:bfloat16', 'prod:float16', 'prod:float32', 'prod:float64', 'prod:float8e4m3',
    'prod:float8e5m2', 'prod:int32', 'prod:int64', 'prod:int8', 'prod:uint32', 'prod:uint64',
    'prod:uint8', 'prod:unknown', 'read', 'sleep', 'sum:bfloat16', 'sum:float16', 'sum:float32',
    'sum:float64', 'sum:float8e4m3', 'sum:float8e5m2', 'sum:int32', 'sum:int64', 'sum:int8',
    'sum:uint32', 'sum:uint64', 'sum:uint8', 'sum:unknown', 'uint32', 'uint64', 'uint8', 'unknown',
    'unknown:bfloat16', 'unknown:float16', 'unknown:float32', 'unknown:float64',
    'unknown:float8e4m3', 'unknown:float8e5m2', 'unknown:int32', 'unknown:int64', 'unknown:int8',
    'unknown:uint32', 'unknown:uint64', 'unknown:uint8', 'unknown:unknown', 'write'
);

-- One row per event: a CUDA call, an off-CPU interval of a traced thread,
-- a page fault, a block I/O request.  The table users query most.
CREATE TABLE IF NOT EXISTS events (
    session_id INTEGER,          -- sessions.session_id of the trace that recorded it
    timestamp BIGINT NOT NULL,   -- start of the call / of the off-CPU interval / request issue
    duration_ns BIGINT,          -- call time; off-CPU time (sched_switch); request latency (block_io)
    pid INTEGER NOT NULL,        -- process id (tgid)
    tid INTEGER,                 -- thread id
    op OP_NAME NOT NULL,         -- cudaLaunchKernel, cudaMemcpy, ..., sched_switch, page_fault, block_io
    kind EVENT_KIND,             -- copy direction H2D/D2H/D2D/H2H/default; sched_switch: preempted/sleep/io/other; block_io: read/write/flush/discard
    bytes BIGINT,                -- bytes copied / allocated / transferred
    stream UBIGINT,              -- cudaStream_t / CUstream (0 is the legacy default stream): cudaMemcpyAsync, cudaStreamSync, cudaGraphLaunch, cuMemcpyAsync, cuStreamSynchronize; kernel launches (cudaLaunchKernel, cuLaunchKernel) only when traced with `ingero trace --streams`, else NULL; NULL for other ops
    ret INTEGER,                 -- return code (cudaError_t / CUresult); block I/O error
    cpu SMALLINT,                -- CPU the event was recorded on
    preempted BOOLEAN,           -- sched_switch: switched out while still runnable (involuntary)
    other_pid INTEGER,           -- sched_switch: preempted, the process that ran instead; blocked, the one it waited behind for a CPU once woken (sessions.switch_holder); block_io: device number
    runq_ns BIGINT,              -- sched_switch: time runnable but waiting for a CPU (wakeup or preemption -> running)
    stack_id BIGINT,             -- stacks.stack_id with --stack, else NULL
    in_call OP_NAME,             -- sched_switch, page_fault: the CUDA call (an op name) the thread was inside when it left the CPU / faulted; NULL outside every call and for other ops
    queued BOOLEAN,              -- sched_switch, page_fault: TRUE when the thread issued a kernel launch or async copy (returning 0) since its last sync or synchronous copy returned, i.e. device work it queued may still run; FALSE otherwise; NULL for threads without a traced CUDA call yet and for other ops
    comm UBIGINT,                -- NCCL calls: the ncclComm_t (ncclCommInit*: the communicator created); NULL for other ops; NULL: before schema 10
    peer INTEGER,                -- ncclSend / ncclRecv: the peer rank; ncclBroadcast / ncclReduce: the root rank; NULL otherwise
    syscall VARCHAR,             -- sched_switch: the system call the thread blocked in ('futex', 'read', 'recvfrom', 'fsync', 'clock_nanosleep', 'epoll_wait', ...; 'syscall_N' for others); NULL when preempted or blocked outside one (a fault); NULL: before schema 15
    wait_fd INTEGER,             -- sched_switch: the file descriptor that call waited on (calls whose first argument is one: read, recvfrom, fsync, epoll_wait, ...); NULL otherwise
    fd_target VARCHAR,           -- sched_switch: what wait_fd was, read from /proc/PID/fd at flush time: 'socket:[inode]', 'pipe:[inode]', a file's path, 'anon_inode:[eventfd]'; NULL when it could not be read (closed, process gone)
    waker_pid INTEGER,           -- sched_switch: the process (tgid) whose thread woke it, from a system call that wakes others (a futex wake, a write or send to a pipe or socket, a signal, an exit); 0: an interrupt (a timer, a disk or network completion) or a kernel thread; NULL when preempted (never blocked) or no wake-up was seen
    waker_tid INTEGER            -- sched_switch: the waking thread (0: an interrupt)
);

-- A readable name per process: JOIN process_names USING (pid).
CREATE TABLE IF NOT EXISTS process_names (
    pid INTEGER PRIMARY KEY,
    name VARCHAR,                -- readable: 'python3 (train.py)'
    comm VARCHAR,                -- kernel task name (15 chars)
    cmdline VARCHAR,
    ppid INTEGER,                -- parent pid (DataLoader workers point at the training process)
    session_id INTEGER,          -- last session that saw it
    first_seen_ns BIGINT,
    last_seen_ns BIGINT
);

-- Host-wide scheduler totals per process and sampling interval, for every
-- process on the host (not only the traced ones): names the competitors.
CREATE TABLE IF NOT EXISTS process_cpu (
    session_id INTEGER,
    timestamp BIGINT NOT NULL,   -- end of the interval
    interval_ns BIGINT,
    pid INTEGER NOT NULL,
    comm VARCHAR,
    oncpu_ns BIGINT,             -- CPU time used in the interval
    involuntary BIGINT,          -- times preempted while runnable
    voluntary BIGINT,            -- times it went to sleep
    preempted_traced BIGINT      -- times it took the CPU from a traced thread
);

-- Resident memory of the largest processes on the host (and every traced
-- one), sampled once a second: names the process behind memory pressure.
CREATE TABLE IF NOT EXISTS process_memory (
    session_id INTEGER,
    timestamp BIGINT NOT NULL,
    pid INTEGER NOT NULL,
    comm VARCHAR,
    rss_bytes BIGINT,            -- resident set size
    swap_bytes BIGINT            -- swapped out (VmSwap)
);

-- Call stacks captured with --stack, stored once each (deduplicated),
-- one row per frame: JOIN stacks USING (stack_id).
CREATE TABLE IF NOT EXISTS stacks (
    stack_id BIGINT NOT NULL,    -- content hash of the frames
    depth INTEGER NOT NULL,      -- 0 = innermost frame
    frame_kind VARCHAR,          -- 'python' | 'native' | 'kernel'
    function VARCHAR,            -- '[unknown]': native frame without a symbol; '[unreadable]': Python frame whose code object was gone when read (file and line NULL)
    module VARCHAR,              -- shared object or Python module path
    file VARCHAR,                -- source file (Python frames)
    line INTEGER,                -- line being executed (Python frames)
    source VARCHAR               -- text of that line, when readable
);
-- (stack_id, depth) is unique because the tracer writes each stack once; it is
-- not a PRIMARY KEY since schema 3: retention deletes stacks no event uses any
-- more, and DuckDB deleted 400 k frames from the indexed file-backed table in
-- 21-35 s, from the plain one in 0.08 s.

-- Host metrics sampled once a second (psutil, /proc/vmstat).
CREATE TABLE IF NOT EXISTS system_metrics (
    session_id INTEGER,
    timestamp BIGINT NOT NULL,
    cpu_pct DOUBLE,              -- all CPUs, 0-100
    cpu_per_core_pct DOUBLE[],
    iowait_pct DOUBLE,
    mem_pct DOUBLE,
    mem_used_bytes BIGINT,
    mem_total_bytes BIGINT,
    swap_used_bytes BIGINT,
    swap_in_bytes BIGINT,        -- in the interval
    swap_out_bytes BIGINT,       -- in the interval
    major_faults BIGINT,         -- host-wide, in the interval (/proc/vmstat pgmajfault)
    ctx_switches BIGINT,         -- host-wide, in the interval
    load1 DOUBLE,
    ncpu INTEGER
);

-- GPU metrics sampled once a second through NVML (empty without a driver).
CREATE TABLE IF NOT EXISTS gpu_metrics (
    session_id INTEGER,
    timestamp BIGINT NOT NULL,
    gpu INTEGER,                 -- NVML index
    name VARCHAR,
    util_pct DOUBLE,
    mem_util_pct DOUBLE,
    mem_used_bytes BIGINT,
    mem_total_bytes BIGINT,
    power_w DOUBLE,
    sm_clock_mhz INTEGER,
    mem_clock_mhz INTEGER,
    temperature_c INTEGER
);

-- What the tracer attached, per session: 'what was traced' stays answerable.
CREATE TABLE IF NOT EXISTS probes (
    session_id INTEGER,
    target VARCHAR,              -- library path, or 'kernel'
    symbol VARCHAR,              -- function or tracepoint
    op VARCHAR,
    probe_kind VARCHAR,          -- 'uprobe' | 'uretprobe' | 'tracepoint'
    attached BOOLEAN,
    error VARCHAR
);

-- ---- Imported traces (schema 7): `ingero import` of PyTorch-profiler (Kineto) traces.
-- An imported session's sessions row has imported_from set; its CUDA calls go
-- into events (same op names as the tracer), the device's own timeline into
-- device_activity, CPU operators and annotations into spans.

-- What the device ran, as CUPTI measured it: one row per kernel, copy or memset, from an
-- imported profiler trace or, live, from ingero's CUPTI injection library in a traced `--cmd`
-- (collect/cupti_inject.c).  A live trace also stores CUPTI's records of host waits
-- (kind 'sync': cudaStreamSynchronize and the like, the stream waited on): they are not
-- device time, so sums of what the device ran leave them out (kind <> 'sync').
CREATE TABLE IF NOT EXISTS device_activity (
    session_id INTEGER,
    device INTEGER,              -- GPU index in the traced process
    stream BIGINT,               -- the profiler's stream id (a small number, not a cudaStream_t)
    kind VARCHAR NOT NULL,       -- 'kernel' | 'memcpy' | 'memset'; live traces also 'sync' (a host wait, not device time)
    copy_kind VARCHAR,           -- memcpy: H2D / D2H / D2D / H2H (PtoP is D2D); NULL otherwise
    bytes BIGINT,                -- memcpy, memset: bytes moved / set
    start_ns BIGINT NOT NULL,    -- on the host's clock (ns since the Unix epoch), like events.timestamp
    end_ns BIGINT NOT NULL,
    name VARCHAR,                -- kernel name, or 'Memcpy HtoD (Pageable -> Device)' etc. (pageable/pinned shows here)
    correlation BIGINT,          -- the profiler's id linking it to the call that submitted it (per process)
    call_tid INTEGER,            -- thread of that call (NULL when the trace lacks it)
    call_ns BIGINT,              -- start of that call: JOIN events ON tid = call_tid AND timestamp = call_ns
    pid INTEGER                  -- the process whose call submitted it (NULL: imported before schema 15)
);

-- CPU operators and user annotations of an imported trace (torch.profiler's
-- record_function): ProfilerStep#N marks training steps, enumerate(DataLoader)... data loading.
-- And the NVTX ranges of a traced `--cmd` (category 'nvtx'; torch.cuda.nvtx.range_push,
-- nvtx.annotate, nvtxRangePushA ...): one row per push..pop on a thread, or per
-- start..end by range id (tid: the starting thread), name = the range's message cut at
-- 64 bytes ('' without one).  A range never closed ends at its process's exit, or,
-- for a process still running when the trace stopped, at the trace's end.
CREATE TABLE IF NOT EXISTS spans (
    session_id INTEGER,
    pid INTEGER,
    tid INTEGER,
    start_ns BIGINT NOT NULL,    -- on the host's clock (ns since the Unix epoch), like events.timestamp
    end_ns BIGINT NOT NULL,
    name VARCHAR NOT NULL,       -- aten::conv2d, ProfilerStep#12, enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__, an NVTX message ...
    category VARCHAR             -- the trace's cat: 'cpu_op' | 'user_annotation' | 'python_function'; traced: 'nvtx'
);

-- What each process was called over time: a row per image it ran, from the
-- moment it was first seen or exec'd (a pyenv shim's bash, then python3).
-- process_names holds the latest row; analyze names a pid as of the time it
-- made its CUDA calls:
--   SELECT arg_max(name, from_ns) FROM process_history WHERE pid = $p AND from_ns <= $t
CREATE TABLE IF NOT EXISTS process_history (
    session_id INTEGER,
    pid INTEGER NOT NULL,
    from_ns BIGINT NOT NULL,     -- exec time; first-seen time for the image it had when tracing began
    name VARCHAR,                -- readable, as process_names.name
    comm VARCHAR,
    cmdline VARCHAR,             -- NULL when it exited before /proc could be read (name = its comm)
    ppid INTEGER
);

-- The name of each thread of a traced process that a switch row holds (schema 15): what
-- explain calls the thread that held a lock or the GIL, the worker thread that fed the loop.
-- Read from /proc/PID/task/TID/comm when the tracer first stores a row of the thread.
CREATE TABLE IF NOT EXISTS thread_names (
    session_id INTEGER,
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    name VARCHAR                 -- the thread's comm (15 chars: prctl(PR_SET_NAME), threading's native name)
);

-- Which rank of which job each traced process is (schema 10).  One row per
-- (process, communicator) from its ncclCommInit* / ncclCommSplit call, plus one
-- row with comm NULL from the torchrun / Slurm environment when it has one.
-- Ranks of one job share comm_id (the same ncclUniqueId) or job.  A process
-- whose communicator was created before the trace began has only its
-- environment row, or none: its rank is then unknown, never guessed.
CREATE TABLE IF NOT EXISTS ranks (
    session_id INTEGER,
    pid INTEGER NOT NULL,
    seen_ns BIGINT NOT NULL,     -- when it was learned (the init call's return, or the first read of /proc/PID/environ)
    source VARCHAR NOT NULL,     -- 'nccl' (a communicator init call) | 'env' (the process environment)
    comm UBIGINT,                -- ncclComm_t; NULL for 'env' rows
    comm_id VARCHAR,             -- hex of the ncclUniqueId passed to ncclCommInitRank*: the same in every rank of one communicator
    rank INTEGER,                -- rank in that communicator ('nccl'), or RANK ('env')
    nranks INTEGER,              -- ranks in that communicator ('nccl'), or WORLD_SIZE ('env')
    local_rank INTEGER,          -- LOCAL_RANK ('env')
    job VARCHAR                  -- TORCHELASTIC_RUN_ID, else SLURM_JOB_ID, else MASTER_ADDR:MASTER_PORT ('env'); NULL for 'nccl' rows
);

-- ---- Per-second summaries (schema 11): what explain reads instead of raw events.
-- One row per (session, second, process, thread, op and its keys) made by
-- the tracer at each flush for the rows that flush stored; a second that
-- spans two flushes (or receives a late row: an off-CPU interval is stored
-- when it ends, a call when it returns) has several rows with the same keys,
-- and every column adds up: read them with sum() (the histogram by bucket).
-- A session without rows here (imported, recorded before schema 11) is
-- summarised on the fly by explain, with the same SQL (analyze/summaries/__init__.py).
-- The tracer writes the rows of a few flushes at once (schema 13): the seconds from
-- sessions.summaries_pending_ns on may be incomplete here (a tracer still running,
-- or killed), and readers summarise them from events instead.
-- Durations are binned on a fixed log scale, 16 buckets per power of two:
-- bucket b holds durations d with floor(16 * log2(d)) = b (bucket -1: d <= 0),
-- with their count and sum; a quantile over merged rows, read as the mean of the
-- bucket that holds it, is within 4.4% of the exact one (exact when the bucket's
-- durations are all equal).
CREATE TABLE IF NOT EXISTS windows (
    session_id INTEGER,
    start_ns BIGINT NOT NULL,    -- start of the 1 s window: a whole epoch second, in ns
    pid INTEGER,                 -- process id (tgid); block_io: the issuer
    tid INTEGER,                 -- thread id; NULL for block_io
    op VARCHAR NOT NULL,         -- events.op: a CUDA call, sched_switch, page_fault, block_io
    kind VARCHAR,                -- events.kind (copy direction; sched_switch: preempted/sleep/io/other; block_io: read/write/...)
    in_call VARCHAR,             -- sched_switch, page_fault: events.in_call (the CUDA call the thread was inside)
    queued BOOLEAN,              -- sched_switch: events.queued
    other_pid INTEGER,           -- sched_switch: events.other_pid (who ran instead)
    events_n BIGINT,             -- rows of events summarised (calls, off-CPU intervals, faults, requests)
    first_ns BIGINT,             -- earliest events.timestamp summarised in the row
    last_ns BIGINT,              -- latest events.timestamp summarised in the row
    duration_ns BIGINT,          -- sum of events.duration_ns (whole intervals, counted in the second they start in)
    overflow_ns BIGINT,          -- sched_switch: the part of those off-CPU intervals past the end of this second (at most one interval per thread crosses it)
    runq_ns BIGINT,              -- sched_switch: sum of events.runq_ns
    bytes BIGINT,                -- sum of events.bytes
    small_copy_n BIGINT,         -- CUDA calls moving at most 1 KiB (scalar read-backs)
    max_duration_ns BIGINT,      -- longest events.duration_ns
    duration_hist_bucket SMALLINT[],  -- CUDA calls other than launches, block_io: log-scale buckets present (see above), ascending
    duration_hist_n INTEGER[],        -- events in each of those buckets
    duration_hist_sum_ns BIGINT[]     -- sum of their durations, per bucket
);

-- Preempted waits that delayed a device wait's return (schema 11): one row per
-- off-CPU interval, switched out while runnable inside a sync, that ended at most
-- 50 us before the sync returned (explain's cpu-contention lateness estimate).
CREATE TABLE IF NOT EXISTS window_late_waits (
    session_id INTEGER,
    start_ns BIGINT NOT NULL,    -- the 1 s window the interval starts in (a whole epoch second, in ns)
    pid INTEGER,
    tid INTEGER,
    preempted_ns BIGINT,         -- the interval's length (events.duration_ns)
    since_call_ns BIGINT         -- from the start of the sync call to the end of the interval
);

-- Periods in which the per-call probes of some CUDA ops were attached for
-- only a slice (schema 12): `ingero trace --overhead-budget`.  Calls of those
-- ops have rows only between from_ns and detached_by_ns of each period, whole
-- in [attached_from_ns, attached_to_ns); every other op, and every
-- tracepoint, is traced throughout.  A period without a row here was traced
-- whole.  Explain estimates a thread's calls of those ops in the detached
-- parts from its other CUDA calls there, at the ratio it made the two in the
-- slices (ingero/analyze/launch_sampling.py); their durations and percentiles come
-- from the slices.
CREATE TABLE IF NOT EXISTS sampling (
    session_id INTEGER,
    from_ns BIGINT NOT NULL,          -- the period (wall clock); the probes' links were being made
    to_ns BIGINT NOT NULL,
    attached_from_ns BIGINT NOT NULL, -- the slice in which the probes were attached: links made
    attached_to_ns BIGINT NOT NULL,   -- when the entry probes were being removed
    detached_by_ns BIGINT NOT NULL,   -- when that was done: no row of the ops starts after it
    ratio DOUBLE NOT NULL,            -- (attached_to_ns - attached_from_ns) / (to_ns - from_ns)
    ops VARCHAR NOT NULL,             -- comma list of the sampled op names
    call_cost_ns DOUBLE               -- what one traced call cost its thread (the tracer's calibration)
);

-- ---- CPU limits (schema 15): what a cgroup's CPU quota let the job run.

-- Each traced process's cgroup CPU quota and throttling counters, read once a
-- second (ingero/sample/cgroup.py): its own cgroup, and every ancestor with a
-- quota of its own (a pod's limit above its container's throttles it too, and
-- the kernel counts that in the ancestor's cpu.stat).  v2: cpu.max, cpu.stat;
-- v1: the cpu controller's cpu.cfs_quota_us, cpu.cfs_period_us, cpu.stat.
-- Rows of the same cgroup and second carry the same counters (one per process
-- in it): sum the amounts of one process's rows, not of several.
CREATE TABLE IF NOT EXISTS cgroup_cpu (
    session_id INTEGER,
    timestamp BIGINT NOT NULL,       -- when read
    interval_ns BIGINT,              -- since the previous reading of the same cgroup; NULL on its first (the amounts below are then NULL)
    pid INTEGER NOT NULL,            -- a traced process in the cgroup or below it
    cgroup VARCHAR NOT NULL,         -- the cgroup's path in its hierarchy, as /proc/PID/cgroup names it: '/kubepods/burstable/pod<uid>/<id>', '/system.slice/docker-<id>.scope'
    own BOOLEAN,                     -- TRUE: the process's own cgroup; FALSE: an ancestor whose quota limits it too
    cgroup_version SMALLINT,         -- 1 (the v1 cpu controller) or 2
    mount VARCHAR,                   -- where that hierarchy was mounted: the cgroup's files are in mount || cgroup
    container_id VARCHAR,            -- the 64-hex container id the path names (docker, containerd, CRI-O, podman); NULL when none
    pod_uid VARCHAR,                 -- the Kubernetes pod uid the path names (kubepods ... pod<uid>); NULL when none
    quota_us BIGINT,                 -- CPU time the cgroup may use per period (v2 cpu.max, v1 cpu.cfs_quota_us); NULL: no limit ('max', -1)
    period_us BIGINT,                -- the period (v2 cpu.max, v1 cpu.cfs_period_us); quota_us / period_us is the limit in CPUs
    nr_periods BIGINT,               -- cpu.stat as read: periods in which the cgroup had runnable tasks, since it was made
    nr_throttled BIGINT,             -- cpu.stat as read: periods at whose end it was throttled (its quota spent)
    throttled_total_ns BIGINT,       -- cpu.stat as read: time its run queues were throttled, summed over CPUs (v2 throttled_usec, v1 throttled_time)
    usage_total_ns BIGINT,           -- CPU time its tasks used (v2 cpu.stat usage_usec; v1 cpuacct.usage where cpuacct shares the hierarchy, else NULL)
    periods_n BIGINT,                -- in the interval: nr_periods' increase
    throttled_n BIGINT,              -- in the interval: nr_throttled's increase
    throttled_ns BIGINT,             -- in the interval: throttled_total_ns' increase
    usage_ns BIGINT                  -- in the interval: usage_total_ns' increase
);

-- ---- Counted switches (schema 16): the overhead budget's summary rows.

-- Off-CPU intervals of traced threads that had made no traced CUDA call,
-- counted in BPF instead of stored one by one while `ingero trace
-- --overhead-budget` found the trace over budget (ingero/collect/budget.py):
-- one row per thread, interval of the tracer's once-a-second harvest and
-- kind (why it left), with what a sched_switch row would have carried of them
-- summed.  Counted intervals have no events row; their successor, system
-- call, waker and stack are not recorded.  Explain adds them to its
-- off-CPU totals (ingero/analyze/launch_sampling.py).
CREATE TABLE IF NOT EXISTS switch_counts (
    session_id INTEGER,
    timestamp BIGINT NOT NULL, -- end of the harvest interval (wall clock): intervals that ended in it
    interval_ns BIGINT NOT NULL,
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    kind VARCHAR NOT NULL,     -- as events.kind of sched_switch: 'preempted', 'sleep', 'io', 'other'
    switches BIGINT NOT NULL,  -- off-CPU intervals (each a sched_switch row, had it been stored)
    off_cpu_ns BIGINT NOT NULL,  -- their summed duration_ns
    runq_ns BIGINT NOT NULL      -- their summed runq_ns
);
