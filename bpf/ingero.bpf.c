/* SPDX-License-Identifier: Apache-2.0
 *
 * ingero.bpf.c - the one BPF object `ingero trace` loads.
 *
 * Compiled by BCC from this file (src_file=) with cflags set by
 * ingero/collect/loader.py; `ingero trace --print-bpf` shows the source and
 * the flags.  Every record is a struct ingero_event (bpf/events.h) in ONE
 * record ring (below), so user space copies whole spans with a fixed 64-byte stride.
 *
 * Settings (all -DNAME=value):
 *   RING_PAGES      record ring size in 4 KiB pages (power of two)
 *   TRACE_ALL_CUDA  1: any process calling CUDA becomes a target (default
 *                   mode); 0: only pids user space / fork / TARGET_COMM add
 *   TARGET_COMM     "name": processes with this comm become targets
 *   INGERO_STACK    include stack.h and collect stack ids
 *   INGERO_SAMPLE   (with INGERO_STACK) the cpu_sample program: a ~99 Hz CPU
 *                   sample of the traced threads (sample.bpf.c); SAMPLE_PERIOD_NS
 *   LAUNCH_STREAMS  1: read launches' streams from user memory (cuda.bpf.c)
 *   INGERO_BENCH    only the throughput generator probe (bench.bpf.c)
 *   INGERO_EMPTY    every program returns at once: the kernel floor of the
 *                   same attach points, for bench/bench_overhead.py
 *   INGERO_HOLDS    attach.bpf.c: stop a process opening a CUDA / NCCL library
 *                   (or, traced, exec'ing a program) until its probes are in
 *
 * Layout.  BCC rewrites map calls (`m.lookup(&k)`) and generates tracepoint
 * argument structs only in the main file, so this file holds every map, a
 * one-line accessor per map operation, and the list of tracepoints; the
 * family files (cuda, nccl, nvtx, sched, mm, blockio, bench) hold the logic and touch
 * maps only through these accessors.
 */
#include <uapi/linux/ptrace.h>
#ifdef INGERO_SAMPLE
#include <uapi/linux/bpf_perf_event.h>
#endif
#include "events.h"

#ifndef RING_PAGES
#define RING_PAGES 32768 /* 128 MiB with 4 KiB pages: ~2 s of records at 1 M/s */
#endif
#ifndef TRACE_ALL_CUDA
#define TRACE_ALL_CUDA 1
#endif
#ifndef LAUNCH_STREAMS
#define LAUNCH_STREAMS 0
#endif
/* Thread-keyed maps hold one entry per thread currently inside a probed
 * call / off CPU; 65536 threads is far above any training job. */
#define MAX_THREADS 65536
/* Thread slots (threads.bpf.c); fewer only to test the fallback maps
 * (tests/live/test_call_state_live.py builds with 1). */
#ifndef THREAD_SLOTS
#define THREAD_SLOTS MAX_THREADS
#endif
#define MAX_TARGETS 16384
#define MAX_PROCS 32768

#ifdef INGERO_EMPTY
#define EMPTY_RETURN() return 0
#else
#define EMPTY_RETURN() do { } while (0)
#endif

/* ---- state kept between probes ---------------------------------------- */

/* cuda: a thread's CUDA state.  The call fields describe the probed call it
 * is inside (entry -> return); flags persist across calls for the life of the
 * thread, and sched / mm tag the thread's off-CPU intervals and faults with
 * them (events in_call, queued). */
struct call_state {
	u64 ts;
	u64 sp;    /* stack pointer at the outer call's entry: tells nested from stale */
	u64 arg;
	u64 stream;
	s32 stack_id;
	u32 traced; /* the thread's process is a target: target_epoch + 1 when last asked, 0 = no */
	u16 depth; /* >1: probed calls nested inside the outer one */
	u8 op;
	u8 kind;
	u8 flags;  /* enum ingero_call_flag (events.h) */
	u8 cls;    /* enum call_class of the outer call's op */
};

/* What a call does to the thread's queued bit when it returns. */
enum call_class {
	CLASS_OTHER = 0,
	CLASS_ASYNC = 1, /* queues device work: launches, async copies */
	CLASS_SYNC = 2,  /* waits for the device: syncs, synchronous copies */
};

/* sched: every thread seen switching out, host-wide (tid -> tgid: the
 * tracepoint names the next task only by tid) and, for traced threads, the
 * current off-CPU interval (switch-out -> switch-in).  One entry per thread
 * instead of a tid -> tgid map plus an off-CPU map: a switch between two
 * traced threads does one lookup per side instead of five. */
struct thread_state {
	u64 ts;      /* switch-out of the current off-CPU interval; 0: on CPU (or never traced) */
	u64 wake_ts; /* became runnable again (0 until woken) */
	u64 waker;   /* who woke it: tgid << 32 | tid of the task running the wakeup (0: none seen) */
	u32 wait_fd; /* at a blocking switch-out: the system call's first argument + 1, low 23 bits */
	s16 wait_nr; /* at a blocking switch-out: the system call it is in (orig_ax), -1: none */
	u32 tgid;
	u32 other_pid;
	s32 stack_id;
	u32 traced; /* its process is a target: target_epoch + 1 when last asked, 0 = no */
	u16 cpu;
	u8 kind;
	u8 call_op;    /* at switch-out: the CUDA call it was inside (OP_NONE: none) */
	u8 call_flags; /* at switch-out: its call_state flags */
	u8 counted;    /* this interval goes to switch_counts, not the ring (BUDGET_COUNT_SWITCHES) */
};

/* nccl: what an NCCL call's entry read that its return sends out in a
 * struct ingero_nccl_ext (nccl.bpf.c). */
struct nccl_call {
	u64 comm;  /* the comm argument */
	u64 out;   /* init / split: where the created communicator is written (0: none) */
	u64 id[2]; /* see ingero_nccl_ext.id */
	s32 peer;  /* send / recv: peer; broadcast / reduce: root; -1 */
	s32 rank;
	s32 nranks;
	s32 color;
};

/* blockio: a request between issue and completion. */
struct rq_key {
	u64 sector;
	u32 dev;
	u32 pad;
};

struct rq_state {
	u64 ts;
	u64 bytes;
	u32 tgid;
	u32 tid;
	u8 kind;
};

/* The record ring: every record of every program, in claim order, read by
 * user space straight from the mapped array (ingero/collect/ringbuf.py).  Not
 * a BPF_RINGBUF_OUTPUT: its reserve and submit are two helper calls and a
 * lock (with irqs saved) per record; claiming a slot here is one atomic add
 * on a counter and an inlined array access.  Measured in the traced
 * workload's wall time (programs in-process, ring drained every 10 ms, 8
 * interleaved rounds): a per-CPU prototype of it took cudart_calls pinned
 * from 139 to 115 ns per call above the floor and ping-pong pinned from 538
 * to 484 ns per round trip; this one ring, with the thread-slot call state
 * and launch streams off, from 158 to 115 and 568 to 428.  One ring, not one
 * per CPU: records stay in claim order, and a busy CPU gets the whole ring. */
#define RING_SLOTS (RING_PAGES * (4096 / 64)) /* 64-byte slots: a power of two */
#define RING_MARGIN 4096
#define SLOT_BUSY (1ULL << 63)
struct ring_slot {
	u64 seq; /* position + 1 once the record is complete; | SLOT_BUSY while it is written */
	struct ingero_event ev;
};
/* head: slots claimed so far (BPF); tail: slots consumed (user space).  In
 * separate cache lines: the reader writes one, producers the other. */
struct ring_positions {
	u64 head;
	u64 pad1[7];
	u64 tail;
	u64 pad2[7];
};
BPF_F_TABLE("array", u32, struct ring_slot, ring, RING_SLOTS, BPF_F_MMAPABLE);
BPF_F_TABLE("array", u32, struct ring_positions, ring_pos, 1, BPF_F_MMAPABLE);
BPF_PERCPU_ARRAY(counters, u64, CNT_MAX);
BPF_HASH(targets, u32, u8, MAX_TARGETS);
/* Bumped whenever BPF removes a target (exits).  Probes cache "this thread's
 * process is a target" per thread (thread_state, call_state) with the epoch
 * they asked in, so a traced thread skips the targets lookup; an answer older
 * than the last removal is asked again.  (User space removes only targets
 * whose processes are gone, whose threads hold no cached answer.) */
BPF_ARRAY(target_epoch, u32, 1);
/* A thread's CUDA call state when its slot (below) belongs to another tid:
 * task-local storage, freed with the thread. */
BPF_TASK_STORAGE(inflight, struct call_state);
BPF_HASH(proc_stats, u32, struct ingero_proc_stat, MAX_PROCS);
/* tid -> struct thread_state of a thread whose slot another tid owns.  LRU so
 * it never fills up; entries are deleted at thread exit. */
BPF_TABLE("lru_hash", u32, struct thread_state, threads, MAX_THREADS);
/* Everything ingero keeps per thread lives in the thread's slot (tid &
 * (THREAD_SLOTS - 1)) of a plain array, whose lookup the verifier inlines,
 * where a hash or task storage lookup is a helper call: keeping the call
 * state here instead of in task storage took 12-23 ns off each CUDA call (two
 * lookups) on this VM.  Where pid_max (32768 by default) is at most
 * THREAD_SLOTS every tid has a slot of its own; a tid whose slot another
 * owns falls back to `threads` and `inflight`.  threads.bpf.c owns the rules.
 *
 * 128 bytes, owner and call state in the first cache line (all a CUDA probe
 * touches); BPF_F_MMAPABLE only because such an array's values start on a
 * page boundary (a plain array's start where its header ends). */
struct thread_slot {
	u64 owner; /* the owner's pid_tgid (tgid << 32 | tid); 0: free */
	struct call_state cs;
	struct thread_state st;
} __attribute__((aligned(64)));
BPF_F_TABLE("array", u32, struct thread_slot, thread_slots, THREAD_SLOTS, BPF_F_MMAPABLE);
/* When the task now on this CPU was switched in. */
BPF_PERCPU_ARRAY(oncpu_since, u64, 1);
/* Threads inside an NCCL call (tid -> struct nccl_call), entry to return. */
BPF_HASH(nccl_calls, u32, struct nccl_call, 4096);
/* The overhead budget: enum ingero_budget_flag bits, set by user space
 * (ingero/collect/budget.py); and the intervals it has counted instead of
 * stored, per thread (events.h).  Entries of exited threads are deleted by
 * user space once their last counts are stored. */
BPF_ARRAY(budget_cfg, u32, 1);
BPF_HASH(switch_counts, u32, struct ingero_switch_count, MAX_THREADS);
/* Block requests in flight: device queues hold at most a few thousand. */
BPF_HASH(block_rqs, struct rq_key, struct rq_state, 16384);

#ifdef INGERO_HOLDS
#include "attach.h"
/* attach.bpf.c: holds.  The path being opened / exec'd, read into a per-CPU
 * buffer twice its size (the name match reads at base + i, masked). */
struct hold_scan {
	struct ingero_hold_key key;
	char slack[HOLD_PATH_MAX];
};
BPF_RINGBUF_OUTPUT(hold_ring, 16); /* 64 KiB: ~220 holds waiting to be read */
BPF_ARRAY(hold_cfg, struct ingero_hold_cfg, 1);
BPF_PERCPU_ARRAY(hold_scratch, struct hold_scan, 1);
/* a path kept from a syscall's entry to its exit: (kind << 32 | tid or tgid) -> key */
BPF_HASH(hold_pending, u64, struct ingero_hold_key, 4096);
/* an opened library not mapped yet: (tgid << 32 | fd) -> key */
BPF_TABLE("lru_hash", u64, struct ingero_hold_key, hold_fds, 4096);
/* (cgroup, path) user space has looked at: never held again */
BPF_TABLE("lru_hash", struct ingero_hold_key, u8, hold_known, 16384);
/* tgid -> when it was stopped: what a tracer that dies leaves its guard to resume */
BPF_HASH(held, u32, u64, 4096);
/* interactive shells (user space lists them) and their children, never stopped */
BPF_HASH(hold_shells, u32, u8, 1024);
BPF_TABLE("lru_hash", u32, u8, hold_nostop, 16384);
static __always_inline struct ingero_hold_cfg *hold_cfg_get(void) { u32 zero = 0; return hold_cfg.lookup(&zero); }
static __always_inline struct hold_scan *hold_scratch_get(void) { u32 zero = 0; return hold_scratch.lookup(&zero); }
static __always_inline struct ingero_hold_key *hold_pending_get(u64 *k) { return hold_pending.lookup(k); }
static __always_inline void hold_pending_put(u64 *k, struct ingero_hold_key *v) { hold_pending.update(k, v); }
static __always_inline void hold_pending_del(u64 *k) { hold_pending.delete(k); }
static __always_inline u8 *hold_known_get(struct ingero_hold_key *k) { return hold_known.lookup(k); }
static __always_inline struct ingero_hold_key *hold_fds_get(u64 *k) { return hold_fds.lookup(k); }
static __always_inline void hold_fds_put(u64 *k, struct ingero_hold_key *v) { hold_fds.update(k, v); }
static __always_inline void hold_fds_del(u64 *k) { hold_fds.delete(k); }
static __always_inline void held_put(u32 *tgid, u64 *ts) { held.update(tgid, ts); }
static __always_inline void held_del(u32 *tgid) { held.delete(tgid); }
static __always_inline u8 *hold_shells_get(u32 *tgid) { return hold_shells.lookup(tgid); }
static __always_inline u8 *hold_nostop_get(u32 *tgid) { return hold_nostop.lookup(tgid); }
static __always_inline void hold_nostop_put(u32 *tgid) { u8 one = 1; hold_nostop.update(tgid, &one); }
static __always_inline struct ingero_hold *hold_reserve(void) { return hold_ring.ringbuf_reserve(sizeof(struct ingero_hold)); }
static __always_inline void hold_submit(struct ingero_hold *h) { hold_ring.ringbuf_submit(h, 0); }
#endif

static __always_inline struct call_state *inflight_here(int create)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	return inflight.task_storage_get(task, 0, create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}
static __always_inline struct thread_state *thread_get(u32 *tid) { return threads.lookup(tid); }
static __always_inline void thread_put(u32 *tid, struct thread_state *s) { threads.update(tid, s); }
static __always_inline void thread_del(u32 *tid) { threads.delete(tid); }
static __always_inline struct thread_slot *thread_slot_at(u32 i) { return thread_slots.lookup(&i); }
static __always_inline struct ingero_proc_stat *proc_stats_get(u32 *tgid) { return proc_stats.lookup(tgid); }
static __always_inline void proc_stats_put(u32 *tgid, struct ingero_proc_stat *s) { proc_stats.update(tgid, s); }
static __always_inline u32 budget_flags(void) { u32 zero = 0; u32 *f = budget_cfg.lookup(&zero); return f ? *f : 0; }
static __always_inline struct ingero_switch_count *switch_counts_get(u32 *tid) { return switch_counts.lookup(tid); }
static __always_inline int switch_counts_add(u32 *tid, struct ingero_switch_count *c) { return switch_counts.insert(tid, c); }
static __always_inline u64 *oncpu_since_get(void) { u32 zero = 0; return oncpu_since.lookup(&zero); }
static __always_inline struct nccl_call *nccl_call_get(u32 *tid) { return nccl_calls.lookup(tid); }
static __always_inline void nccl_call_put(u32 *tid, struct nccl_call *c) { nccl_calls.update(tid, c); }
static __always_inline void nccl_call_del(u32 *tid) { nccl_calls.delete(tid); }
static __always_inline struct rq_state *block_rqs_get(struct rq_key *k) { return block_rqs.lookup(k); }
static __always_inline void block_rqs_put(struct rq_key *k, struct rq_state *s) { block_rqs.update(k, s); }
static __always_inline void block_rqs_del(struct rq_key *k) { block_rqs.delete(k); }

static __always_inline void count(int idx)
{
	u64 *v = counters.lookup(&idx);
	if (v)
		(*v)++; /* per-CPU slot: no atomics needed */
}

/* Claim the next slot of the record ring, or count a drop when it is full.
 * The full check comes first (a claimed slot must be filled: the reader waits
 * for it), so producers on several CPUs passing it at once could overrun by
 * as many as pass together: RING_MARGIN slots are kept for them. */
static __always_inline struct ingero_event *event_reserve(void)
{
	u32 zero = 0;
	struct ring_positions *p = ring_pos.lookup(&zero);
	if (!p)
		return 0;
	if (p->head - *(volatile u64 *)&p->tail >= RING_SLOTS - RING_MARGIN) {
		count(CNT_RB_DROPS);
		return 0;
	}
	u64 pos = __sync_fetch_and_add(&p->head, 1);
	u32 idx = pos & (RING_SLOTS - 1);
	struct ring_slot *r = ring.lookup(&idx);
	if (!r)
		return 0; /* never: idx is masked (the verifier wants the check) */
	r->seq = (pos + 1) | SLOT_BUSY;
	return &r->ev;
}

/* The record is complete: its seq without the BUSY bit tells the reader so.
 * The stores before it reach memory first (x86 keeps stores in order; the
 * barrier keeps the compiler from moving them). */
static __always_inline void event_submit(struct ingero_event *e)
{
	u64 *seq = (u64 *)e - 1; /* struct ring_slot: seq, then the event */
	asm volatile("" ::: "memory");
	*seq &= ~SLOT_BUSY;
}

static __always_inline int is_target(u32 tgid)
{
	return targets.lookup(&tgid) != NULL;
}

static __always_inline void add_target(u32 tgid)
{
	u8 one = 1;
	targets.update(&tgid, &one);
}

static __always_inline void del_target(u32 tgid)
{
	if (targets.delete(&tgid) == 0) {
		u32 zero = 0;
		u32 *epoch = target_epoch.lookup(&zero);
		if (epoch)
			__sync_fetch_and_add(epoch, 1);
	}
}

/* The cached answer in *traced (0, or target_epoch + 1 when it was asked),
 * refreshed when a target was removed since or the answer was no. */
/* What a cached "is a target" answer holds when it is current (never 0). */
static __always_inline u32 target_epoch_now(void)
{
	u32 zero = 0;
	u32 *epoch = target_epoch.lookup(&zero);
	return (epoch ? *epoch : 0) + 1;
}

static __always_inline int is_target_cached(u32 tgid, u32 *traced)
{
	u32 now = target_epoch_now();
	if (*traced == now)
		return 1;
	*traced = is_target(tgid) ? now : 0;
	return *traced != 0;
}

#ifdef TARGET_COMM
static __always_inline int comm_matches(void)
{
	/* Byte by byte against the literal, terminating NUL included: unrolled,
	 * TARGET_COMM[i] folds to an immediate.  The volatile reads keep clang
	 * from turning a full 16-byte compare (a 15-character name) into a bcmp
	 * against a .rodata copy of the literal, which BCC cannot load. */
	char comm[16] = {};
	bpf_get_current_comm(&comm, sizeof(comm));
#pragma unroll
	for (int i = 0; i < sizeof(TARGET_COMM) && i < 16; i++) {
		if (((volatile char *)comm)[i] != TARGET_COMM[i])
			return 0;
	}
	return 1;
}
#endif

#ifdef INGERO_STACK
#include "stack.h"
#else
#define ingero_stack_id(ctx) (-1)
#endif

/* Tracepoints.  BCC generates the `struct tracepoint__<cat>__<event>` argument
 * types from the running kernel's format files, but only for
 * TRACEPOINT_PROBE()s written in this (main) file.  So the attach points are
 * listed here, each a one-line call into a handler defined by its family
 * file, which is included after the types exist. */
#define TP_DECLARE(cat, event) \
	struct tracepoint__##cat##__##event; \
	static __always_inline int on_##event(struct tracepoint__##cat##__##event *args);
/* BCC puts its section attribute in front of the text where the function
 * starts, so TRACEPOINT_PROBE must open its own line (not hide in a macro). */
#define TP_BODY(event) { EMPTY_RETURN(); return on_##event(args); }

#ifdef INGERO_BENCH
TP_DECLARE(syscalls, sys_enter_getppid)
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) TP_BODY(sys_enter_getppid)
#include "bench.bpf.c"
#else
TP_DECLARE(sched, sched_switch)
TP_DECLARE(sched, sched_waking)
TP_DECLARE(sched, sched_wakeup_new)
TP_DECLARE(sched, sched_process_fork)
TP_DECLARE(sched, sched_process_exec)
TP_DECLARE(sched, sched_process_exit)
TP_DECLARE(exceptions, page_fault_user)
TP_DECLARE(block, block_rq_issue)
TP_DECLARE(block, block_rq_complete)
TRACEPOINT_PROBE(sched, sched_switch) TP_BODY(sched_switch)
TRACEPOINT_PROBE(sched, sched_waking) TP_BODY(sched_waking)
TRACEPOINT_PROBE(sched, sched_wakeup_new) TP_BODY(sched_wakeup_new)
TRACEPOINT_PROBE(sched, sched_process_fork) TP_BODY(sched_process_fork)
TRACEPOINT_PROBE(sched, sched_process_exec) TP_BODY(sched_process_exec)
TRACEPOINT_PROBE(sched, sched_process_exit) TP_BODY(sched_process_exit)
TRACEPOINT_PROBE(exceptions, page_fault_user) TP_BODY(page_fault_user)
TRACEPOINT_PROBE(block, block_rq_issue) TP_BODY(block_rq_issue)
TRACEPOINT_PROBE(block, block_rq_complete) TP_BODY(block_rq_complete)

#ifdef INGERO_HOLDS
TP_DECLARE(syscalls, sys_enter_openat)
TP_DECLARE(syscalls, sys_exit_openat)
TP_DECLARE(syscalls, sys_enter_open)
TP_DECLARE(syscalls, sys_exit_open)
TP_DECLARE(syscalls, sys_enter_mmap)
TP_DECLARE(syscalls, sys_enter_execve)
TP_DECLARE(syscalls, sys_exit_execve)
TP_DECLARE(task, task_newtask)
TRACEPOINT_PROBE(syscalls, sys_enter_openat) TP_BODY(sys_enter_openat)
TRACEPOINT_PROBE(syscalls, sys_exit_openat) TP_BODY(sys_exit_openat)
TRACEPOINT_PROBE(syscalls, sys_enter_open) TP_BODY(sys_enter_open)
TRACEPOINT_PROBE(syscalls, sys_exit_open) TP_BODY(sys_exit_open)
TRACEPOINT_PROBE(syscalls, sys_enter_mmap) TP_BODY(sys_enter_mmap)
TRACEPOINT_PROBE(syscalls, sys_enter_execve) TP_BODY(sys_enter_execve)
TRACEPOINT_PROBE(syscalls, sys_exit_execve) TP_BODY(sys_exit_execve)
TRACEPOINT_PROBE(task, task_newtask) TP_BODY(task_newtask)
#endif

#include "threads.bpf.c"
#include "cuda.bpf.c"
#include "nccl.bpf.c"
#include "nvtx.bpf.c"
#include "sched.bpf.c"
#include "mm.bpf.c"
#include "blockio.bpf.c"
#ifdef INGERO_HOLDS
#include "attach.bpf.c"
#endif
#ifdef INGERO_SAMPLE
#include "sample.bpf.c"
/* The perf_event program (loader.py attaches it to a cpu-clock event per CPU). */
int cpu_sample(struct bpf_perf_event_data *ctx) { EMPTY_RETURN(); return on_cpu_sample(ctx); }
#endif

/* Uprobe programs: BCC only loads functions written in the main file; each
 * is a one-line wrapper around its handler in cuda.bpf.c.  ingero/collect/
 * probes.py says which symbol attaches to which. */
#define UPROBE_PROGRAM(name) int name(struct pt_regs *ctx) { return on_##name(ctx); }
UPROBE_PROGRAM(cuda_return)
UPROBE_PROGRAM(cuda_launch_kernel_enter)
UPROBE_PROGRAM(cuda_launch_kernel_exc_enter)
UPROBE_PROGRAM(cuda_memcpy_enter)
UPROBE_PROGRAM(cuda_memcpy_async_enter)
UPROBE_PROGRAM(cuda_stream_sync_enter)
UPROBE_PROGRAM(cuda_device_sync_enter)
UPROBE_PROGRAM(cuda_event_sync_enter)
UPROBE_PROGRAM(cuda_malloc_enter)
UPROBE_PROGRAM(cuda_free_enter)
UPROBE_PROGRAM(cuda_graph_launch_enter)
UPROBE_PROGRAM(cuda_malloc_host_enter)
UPROBE_PROGRAM(cuda_host_register_enter)
UPROBE_PROGRAM(cu_launch_kernel_enter)
UPROBE_PROGRAM(cu_launch_kernel_ex_enter)
UPROBE_PROGRAM(cu_memcpy_enter)
UPROBE_PROGRAM(cu_memcpy_htod_enter)
UPROBE_PROGRAM(cu_memcpy_dtoh_enter)
UPROBE_PROGRAM(cu_memcpy_dtod_enter)
UPROBE_PROGRAM(cu_memcpy_async_enter)
UPROBE_PROGRAM(cu_memcpy_htod_async_enter)
UPROBE_PROGRAM(cu_memcpy_dtoh_async_enter)
UPROBE_PROGRAM(cu_memcpy_dtod_async_enter)
UPROBE_PROGRAM(cu_ctx_sync_enter)
UPROBE_PROGRAM(cu_stream_sync_enter)
UPROBE_PROGRAM(cu_mem_alloc_enter)
UPROBE_PROGRAM(cu_mem_free_enter)
UPROBE_PROGRAM(cu_graph_launch_enter)
UPROBE_PROGRAM(nccl_return)
UPROBE_PROGRAM(nccl_all_reduce_enter)
UPROBE_PROGRAM(nccl_reduce_scatter_enter)
UPROBE_PROGRAM(nccl_all_gather_enter)
UPROBE_PROGRAM(nccl_broadcast_enter)
UPROBE_PROGRAM(nccl_bcast_enter)
UPROBE_PROGRAM(nccl_reduce_enter)
UPROBE_PROGRAM(nccl_send_enter)
UPROBE_PROGRAM(nccl_recv_enter)
UPROBE_PROGRAM(nccl_group_start_enter)
UPROBE_PROGRAM(nccl_group_end_enter)
UPROBE_PROGRAM(nccl_comm_init_rank_enter)
UPROBE_PROGRAM(nccl_comm_init_rank_config_enter)
UPROBE_PROGRAM(nccl_comm_init_all_enter)
UPROBE_PROGRAM(nccl_comm_split_enter)
UPROBE_PROGRAM(nccl_comm_destroy_enter)
UPROBE_PROGRAM(nccl_comm_abort_enter)
UPROBE_PROGRAM(nvtx_push_enter)
UPROBE_PROGRAM(nvtx_pop_enter)
UPROBE_PROGRAM(nvtx_start_enter)
UPROBE_PROGRAM(nvtx_end_enter)
#endif
