/* SPDX-License-Identifier: Apache-2.0
 *
 * cuda.bpf.c - uprobes on the CUDA runtime (libcudart) and driver (libcuda).
 * Included by ingero.bpf.c.  Which symbol attaches to which function below is
 * decided in one place: the table in ingero/collect/probes.py.
 *
 * The programs themselves (thin wrappers named in probes.py) are defined at
 * the end of ingero.bpf.c: BCC only loads functions of the main file.
 *
 * Entry probes read the arguments (SysV x86-64 ABI) into per-thread state;
 * the one return probe emits the row with the duration and return code.  A
 * probed call made inside another probed call (cudaMemcpy -> cudaMemcpy_ptds,
 * runtime -> driver) only bumps a depth counter: one row per outer call.
 */

/* The 7th and later integer arguments are on the stack: at the first
 * instruction SP points at the return address, so slot n is at SP + 8n. */
static __always_inline u64 stack_arg_at(struct pt_regs *ctx, int slot)
{
	return PT_REGS_SP(ctx) + 8 * slot;
}

static __always_inline u64 user_u64(u64 addr)
{
	u64 v = 0;
	if (addr)
		bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

static __always_inline int cuda_traced(u32 tgid)
{
	if (is_target(tgid))
		return 1;
#if TRACE_ALL_CUDA
	add_target(tgid); /* default mode: whoever calls CUDA is traced */
	return 1;
#else
#ifdef TARGET_COMM
	if (comm_matches()) {
		add_target(tgid);
		return 1;
	}
#endif
	return 0;
#endif
}

/* Whether the probed call whose entry saw SP = slot is still in progress, seen
 * from a probe at a deeper sp of the same thread.  At the entry, slot held
 * the call's return address; right after the entry probes, the kernel
 * replaced it with the address of the uretprobe trampoline (slot 0 of the
 * process's "[uprobes]" page), and it stays so until the call returns.
 * Other frames reusing that stack after a longjmp out of the call write
 * their own data there.  The trampoline address is page-aligned and, the
 * kernel mapping that page as high as it can (xol_add_vma hints TASK_SIZE -
 * PAGE_SIZE; measured here: 7fffffffe000 in every process), above every
 * stack, so above sp; a return address into code or stack data rarely is
 * both.  Errors fall on the side of "alive" (the behaviour before this
 * check): a stale call taken for alive only loses rows until a call comes
 * from at or above it, while a live call taken for stale would lose its row. */
static __always_inline int outer_frame_alive(u64 slot, u64 sp)
{
	u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)slot) != 0)
		return 1;
	return (v & 0xfff) == 0 && v > sp;
}

/* The contract of events.queued (docs/schema.md): launches and async copies
 * queue device work; stream / device / event / context syncs and the
 * synchronous copies wait for it.  Called with a constant op from every entry
 * handler, so it folds to a constant. */
static __always_inline u8 op_class(u8 op)
{
	switch (op) {
	case OP_CUDA_LAUNCH_KERNEL:
	case OP_CUDA_GRAPH_LAUNCH:
	case OP_CUDA_MEMCPY_ASYNC:
	case OP_CU_LAUNCH_KERNEL:
	case OP_CU_GRAPH_LAUNCH:
	case OP_CU_MEMCPY_ASYNC:
	/* An NCCL collective or send/recv returns once its kernel is enqueued on
	 * the stream (inside a group: once ncclGroupEnd launches it), like a
	 * launch: the thread has device work in flight until it syncs.  Whether
	 * the other ranks have arrived is the device's business, not the host's. */
	case OP_NCCL_ALL_REDUCE:
	case OP_NCCL_REDUCE_SCATTER:
	case OP_NCCL_ALL_GATHER:
	case OP_NCCL_BROADCAST:
	case OP_NCCL_REDUCE:
	case OP_NCCL_SEND:
	case OP_NCCL_RECV:
		return CLASS_ASYNC;
	case OP_CUDA_MEMCPY:
	case OP_CUDA_STREAM_SYNC:
	case OP_CUDA_DEVICE_SYNC:
	case OP_CUDA_EVENT_SYNC:
	case OP_CU_MEMCPY:
	case OP_CU_CTX_SYNC:
	case OP_CU_STREAM_SYNC:
		return CLASS_SYNC;
	default:
		return CLASS_OTHER;
	}
}

/* The stream is either a register argument (stream) or a u64 in user memory
 * (stream_at != 0: a launch's stack slot or config struct field).  Reading
 * user memory costs more than the rest of the call path: a
 * bpf_probe_read_user was ~90 ns of program run time (bench_probe_cost.py)
 * and ~200 ns of the workload's wall time per launch (cudart_calls pinned,
 * one launch in 9 calls: 169 -> 145 ns per call above the floor without
 * the read).  Launches are most of a training loop's calls, so their
 * streams are read only with LAUNCH_STREAMS (`ingero trace --streams`), and
 * then only for a call that gets a row (a nested cuLaunchKernel inside
 * cudaLaunchKernel needs none). */
/* The state of the call this entry begins, or NULL when it is not recorded
 * (not traced, or nested in another probed call).  The caller stamps s->ts
 * last: probe work is not call time. */
static __always_inline struct call_state *call_begin(struct pt_regs *ctx, u64 id, u8 op, u8 kind, u64 arg,
						     u64 stream, u64 stream_at)
{
	struct call_state *s = call_state_here(id, 1);
	if (!s)
		return 0;
	/* The thread's answer to "is my process traced" is cached in its call
	 * state: a traced thread skips the targets hash lookup. */
	u32 epoch = target_epoch_now();
	if (s->traced != epoch) {
		if (!cuda_traced(id >> 32)) {
			s->traced = 0;
			return 0;
		}
		s->traced = epoch;
	}
	u64 sp = PT_REGS_SP(ctx);
	if (s->depth) {
		/* A call made inside the outer one runs deeper in the stack (lower
		 * SP) while the outer frame is still there.  At or above the outer
		 * entry's SP, or deeper but with the outer frame overwritten, the
		 * outer call is gone and its return was never seen (a longjmp, or a
		 * return probe that was not in place yet): start afresh rather than
		 * swallow every later call of this thread as "nested". */
		if (sp < s->sp && outer_frame_alive(s->sp, sp)) {
			s->depth++;
			count(CNT_NEST_SKIPPED);
			return 0;
		}
		count(CNT_STALE_CALLS);
	}
	s->sp = sp;
	s->stack_id = ingero_stack_id(ctx);
	s->op = op;
	s->kind = kind;
	s->cls = op_class(op);
	s->flags |= CALL_FLAG_SEEN;
	s->arg = arg;
	s->stream = !stream_at ? stream : LAUNCH_STREAMS ? user_u64(stream_at) : 0;
	s->depth = 1;
	return s;
}

static __always_inline int cuda_enter(struct pt_regs *ctx, u8 op, u8 kind, u64 arg, u64 stream, u64 stream_at)
{
	EMPTY_RETURN();
	struct call_state *s = call_begin(ctx, bpf_get_current_pid_tgid(), op, kind, arg, stream, stream_at);
	if (s)
		s->ts = bpf_ktime_get_ns(); /* last: probe work is not call time */
	return 0;
}

/* What the call path costs here (kernel 6.18, this AMD VM), measured in the
 * traced workload's wall time by taking one piece out at a time (cudart_calls
 * pinned, programs in-process, 6-8 interleaved rounds; ns per call above the
 * empty programs): the two clock reads ~64 (bpf_ktime_get_ns: an rdtscp, 25
 * ns by itself on this VM, behind a retpolined call); the call state in task
 * storage ~23 (now in the thread's slot, an inlined array access); BPF's ring
 * buffer ~24 more than the record ring; a launch's stream read ~200 per
 * launch (now only with LAUNCH_STREAMS).  A program doing nothing but the
 * clocks, a task-storage state and a ring-buffer record was at +122 ns; these
 * are at ~+115.  What is left: two clock reads, pid_tgid, one slot access per
 * probe and the record.  bench/bench_probe_cost.py: ns per program run. */
/* The state of the outer call this return ends, or NULL (a nested call's
 * return only steps out of it; no call recorded). */
static __always_inline struct call_state *call_end(u64 id)
{
	struct call_state *s = call_state_here(id, 0);
	if (!s || !s->depth)
		return 0;
	if (s->depth > 1) {
		s->depth--;
		return 0;
	}
	s->depth = 0;
	return s;
}

/* The row of the call that returned ret: sets the thread's queued bit and
 * emits the record; other_pid carries NCCL's peer / root. */
static __always_inline void call_record(struct call_state *s, u64 now, u64 id, s64 ret, u32 other_pid)
{
	/* The queued bit changes when the outer call returns, not at entry:
	 * while a sync waits, the device still runs the thread's work (those
	 * off-CPU intervals are tagged in_call = the sync anyway), and whether a
	 * launch queued anything is known only from its return code.  A launch
	 * that failed (e.g. 35 on a host without a driver) queued nothing.  A
	 * sync clears the bit whatever it returns: its errors are either a
	 * failure of the queued work itself, which is sticky (the context is
	 * lost, nothing queued runs any more), or a bad handle, a program bug.
	 * Nested calls (the driver under the runtime) change nothing: the outer
	 * call's op says what the thread asked for. */
	if (s->cls == CLASS_ASYNC && ret == 0)
		s->flags |= CALL_FLAG_QUEUED;
	else if (s->cls == CLASS_SYNC)
		s->flags &= ~CALL_FLAG_QUEUED;
	struct ingero_event *e = event_reserve();
	if (e) {
		e->ts_ns = s->ts;
		e->duration_ns = now - s->ts;
		e->arg = s->arg;
		e->stream = s->stream;
		e->pid = id >> 32;
		e->tid = (u32)id;
		e->other_pid = other_pid;
		e->ret = (s16)ret; /* cudaError_t / CUresult / ncclResult_t: all below 1000 */
		e->call_op = OP_NONE;
		e->call_flags = 0;
		e->stack_id = s->stack_id;
		e->op = s->op;
		e->kind = s->kind;
		e->cpu = bpf_get_smp_processor_id();
		event_submit(e);
	}
}

static __always_inline int on_cuda_return(struct pt_regs *ctx)
{
	EMPTY_RETURN();
	u64 now = bpf_ktime_get_ns();
	u64 id = bpf_get_current_pid_tgid();
	struct call_state *s = call_end(id);
	if (s)
		call_record(s, now, id, (s32)PT_REGS_RC(ctx), 0);
	return 0;
}

/* cudaMemcpyKind is 0..4 (H2H, H2D, D2H, D2D, default); anything else is
 * stored as "no kind" rather than a wrong name. */
static __always_inline u8 copy_kind(u64 k)
{
	return k <= KIND_DEFAULT ? (u8)k : KIND_NONE;
}

/* ---- runtime API (libcudart) ------------------------------------------ */

/* cudaLaunchKernel(func, dim3 grid, dim3 block, args, sharedMem, stream):
 * each 12-byte dim3 goes in two registers (rsi:rdx, rcx:r8), args in r9, so
 * sharedMem and stream spill to the stack: stream is stack slot 2. */
static __always_inline int on_cuda_launch_kernel_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_LAUNCH_KERNEL, KIND_NONE, 0, 0, stack_arg_at(ctx, 2));
}

/* cudaLaunchKernelExC(const cudaLaunchConfig_t *config, func, args):
 * config = {dim3 grid; dim3 block; size_t dynamicSmem; cudaStream_t stream; ...},
 * stream at offset 32. */
static __always_inline int on_cuda_launch_kernel_exc_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_LAUNCH_KERNEL, KIND_NONE, 0, 0, PT_REGS_PARM1(ctx) + 32);
}

/* cudaMemcpy(dst, src, count, kind) */
static __always_inline int on_cuda_memcpy_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_MEMCPY, copy_kind(PT_REGS_PARM4(ctx)), PT_REGS_PARM3(ctx), 0, 0);
}

/* cudaMemcpyAsync(dst, src, count, kind, stream) */
static __always_inline int on_cuda_memcpy_async_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_MEMCPY_ASYNC, copy_kind(PT_REGS_PARM4(ctx)), PT_REGS_PARM3(ctx),
			  PT_REGS_PARM5(ctx), 0);
}

/* cudaStreamSynchronize(stream) */
static __always_inline int on_cuda_stream_sync_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_STREAM_SYNC, KIND_NONE, 0, PT_REGS_PARM1(ctx), 0);
}

static __always_inline int on_cuda_device_sync_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_DEVICE_SYNC, KIND_NONE, 0, 0, 0);
}

static __always_inline int on_cuda_event_sync_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_EVENT_SYNC, KIND_NONE, 0, 0, 0);
}

/* cudaMalloc(void **devPtr, size_t size) */
static __always_inline int on_cuda_malloc_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_MALLOC, KIND_NONE, PT_REGS_PARM2(ctx), 0, 0);
}

static __always_inline int on_cuda_free_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_FREE, KIND_NONE, 0, 0, 0);
}

/* cudaGraphLaunch(graphExec, stream) */
static __always_inline int on_cuda_graph_launch_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_GRAPH_LAUNCH, KIND_NONE, 0, PT_REGS_PARM2(ctx), 0);
}

/* cudaMallocHost(void **ptr, size) and cudaHostAlloc(void **ptr, size, flags) */
static __always_inline int on_cuda_malloc_host_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_MALLOC_HOST, KIND_NONE, PT_REGS_PARM2(ctx), 0, 0);
}

/* cudaHostRegister(ptr, size, flags) */
static __always_inline int on_cuda_host_register_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CUDA_HOST_REGISTER, KIND_NONE, PT_REGS_PARM2(ctx), 0, 0);
}

/* ---- driver API (libcuda) --------------------------------------------- */

/* cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sharedMem, hStream, params, extra):
 * f..by fill the six registers; bz, sharedMem, hStream are stack slots 1..3. */
static __always_inline int on_cu_launch_kernel_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_LAUNCH_KERNEL, KIND_NONE, 0, 0, stack_arg_at(ctx, 3));
}

/* cuLaunchKernelEx(const CUlaunchConfig *config, f, params, extra):
 * config = {7 x unsigned int; CUstream hStream; ...}: stream at offset 32. */
static __always_inline int on_cu_launch_kernel_ex_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_LAUNCH_KERNEL, KIND_NONE, 0, 0, PT_REGS_PARM1(ctx) + 32);
}

/* cuGraphLaunch(hGraphExec, hStream) */
static __always_inline int on_cu_graph_launch_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_GRAPH_LAUNCH, KIND_NONE, 0, PT_REGS_PARM2(ctx), 0);
}

/* cuMemcpy*(dst, src, ByteCount): the direction is in the symbol name. */
static __always_inline int on_cu_memcpy_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEMCPY, KIND_DEFAULT, PT_REGS_PARM3(ctx), 0, 0);
}

static __always_inline int on_cu_memcpy_htod_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEMCPY, KIND_H2D, PT_REGS_PARM3(ctx), 0, 0);
}

static __always_inline int on_cu_memcpy_dtoh_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEMCPY, KIND_D2H, PT_REGS_PARM3(ctx), 0, 0);
}

static __always_inline int on_cu_memcpy_dtod_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEMCPY, KIND_D2D, PT_REGS_PARM3(ctx), 0, 0);
}

/* cuMemcpy*Async(dst, src, ByteCount, hStream) */
static __always_inline int on_cu_memcpy_async_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEMCPY_ASYNC, KIND_DEFAULT, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0);
}

static __always_inline int on_cu_memcpy_htod_async_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEMCPY_ASYNC, KIND_H2D, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0);
}

static __always_inline int on_cu_memcpy_dtoh_async_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEMCPY_ASYNC, KIND_D2H, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0);
}

static __always_inline int on_cu_memcpy_dtod_async_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEMCPY_ASYNC, KIND_D2D, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0);
}

static __always_inline int on_cu_ctx_sync_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_CTX_SYNC, KIND_NONE, 0, 0, 0);
}

/* cuStreamSynchronize(hStream) */
static __always_inline int on_cu_stream_sync_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_STREAM_SYNC, KIND_NONE, 0, PT_REGS_PARM1(ctx), 0);
}

/* cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) */
static __always_inline int on_cu_mem_alloc_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEM_ALLOC, KIND_NONE, PT_REGS_PARM2(ctx), 0, 0);
}

static __always_inline int on_cu_mem_free_enter(struct pt_regs *ctx)
{
	return cuda_enter(ctx, OP_CU_MEM_FREE, KIND_NONE, 0, 0, 0);
}
