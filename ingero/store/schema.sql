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
    notes VARCHAR                    -- what the trace could not see and why, one line each (a program with a stripped CUDA runtime linked in: which file, which process, the fix); NULL when nothing; NULL: before schema 8
);

-- One row per event: a CUDA call, an off-CPU interval of a traced thread,
-- a page fault, a block I/O request.  The table users query most.
CREATE TABLE IF NOT EXISTS events (
    session_id INTEGER,          -- sessions.session_id of the trace that recorded it
    timestamp BIGINT NOT NULL,   -- start of the call / of the off-CPU interval / request issue
    duration_ns BIGINT,          -- call time; off-CPU time (sched_switch); request latency (block_io)
    pid INTEGER NOT NULL,        -- process id (tgid)
    tid INTEGER,                 -- thread id
    op VARCHAR NOT NULL,         -- cudaLaunchKernel, cudaMemcpy, ..., sched_switch, page_fault, block_io
    kind VARCHAR,                -- copy direction H2D/D2H/D2D/H2H/default; sched_switch: preempted/sleep/io/other; block_io: read/write/flush/discard
    bytes BIGINT,                -- bytes copied / allocated / transferred
    stream UBIGINT,              -- cudaStream_t / CUstream (0 is the legacy default stream): cudaMemcpyAsync, cudaStreamSync, cudaGraphLaunch, cuMemcpyAsync, cuStreamSynchronize; kernel launches (cudaLaunchKernel, cuLaunchKernel) only when traced with `ingero trace --streams`, else NULL; NULL for other ops
    ret INTEGER,                 -- return code (cudaError_t / CUresult); block I/O error
    cpu SMALLINT,                -- CPU the event was recorded on
    preempted BOOLEAN,           -- sched_switch: switched out while still runnable (involuntary)
    other_pid INTEGER,           -- sched_switch: the process that ran instead; block_io: device number
    runq_ns BIGINT,              -- sched_switch: time runnable but waiting for a CPU (wakeup or preemption -> running)
    stack_id BIGINT,             -- stacks.stack_id with --stack, else NULL
    in_call VARCHAR,             -- sched_switch, page_fault: the CUDA call (an op name) the thread was inside when it left the CPU / faulted; NULL outside every call and for other ops
    queued BOOLEAN,              -- sched_switch, page_fault: TRUE when the thread issued a kernel launch or async copy (returning 0) since its last sync or synchronous copy returned, i.e. device work it queued may still run; FALSE otherwise; NULL for threads without a traced CUDA call yet and for other ops
    comm UBIGINT,                -- NCCL calls: the ncclComm_t (ncclCommInit*: the communicator created); NULL for other ops; NULL: before schema 10
    peer INTEGER                 -- ncclSend / ncclRecv: the peer rank; ncclBroadcast / ncclReduce: the root rank; NULL otherwise
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
    function VARCHAR,
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

-- What the device ran, as the trace measured it (CUPTI): one row per kernel, copy or memset.
CREATE TABLE IF NOT EXISTS device_activity (
    session_id INTEGER,
    device INTEGER,              -- GPU index in the traced process
    stream BIGINT,               -- the profiler's stream id (a small number, not a cudaStream_t)
    kind VARCHAR NOT NULL,       -- 'kernel' | 'memcpy' | 'memset'
    copy_kind VARCHAR,           -- memcpy: H2D / D2H / D2D / H2H (PtoP is D2D); NULL otherwise
    bytes BIGINT,                -- memcpy, memset: bytes moved / set
    start_ns BIGINT NOT NULL,    -- on the host's clock (ns since the Unix epoch), like events.timestamp
    end_ns BIGINT NOT NULL,
    name VARCHAR,                -- kernel name, or 'Memcpy HtoD (Pageable -> Device)' etc. (pageable/pinned shows here)
    correlation BIGINT,          -- the profiler's id linking it to the call that submitted it
    call_tid INTEGER,            -- thread of that call (NULL when the trace lacks it)
    call_ns BIGINT               -- start of that call: JOIN events ON tid = call_tid AND timestamp = call_ns
);

-- CPU operators and user annotations of an imported trace (torch.profiler's
-- record_function): ProfilerStep#N marks training steps, enumerate(DataLoader)... data loading.
CREATE TABLE IF NOT EXISTS spans (
    session_id INTEGER,
    pid INTEGER,
    tid INTEGER,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    name VARCHAR NOT NULL,       -- aten::conv2d, ProfilerStep#12, enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ ...
    category VARCHAR             -- the trace's cat: 'cpu_op' | 'user_annotation' | 'python_function'
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

-- Periods in which the per-call probes of some CUDA ops were attached for
-- only a slice (schema 12): `ingero trace --overhead-budget`.  Calls of those
-- ops have rows only between attached_from_ns and attached_to_ns of each
-- period (from from_ns at the earliest, to detached_by_ns at the latest); every other op, and every tracepoint, is traced throughout.  A
-- period without a row here was traced whole.  Counts of the ops scale by
-- 1 / ratio, less the time the probes themselves took from the calling thread
-- in the slice (call_cost_ns per call); their durations and percentiles come
-- from the attached slices.
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
