/* SPDX-License-Identifier: Apache-2.0
 *
 * stack.h - call sites for --stack: the native user stack plus, for CPython
 * processes, the interpreter's own frames (code object + instruction pointer
 * of every Python frame of the calling thread).
 *
 * Included by bpf/ingero.bpf.c when compiled with -DINGERO_STACK and by the
 * test harness tests/live/stack_harness.bpf.c.  One entry point:
 *
 *     s32 ingero_stack_id(void *ctx)
 *
 * returns an id into ingero_stacks (>= 0) or -1.  The id is a 31-bit hash of
 * the record's content (tgid, native return addresses, Python frames), so a
 * call site seen a million times costs one map slot, and user space
 * (ingero/collect/stacks.py) resolves each id once and deletes the record.
 *
 * Why the native addresses are copied into the record (bpf_get_stack) and not
 * kept in a BPF_STACK_TRACE map: a stack-trace map never gives a slot back by
 * itself, and without BPF_F_REUSE_STACKID a new stack whose hash bucket is
 * taken fails (-EEXIST), so a long session saw fewer and fewer native stacks;
 * with it, a record could be resolved against a stack that replaced its own.
 * A record holds everything it needs, and its slot is free once it is read.
 *
 * Why the Python frames are walked here and not later from user space: by
 * the time user space reads the ring buffer the thread has moved on, so the
 * frame chain read then belongs to a different moment.  The walk is cheap
 * (3 user reads per frame) and layout-free: every offset comes from
 * ingero_py_procs, filled per process by user space (pyframes.py knows the
 * CPython layouts), so one compiled program serves 3.10 to 3.13.
 *
 * Thread matching: the interpreter keeps a list of thread states; the one of
 * the current thread is found by comparing its native thread id with the
 * kernel tid (3.11+: PyThreadState.native_thread_id; 3.10 only has the
 * pthread_t, whose glibc struct holds the tid at an offset user space
 * measures).  The result is cached per tid and revalidated with one read.
 */
#ifndef INGERO_STACK_H
#define INGERO_STACK_H

#include "events.h"

#ifndef INGERO_STACK_ENTRIES
#define INGERO_STACK_ENTRIES 16384 /* distinct call sites kept per session */
#endif
/* Deep enough for a PyTorch training step (nn.Module.__call__ nests ~3
 * frames per layer); deeper stacks keep their innermost frames. */
#define INGERO_PY_MAX_FRAMES 48
/* Native return addresses kept per record, innermost first (deeper ones are
 * cut: the call site is at the inner end). */
#define INGERO_NATIVE_MAX_FRAMES 64
/* Threads scanned per interpreter to find the current one. */
#define INGERO_PY_MAX_THREADS 64

/* Per-process interpreter layout, written by user space (StackResolver.prepare).
 * Mirrored by PyProcConfig in ingero/collect/stacks.py. */
struct ingero_py_proc {
	u64 runtime_addr;     /* &_PyRuntime in the process */
	u32 interp_head;      /* _PyRuntime.interpreters.head */
	u32 threads_head;     /* PyInterpreterState.threads.head */
	u32 tstate_next;      /* PyThreadState.next */
	u32 tstate_tid;       /* native_thread_id, or thread_id (pthread_t) for 3.10 */
	s32 pthread_tid;      /* >= 0: tstate_tid holds a pthread_t, tid at this offset in it */
	u32 tstate_frame;     /* cframe (3.11/3.12), current_frame (3.13), frame (3.10) */
	s32 cframe_frame;     /* >= 0: tstate_frame is a _PyCFrame*, frame pointer at this offset */
	u32 frame_code;       /* f_code / f_executable */
	u32 frame_previous;   /* previous / f_back */
	u32 frame_instr;      /* prev_instr / instr_ptr / f_lasti */
	u32 generation;       /* which exec'd image this describes (user space counter) */
	u32 flags;            /* INGERO_PY_* */
	u32 block_start;      /* the three frame fields lie in [block_start, +block_len): */
	u32 block_len;        /*   one user read per frame instead of three */
};

/* Skip the native user stack: for CPython without frame pointers it ends in
 * garbage right after libffi, and the Python frames say more. */
#define INGERO_PY_NO_NATIVE 1
#define INGERO_FRAME_BLOCK 128 /* bytes: >= any block_len user space sets */

/* One call site.  Mirrored by PY_STACK_DTYPE in ingero/collect/stacks.py. */
struct ingero_stack {
	u32 tgid;
	s32 native_n;         /* addresses in native[]; -errno when the walk failed, -1 when not taken */
	u16 nframes;          /* Python frames stored, innermost first */
	u16 truncated;        /* 1 when the chain was deeper than INGERO_PY_MAX_FRAMES */
	u32 generation;       /* ingero_py_proc.generation used for the walk, 0 = none:
	                       * code addresses only mean something in that image */
	u64 code[INGERO_PY_MAX_FRAMES];  /* PyCodeObject* */
	u64 instr[INGERO_PY_MAX_FRAMES]; /* instruction pointer (3.11+) or f_lasti (3.10) */
	u64 native[INGERO_NATIVE_MAX_FRAMES]; /* user return addresses, innermost first */
};

BPF_HASH(ingero_stacks, u32, struct ingero_stack, INGERO_STACK_ENTRIES);
BPF_HASH(ingero_py_procs, u32, struct ingero_py_proc, 1024);
BPF_TABLE("lru_hash", u32, u64, ingero_py_tstates, 8192);
/* tgids seen without an ingero_py_procs entry: user space polls this to
 * examine new processes within milliseconds (a --cmd child, a process that
 * just exec'd), then writes their entry (runtime_addr 0 = not CPython). */
BPF_HASH(ingero_stack_new_tgids, u32, u8, 1024);
BPF_PERCPU_ARRAY(ingero_stack_scratch, struct ingero_stack, 1);
struct ingero_frame_buf {
	u8 b[INGERO_FRAME_BLOCK];
};
BPF_PERCPU_ARRAY(ingero_frame_scratch, struct ingero_frame_buf, 1);
/* [0] records stored, [1] native stack walks failed, [2] thread state not found,
 * [3] map full, [4] frame chains truncated */
BPF_ARRAY(ingero_stack_counters, u64, 8);

static __always_inline void ingero_stack_count(u32 slot)
{
	u64 *v = ingero_stack_counters.lookup(&slot);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline u64 ingero_read_u64(u64 addr)
{
	u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0)
		return 0;
	return v;
}

static __always_inline u32 ingero_read_u32(u64 addr)
{
	u32 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0)
		return 0;
	return v;
}

static __always_inline u32 ingero_tstate_tid(struct ingero_py_proc *cfg, u64 tstate)
{
	if (cfg->pthread_tid >= 0) {
		u64 pthread = ingero_read_u64(tstate + cfg->tstate_tid);
		if (!pthread)
			return 0;
		return ingero_read_u32(pthread + (u32)cfg->pthread_tid);
	}
	return ingero_read_u32(tstate + cfg->tstate_tid);
}

/* The PyThreadState of the current thread, 0 if it has none. */
static __always_inline u64 ingero_find_tstate(struct ingero_py_proc *cfg, u32 tid)
{
	u64 *cached = ingero_py_tstates.lookup(&tid);
	if (cached && *cached && ingero_tstate_tid(cfg, *cached) == tid)
		return *cached;

	u64 interp = ingero_read_u64(cfg->runtime_addr + cfg->interp_head);
	if (!interp)
		return 0;
	u64 ts = ingero_read_u64(interp + cfg->threads_head);
	for (int i = 0; i < INGERO_PY_MAX_THREADS && ts; i++) {
		if (ingero_tstate_tid(cfg, ts) == tid) {
			ingero_py_tstates.update(&tid, &ts);
			return ts;
		}
		ts = ingero_read_u64(ts + cfg->tstate_next);
	}
	return 0;
}

static __always_inline u64 ingero_stack_mix(u64 h, u64 v)
{
	/* FNV-1a style mixing over 64-bit words: cheap, and content-defined so
	 * equal call sites get equal ids. */
	h ^= v;
	h *= 0x100000001b3ULL;
	return h;
}

/* A u64 at byte offset `off` (8-aligned, < INGERO_FRAME_BLOCK) of buf. */
static __always_inline u64 ingero_block_u64(struct ingero_frame_buf *buf, u32 off)
{
	return *(u64 *)(buf->b + (off & (INGERO_FRAME_BLOCK - 8)));
}

static __always_inline s32 ingero_stack_id(void *ctx)
{
	u32 zero = 0;
	struct ingero_stack *rec = ingero_stack_scratch.lookup(&zero);
	struct ingero_frame_buf *buf = ingero_frame_scratch.lookup(&zero);
	if (!rec || !buf)
		return -1;

	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tgid = pid_tgid >> 32;
	u32 tid = (u32)pid_tgid;

	rec->tgid = tgid;
	rec->nframes = 0;
	rec->truncated = 0;
	rec->generation = 0;
	rec->native_n = -1;

	u64 h = ingero_stack_mix(0xcbf29ce484222325ULL, tgid);
	struct ingero_py_proc *cfg = ingero_py_procs.lookup(&tgid);
	if (!cfg) {
		u8 one = 1;
		ingero_stack_new_tgids.insert(&tgid, &one);
	}
	if (!cfg || !(cfg->flags & INGERO_PY_NO_NATIVE)) {
		/* bpf_get_stack always writes all of native[]: the addresses, then
		 * zeros (on failure, zeros only), so hashing every slot is hashing
		 * the stack -- straight-line code, which the verifier walks once (a
		 * loop that stopped at native_n multiplied its states past the
		 * limit in the full program). */
		long got = bpf_get_stack(ctx, rec->native, sizeof(rec->native), BPF_F_USER_STACK);
		if (got < 0) {
			rec->native_n = (s32)got;
			ingero_stack_count(1);
		} else {
			rec->native_n = (s32)(got / 8);
		}
		for (int i = 0; i < INGERO_NATIVE_MAX_FRAMES; i++)
			h = ingero_stack_mix(h, rec->native[i]);
	}
	h = ingero_stack_mix(h, (u64)(s64)rec->native_n);

	if (cfg && cfg->runtime_addr) {
		rec->generation = cfg->generation;
		h = ingero_stack_mix(h, cfg->generation);
		u64 ts = ingero_find_tstate(cfg, tid);
		if (!ts) {
			ingero_stack_count(2);
		} else {
			u64 frame = ingero_read_u64(ts + cfg->tstate_frame);
			if (cfg->cframe_frame >= 0 && frame)
				frame = ingero_read_u64(frame + (u32)cfg->cframe_frame);
			u32 start = cfg->block_start;
			u32 len = cfg->block_len;
			u32 code_off = cfg->frame_code - start;
			u32 prev_off = cfg->frame_previous - start;
			u32 instr_off = cfg->frame_instr - start;
			if (len == 0 || len > INGERO_FRAME_BLOCK)
				frame = 0;
			u32 n = 0;
			for (int i = 0; i < INGERO_PY_MAX_FRAMES; i++) {
				if (!frame)
					break;
				if (bpf_probe_read_user(buf->b, len & (INGERO_FRAME_BLOCK - 1), (void *)(frame + start)) != 0)
					break;
				u64 code = ingero_block_u64(buf, code_off);
				u64 instr = ingero_block_u64(buf, instr_off);
				rec->code[i] = code;
				rec->instr[i] = instr;
				h = ingero_stack_mix(h, code);
				h = ingero_stack_mix(h, instr);
				n = i + 1;
				frame = ingero_block_u64(buf, prev_off);
			}
			rec->nframes = n;
			if (frame && n == INGERO_PY_MAX_FRAMES) {
				rec->truncated = 1;
				ingero_stack_count(4);
			}
		}
	}

	if (rec->native_n <= 0 && rec->nframes == 0)
		return -1;
	u32 id = (u32)(h ^ (h >> 32)) & 0x7fffffff;
	/* Lookup first: lock-free, and the common case (a call site seen before). */
	if (ingero_stacks.lookup(&id))
		return (s32)id;
	int err = ingero_stacks.insert(&id, rec);
	if (err == 0) {
		ingero_stack_count(0);
	} else if (err != -17 /* EEXIST: stored meanwhile by another CPU */) {
		ingero_stack_count(3);
		return -1;
	}
	return (s32)id;
}

#endif /* INGERO_STACK_H */
