/* SPDX-License-Identifier: Apache-2.0
 *
 * events.h - the one declaration of every record the BPF side emits.
 *
 * Included by bpf/ingero.bpf.c (kernel side) and mirrored exactly once in
 * Python by ingero/events/records.py; tests/unit/test_records_parity.py
 * compiles this header with the system C compiler and compares sizes and
 * offsets.  Fixed-width types only.  A new field touches this file,
 * records.py, store/schema.sql and docs/schema.md in the same commit.
 */
#ifndef INGERO_EVENTS_H
#define INGERO_EVENTS_H

/* BCC compiles with the kernel's headers and __KERNEL__ defined, where u8 ...
 * already exist; user space (the parity test) gets them from stdint.h. */
#if !defined(__KERNEL__) && !defined(__BPF__)
#include <stdint.h>
typedef uint8_t u8;
typedef uint16_t u16;
typedef int16_t s16;
typedef uint32_t u32;
typedef uint64_t u64;
typedef int32_t s32;
typedef int64_t s64;
#endif

/* Operation ids.  The table stores the name (Op enum in events/ops.py maps
 * id -> name); ids are internal and may be renumbered together with
 * ops.py, names are public and never change. */
enum ingero_op {
	OP_NONE = 0,
	/* CUDA runtime (libcudart) */
	OP_CUDA_LAUNCH_KERNEL = 1,
	OP_CUDA_MEMCPY = 2,
	OP_CUDA_MEMCPY_ASYNC = 3,
	OP_CUDA_STREAM_SYNC = 4,
	OP_CUDA_DEVICE_SYNC = 5,
	OP_CUDA_EVENT_SYNC = 6,
	OP_CUDA_MALLOC = 7,
	OP_CUDA_FREE = 8,
	OP_CUDA_GRAPH_LAUNCH = 9,
	OP_CUDA_MALLOC_HOST = 10, /* cudaMallocHost / cudaHostAlloc: pinned memory */
	OP_CUDA_HOST_REGISTER = 11,
	/* CUDA driver (libcuda) */
	OP_CU_LAUNCH_KERNEL = 32,
	OP_CU_MEMCPY = 33, /* cuMemcpy, cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyDtoD */
	OP_CU_MEMCPY_ASYNC = 34,
	OP_CU_CTX_SYNC = 35,
	OP_CU_STREAM_SYNC = 36,
	OP_CU_MEM_ALLOC = 37,
	OP_CU_MEM_FREE = 38,
	OP_CU_GRAPH_LAUNCH = 39,
	/* NCCL (libnccl.so.2): one op per probed function, named as the function */
	OP_NCCL_ALL_REDUCE = 80,
	OP_NCCL_REDUCE_SCATTER = 81,
	OP_NCCL_ALL_GATHER = 82,
	OP_NCCL_BROADCAST = 83,
	OP_NCCL_REDUCE = 84,
	OP_NCCL_SEND = 85,
	OP_NCCL_RECV = 86,
	OP_NCCL_GROUP_START = 87,
	OP_NCCL_GROUP_END = 88,
	OP_NCCL_COMM_INIT_RANK = 89,
	OP_NCCL_COMM_INIT_ALL = 90,
	OP_NCCL_COMM_INIT_RANK_CONFIG = 91,
	OP_NCCL_COMM_SPLIT = 92,
	OP_NCCL_COMM_DESTROY = 93,
	OP_NCCL_COMM_ABORT = 94,
	/* Not a row: a struct ingero_nccl_ext claimed just before the record of
	 * the NCCL call it extends (the 56 bytes hold no room for its comm) */
	OP_NCCL_EXT = 79,
	/* NVTX ranges (nvtx.bpf.c, on ingero's injection library): never rows of
	 * events; the collector pairs them into spans (ingero/collect/nvtx.py) */
	OP_NVTX_PUSH = 96,
	OP_NVTX_POP = 97,
	OP_NVTX_START = 98,
	OP_NVTX_END = 99,
	OP_NVTX_TEXT = 100, /* a struct ingero_nvtx_text: part of a push's / start's message */
	/* host kernel */
	OP_SCHED_SWITCH = 64, /* one off-CPU interval of a traced thread */
	OP_PAGE_FAULT = 65,
	OP_BLOCK_IO = 66,
	OP_PROC_EXEC = 67,  /* a traced process (or its child) started */
	OP_PROC_EXIT = 68,
	OP_CPU_SAMPLE = 69, /* --stack: a ~99 Hz CPU sample of a traced thread (bpf/sample.bpf.c) */
	OP_BENCH = 127, /* synthetic records of the throughput benchmark */
};

/* cudaMemcpyKind values (also used for driver copies, derived from the
 * symbol: HtoD -> 1 ...).  KIND_* above 15 are host-side kinds. */
enum ingero_kind {
	KIND_H2H = 0,
	KIND_H2D = 1,
	KIND_D2H = 2,
	KIND_D2D = 3,
	KIND_DEFAULT = 4,
	KIND_NONE = 15,
	/* sched_switch: why the thread left the CPU */
	KIND_PREEMPTED = 16, /* still runnable (R / R+) */
	KIND_SLEEP = 17,     /* S: voluntary sleep */
	KIND_IO = 18,        /* D: uninterruptible, usually I/O or a fault */
	KIND_OTHER_STATE = 19,
	/* block I/O direction */
	KIND_READ = 24,
	KIND_WRITE = 25,
	KIND_FLUSH = 26,
	KIND_DISCARD = 27,
	/* NCCL calls: KIND_NCCL | redop << 4 | datatype.  redop: ncclRedOp_t
	 * 0-4 (sum prod max min avg), NCCL_REDOP_CUSTOM for one made by
	 * ncclRedOpCreatePreMulSum, NCCL_REDOP_NONE for calls without one;
	 * datatype: ncclDataType_t 0-11, NCCL_DTYPE_UNKNOWN beyond. */
	KIND_NCCL = 128,
};
#define NCCL_REDOP_CUSTOM 5
#define NCCL_REDOP_NONE 7
#define NCCL_DTYPE_UNKNOWN 15

/* One record per event, every kind: a single fixed stride lets user space
 * decode a whole ring-buffer span with one numpy view.  56 bytes + the
 * 8-byte ring-buffer header = 64 bytes per record in the ring. */
struct ingero_event {
	u64 ts_ns;       /* CLOCK_MONOTONIC start (call entry / switch-out / rq issue) */
	u64 duration_ns; /* call time / off-CPU time / request latency */
	u64 arg;         /* bytes (copies, allocs, block I/O); fault address */
	u64 stream;      /* cudaStream_t when readable, else 0 */
	u32 pid;         /* tgid */
	u32 tid;
	u32 other_pid;   /* sched_switch: tgid that ran instead (preempted) or, woken, that it waited behind; block_io: device */
	s32 stack_id;    /* BPF stack map id, -1 when not collected */
	/* Return code of the call: cudaError_t / CUresult (all below 1000);
	 * block I/O: the error (0 or a small negative errno); page fault: the
	 * x86 error code bits 0-14 (P, W, U, RSVD, I, PK, SS; the SGX and RMP
	 * bits, enclaves and SEV-SNP guests only, are dropped).  16 bits keep
	 * the record at 56 bytes with call_op and call_flags beside it. */
	s16 ret;
	u8 call_op;      /* sched_switch, page_fault, cpu_sample: enum ingero_op of the CUDA call the thread was inside, OP_NONE outside */
	u8 call_flags;   /* sched_switch, page_fault, cpu_sample: enum ingero_call_flag bits of the thread */
	u8 op;           /* enum ingero_op */
	u8 kind;         /* enum ingero_kind */
	u16 cpu;         /* CPU the event happened on */
};

/* The second record of an NCCL call (op OP_NCCL_EXT), claimed in the ring
 * right before the call's own struct ingero_event (op OP_NCCL_*), so user
 * space always reads it first; (tid, ts_ns) joins the two.  The call record
 * holds bytes (arg), stream, peer or root (other_pid) and KIND_NCCL kind;
 * this one what does not fit there.  Same size and op offset as
 * ingero_event: the ring's stride is one. */
struct ingero_nccl_ext {
	u64 ts_ns;   /* the call's entry time, as in its record */
	u64 comm;    /* the call's ncclComm_t; init / split: the one created (0: none) */
	u64 id[2];   /* ncclCommInitRank*: the ncclUniqueId's first 16 bytes; split: parent comm, key */
	u32 pid;
	u32 tid;
	s32 rank;    /* init: rank (InitAll: 0 for comms[0]); -1 unknown */
	s32 nranks;  /* init: nranks (InitAll: ndev); -1 unknown */
	s32 color;   /* split: color; -1 otherwise */
	u8 op;       /* OP_NCCL_EXT */
	u8 call_op;  /* the op of the call it extends */
	u16 cpu;
};

/* NVTX: one struct ingero_nvtx per push, pop, start or end, and before a
 * push's or start's, its message in up to two struct ingero_nvtx_text
 * (NVTX_TEXT_PART bytes each, part 0 first), claimed by the same thread:
 * (tid, ts_ns) joins them.  Messages longer than NVTX_TEXT_MAX bytes are cut
 * there.  pid, tid, op and cpu sit where struct ingero_event has them (the
 * session reads every record's pid before any join). */
#define NVTX_TEXT_MAX 64
#define NVTX_TEXT_PART 36
struct ingero_nvtx {
	u64 ts_ns;     /* entry into the injection library's function (CLOCK_MONOTONIC) */
	u64 id;        /* start / end: the nvtxRangeId_t; push / pop: the domain handle (0: default domain) */
	u64 pad0[2];
	u32 pid;       /* tgid */
	u32 tid;
	u32 text_len;  /* push / start: bytes of the message read (0..NVTX_TEXT_MAX) */
	u32 pad1;
	u32 pad2;
	u8 op;         /* OP_NVTX_PUSH / POP / START / END */
	u8 pad3;
	u16 cpu;
};

struct ingero_nvtx_text {
	u64 ts_ns;     /* the ts_ns of the range record it belongs to */
	char text[24]; /* message bytes [NVTX_TEXT_PART * part, + 24) */
	u32 pid;
	u32 tid;
	char text2[12]; /* message bytes [NVTX_TEXT_PART * part + 24, + 12) */
	u8 op;         /* OP_NVTX_TEXT */
	u8 part;       /* 0, 1 */
	u16 cpu;
};

/* A sched_switch row packs what the thread waited for into fields its op
 * leaves free: arg = runq_ns in its low SWITCH_RUNQ_BITS and, above them,
 * the blocking system call's first argument + 1 (SWITCH_FD_MASK bits; its fd
 * for read, recvfrom, fsync ...); ret = that system call's number (-1: none:
 * preempted, or blocked outside one); stream = the waker (tgid << 32 | tid of
 * the task that ran sched_waking, in a system call that wakes others; 0 for
 * an interrupt: a timer, a disk or network completion) | SWITCH_WAKER_SEEN,
 * 0 when no wake-up was seen. */
#define SWITCH_RUNQ_BITS 40
#define SWITCH_FD_MASK 0x7FFFFF
#define SWITCH_WAKER_SEEN (1ULL << 63)
/* ingero_event.call_flags: the thread's CUDA state when it went off CPU /
 * faulted (struct call_state in ingero.bpf.c keeps them per thread).
 * No bit set: the thread has made no traced CUDA call (queued is NULL). */
enum ingero_call_flag {
	CALL_FLAG_SEEN = 1,   /* the thread has made a traced CUDA call */
	CALL_FLAG_QUEUED = 2, /* since its last synchronising call returned, a launch / async copy returned 0 */
};

/* Host-wide per-process scheduler totals, aggregated in a hash map keyed by
 * tgid and harvested once a second: names competitors without a record per
 * switch of every process on the box. */
struct ingero_proc_stat {
	u64 oncpu_ns;        /* CPU time consumed */
	u64 involuntary;     /* switched out while runnable */
	u64 voluntary;       /* switched out to sleep */
	u64 preempted_traced; /* times it took the CPU from a traced thread */
	char comm[16];
};

/* The overhead budget's switches (ingero/collect/budget.py): bits of the
 * budget_cfg map.  BUDGET_COUNT_SWITCHES: an off-CPU interval of a traced
 * thread that has made no traced CUDA call (CALL_FLAG_SEEN unset) is added to
 * its entry of the switch_counts map (tid -> struct ingero_switch_count)
 * instead of being a row; user space stores the map's per-second deltas
 * (the switch_counts table). */
enum ingero_budget_flag {
	BUDGET_COUNT_SWITCHES = 1,
};

/* Off-CPU intervals of one thread counted instead of stored, by why it left
 * (index: kind - KIND_PREEMPTED: preempted, sleep, io, other).  Totals since
 * the entry was made; only the thread's own switch-in adds to it. */
struct ingero_switch_count {
	u64 n[4];       /* intervals */
	u64 off_ns[4];  /* their off-CPU time */
	u64 runq_ns[4]; /* their wait for a CPU (wakeup -> switch-in; the whole interval when preempted) */
	u32 tgid;
	u32 pad;
};

/* Counters the BPF side keeps about itself (array map, one slot each). */
enum ingero_counter {
	CNT_RB_DROPS = 0,     /* the record ring was full: record lost */
	CNT_STACK_ERRORS = 1, /* get_stackid failed */
	CNT_NEST_SKIPPED = 2, /* probed call nested inside another probed call */
	CNT_STALE_CALLS = 3,  /* in-flight call state whose return was never seen, replaced */
	CNT_UNSEEN_SWITCH_IN = 4, /* off-CPU interval whose switch back was not seen: its end estimated */
	CNT_SWITCH_COUNTS_FULL = 5, /* switch_counts map full: the interval became a row instead of a count */
	CNT_MAX = 8,
};

#endif /* INGERO_EVENTS_H */
