/* SPDX-License-Identifier: Apache-2.0
 *
 * sched.bpf.c - scheduler tracepoints.  Included by ingero.bpf.c, which holds
 * the maps (reached through its accessors) and the attach points.
 *
 * - one OP_SCHED_SWITCH row per off-CPU interval of every traced thread,
 *   emitted at switch-in: ts = switch-out, duration = off-CPU time, kind =
 *   why it left, other_pid = the process that ran next (preempted) or, woken,
 *   the one it waited behind for a CPU (blocked), arg = runqueue
 *   latency (wakeup -> switch-in; the whole interval when preempted), and
 *   what it waited for: the system call it blocked in and its fd, and who
 *   woke it (the task running sched_waking: the waker, or whatever an
 *   interrupt interrupted); the packing is in events.h;
 * - host-wide per-process totals (struct ingero_proc_stat) harvested by user
 *   space once a second: names the competitors without a row per switch;
 * - targets follow fork, exec (TARGET_COMM) and exit.
 *
 * Plain tracepoints, not raw ones: their fields come from the running
 * kernel's format files, while struct task_struct offsets would come from
 * headers that need not match the running kernel.
 */

/* sched_switch prev_state: 0 (R) or TASK_REPORT_MAX (0x100, "R+") means
 * still runnable, i.e. preempted; 1 = S; 2 = D; 0x10 (X) or 0x20 (Z): the
 * thread's last switch-out (it has exited). */
#define STATE_PREEMPT_BIT 0x100
#define STATE_EXITED_BITS 0x30

static __always_inline u8 switch_kind(long state)
{
	if (state == 0 || (state & STATE_PREEMPT_BIT))
		return KIND_PREEMPTED;
	if (state & 2)
		return KIND_IO;
	if (state & 1)
		return KIND_SLEEP;
	return KIND_OTHER_STATE;
}

static __always_inline struct ingero_proc_stat *proc_stat(u32 tgid, const char *comm)
{
	struct ingero_proc_stat *ps = proc_stats_get(&tgid);
	if (ps)
		return ps;
	struct ingero_proc_stat zero = {};
	bpf_probe_read_kernel(&zero.comm, sizeof(zero.comm), comm);
	proc_stats_put(&tgid, &zero);
	return proc_stats_get(&tgid);
}

/* An interval the budget counts (t->counted): added to the thread's
 * switch_counts entry.  0 when the map is full (the caller stores a row). */
static __always_inline int count_off_cpu(struct thread_state *t, u32 tid, u64 end, u64 runq_ns)
{
	struct ingero_switch_count *c = switch_counts_get(&tid);
	if (!c) {
		struct ingero_switch_count zero = {};
		zero.tgid = t->tgid;
		switch_counts_add(&tid, &zero);
		c = switch_counts_get(&tid);
		if (!c) {
			count(CNT_SWITCH_COUNTS_FULL);
			return 0;
		}
	}
	u32 k = (u32)(t->kind - KIND_PREEMPTED) & 3; /* KIND_PREEMPTED .. KIND_OTHER_STATE */
	/* Only this thread's switch-in adds here (one CPU at a time); user space reads totals. */
	c->n[k] += 1;
	c->off_ns[k] += end - t->ts;
	c->runq_ns[k] += runq_ns;
	return 1;
}

/* The row of a thread's off-CPU interval [t->ts, end): runq_ns is its wait for a CPU
 * (or its count, when the budget counts this thread's intervals). */
static __always_inline void emit_off_cpu(struct thread_state *t, u32 tid, u64 end, u64 runq_ns)
{
	if (t->counted && count_off_cpu(t, tid, end, runq_ns))
		return;
	struct ingero_event *e = event_reserve();
	if (!e)
		return;
	e->ts_ns = t->ts;
	e->duration_ns = end - t->ts;
	e->arg = (runq_ns & ((1ULL << SWITCH_RUNQ_BITS) - 1)) | ((u64)t->wait_fd << SWITCH_RUNQ_BITS);
	e->stream = t->waker;
	e->pid = t->tgid;
	e->tid = tid;
	e->other_pid = t->other_pid;
	e->ret = t->wait_nr;
	e->call_op = t->call_op;
	e->call_flags = t->call_flags;
	e->stack_id = t->stack_id;
	e->op = OP_SCHED_SWITCH;
	e->kind = t->kind;
	e->cpu = t->cpu;
	event_submit(e);
}

/* A traced thread leaves the CPU: the interval starts.  Filled in place in
 * its entry (ts last: a wakeup only touches an entry marked off CPU).
 *
 * An entry still marked off CPU means the thread came back on without a
 * switch this program saw.  On this project's VMs that happens about once a
 * trace, ~1.3 s after it starts, on one CPU: for 1.4-2 ms neither this
 * program nor sched_wakeup's ran there (4 threads x 500 naps of 2 ms: 1-3
 * sleeps a run, each counted by the kernel's nvcsw; the cause is not known,
 * and the start-up calibration is not it).  The interval is still a row,
 * ended where the thread was woken (runq unknown: 0), else at its switch-out
 * (zero-length: the sleep is counted, its length is not known), and counted
 * (CNT_UNSEEN_SWITCH_IN): overwriting it lost the row.  The entry is marked
 * on CPU before anything else is written, so a wakeup on another CPU meanwhile
 * cannot stamp the new interval with a wake time before its start. */
static __always_inline void close_unseen(struct thread_state *t, u32 tid, u64 now)
{
	if (!t->ts)
		return;
	emit_off_cpu(t, tid, t->wake_ts > t->ts && t->wake_ts <= now ? t->wake_ts : t->ts, 0);
	t->ts = 0;
	asm volatile("" ::: "memory");
	count(CNT_UNSEEN_SWITCH_IN);
}

static __always_inline void switch_out(struct tracepoint__sched__sched_switch *args, struct thread_state *t,
				       struct thread_slot *slot, u32 next_tid, u32 next_tgid, u8 kind, u64 now)
{
	close_unseen(t, args->prev_pid, now);
	t->wake_ts = kind == KIND_PREEMPTED ? now : 0; /* runnable all along */
	t->waker = 0;
	t->wait_nr = -1;
	t->wait_fd = 0;
	/* The thread leaving is the current task: its CUDA state (in its slot;
	 * for a thread without one, in task storage, never created here) says
	 * which call it is blocked in, and whether device work it issued may
	 * still be running. */
	struct call_state *c = slot ? &slot->cs : inflight_here(0);
	/* Over budget, a thread that has made no traced CUDA call is counted, not
	 * stored (BUDGET_COUNT_SWITCHES): no system call or stack is read for it
	 * (the rest is kept for a row should its count find the map full). */
	t->counted = !(c && (c->flags & CALL_FLAG_SEEN)) && (budget_flags() & BUDGET_COUNT_SWITCHES);
	if (kind != KIND_PREEMPTED && !t->counted) {
		/* What it blocks in: the system call (the kernel's own pt_regs of the
		 * task, through helpers, so no struct offset comes from headers that
		 * need not match the running kernel), and its first argument. */
		long nr = -1;
		unsigned long a0 = 0;
#ifdef CONFIG_X86_64
		struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
		bpf_probe_read_kernel(&nr, sizeof(nr), &regs->orig_ax);
		bpf_probe_read_kernel(&a0, sizeof(a0), &regs->di);
#endif
		t->wait_nr = nr >= 0 && nr < 0x7FFF ? nr : -1;
		t->wait_fd = t->wait_nr >= 0 ? ((u32)a0 + 1) & SWITCH_FD_MASK : 0;
	}
	t->other_pid = next_tid ? next_tgid : 0;
	t->stack_id = t->counted ? -1 : ingero_stack_id(args);
	t->cpu = bpf_get_smp_processor_id();
	t->kind = kind;
	t->call_op = c && c->depth ? c->op : OP_NONE;
	t->call_flags = c ? c->flags : 0;
	t->ts = now;
	if (kind == KIND_PREEMPTED && next_tid != 0) {
		struct ingero_proc_stat *np = proc_stat(next_tgid, args->next_comm);
		if (np)
			__sync_fetch_and_add(&np->preempted_traced, 1);
	}
}

/* A thread comes back on the CPU: one row for the interval it was off, if
 * its switch-out was seen while traced.  A blocked interval's other_pid: the
 * process it waited behind once woken (the task leaving the CPU now; 0 when
 * it waited for none).  One value and no scan of what else ran meanwhile: a
 * loop over the CPU's recent slices here took the verifier from 0.78 M to
 * 0.97-1 M of its 1 M instructions with --stack. */
static __always_inline void switch_in(struct thread_state *t, u32 next_tid, u64 now)
{
	if (!t->ts)
		return;
	u64 runq = t->wake_ts && now > t->wake_ts ? now - t->wake_ts : 0;
	if (t->kind != KIND_PREEMPTED) /* the current task is the one leaving (the idle task: tgid 0) */
		t->other_pid = runq ? bpf_get_current_pid_tgid() >> 32 : 0;
	emit_off_cpu(t, next_tid, now, runq);
	t->ts = 0; /* on CPU */
}

/* Per switch: the clock, the switching-out process's totals (a hash lookup),
 * its thread slot (claimed once; its call state is there too), the cached
 * target answer, the next thread's slot and, at switch-in, one ring record.  Per run (kernel.bpf_stats_enabled,
 * pinned ping-pong of two traced processes, 4 interleaved rounds x 3 runs):
 * ~490 ns with separate tid -> tgid and off-CPU maps, ~245 ns with one LRU
 * hash entry per thread, ~203 ns with thread slots; sched_wakeup 132 -> 100
 * ns.  The empty program at the same tracepoint: ~43 ns.  Of what is left,
 * the clock read alone is ~55 ns (bpf_ktime_get_ns: an lfence'd rdtsc behind
 * a retpolined call on this VM). */
static __always_inline int on_sched_switch(struct tracepoint__sched__sched_switch *args)
{
	u64 now = bpf_ktime_get_ns();
	u32 prev_tid = args->prev_pid;
	u32 next_tid = args->next_pid;

	u64 *since = oncpu_since_get(); /* per CPU: when the task now leaving came on */
	u64 was = 0;
	if (since) {
		was = *since;
		*since = now;
	}

	struct thread_state *prev = 0;
	struct thread_slot *slot = 0;
	u8 kind = 0;
	if (prev_tid != 0) { /* tid 0 is the idle task */
		u64 prev_id = bpf_get_current_pid_tgid(); /* prev is current */
		u32 prev_tgid = prev_id >> 32;
		kind = switch_kind(args->prev_state);
		struct ingero_proc_stat *ps = proc_stat(prev_tgid, args->prev_comm);
		if (ps) {
			if (was && now > was)
				__sync_fetch_and_add(&ps->oncpu_ns, now - was);
			if (kind == KIND_PREEMPTED)
				__sync_fetch_and_add(&ps->involuntary, 1);
			else
				__sync_fetch_and_add(&ps->voluntary, 1);
		}
		if (args->prev_state & STATE_EXITED_BITS) {
			/* never back: no new interval; one whose end went unseen is still a row */
			struct thread_state *gone = thread_find(prev_tid);
			if (gone)
				close_unseen(gone, prev_tid, now);
			thread_forget(prev_tid);
		} else
			prev = current_thread(prev_id, &slot);
		if (prev && !is_target_cached(prev_tgid, &prev->traced))
			prev = 0;
	}
	/* after current_thread(): its update may recycle an LRU element */
	struct thread_state *next = next_tid ? thread_find(next_tid) : 0;
	if (prev)
		switch_out(args, prev, slot, next_tid, next ? next->tgid : next_tid, kind, now);
	if (next)
		switch_in(next, next_tid, now);
	return 0;
}

/* Who runs this wakeup: the current task when it is in a system call that
 * wakes others (a futex wake, a write or send to a pipe or socket, a signal,
 * an exit that wakes a joiner), else 0: an interrupt -- a timer, a disk or
 * network completion -- that ran in whatever task it interrupted (a user-mode
 * task, a task in an unrelated call, a kernel thread, the idle task).
 * x86-64 numbers (arch/x86/entry/syscalls/syscall_64.tbl). */
static __always_inline u64 waker_id(void)
{
	u64 id = bpf_get_current_pid_tgid();
#ifdef CONFIG_X86_64
	long nr = -1;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	bpf_probe_read_kernel(&nr, sizeof(nr), &regs->orig_ax);
	switch (nr) {
	case 1: case 18: case 20: case 296: case 328: /* write, pwrite64, writev, pwritev, pwritev2 */
	case 0: case 17: case 19: case 295: case 327: /* read, pread64, readv, preadv, preadv2: a reader frees a full pipe's writer */
	case 45: case 47: case 299: /* recvfrom, recvmsg, recvmmsg: the same for a socket's */
	case 44: case 46: case 307: case 48: /* sendto, sendmsg, sendmmsg, shutdown */
	case 3: case 60: case 231: /* close, exit, exit_group (a joiner's futex) */
	case 62: case 200: case 234: case 129: case 297: /* kill, tkill, tgkill, rt_(tg)sigqueueinfo */
	case 202: case 449: /* futex, futex_waitv */
	case 65: case 220: case 69: case 242: /* semop, semtimedop, msgsnd, mq_timedsend */
	case 275: case 278: case 40: case 426: /* splice, vmsplice, sendfile, io_uring_enter */
	case 56: case 435: case 61: case 247: /* clone, clone3, wait4, waitid */
		return id;
	default:
		return 0;
	}
#else
	return id;
#endif
}

/* Woken: its runqueue wait starts now.  Only an entry marked off CPU counts
 * (a thread woken before its switch-out completed keeps no wake time).
 * sched_waking, not sched_wakeup: it runs in the waker's context on the
 * waker's CPU, where sched_wakeup of a remote wakeup runs on the target CPU
 * in whatever task its IPI interrupted. */
static __always_inline int on_wakeup(u32 tid)
{
	struct thread_state *t = thread_find(tid);
	if (t && t->ts && t->wake_ts == 0) {
		t->wake_ts = bpf_ktime_get_ns();
		if (!t->counted) /* a count keeps no waker */
			t->waker = waker_id() | SWITCH_WAKER_SEEN;
	}
	return 0;
}

static __always_inline int on_sched_waking(struct tracepoint__sched__sched_waking *args)
{
	return on_wakeup(args->pid);
}

static __always_inline int on_sched_wakeup_new(struct tracepoint__sched__sched_wakeup_new *args)
{
	return on_wakeup(args->pid);
}

static __always_inline void emit_proc(u8 op, u32 tgid, u32 tid, u32 other)
{
	struct ingero_event *e = event_reserve();
	if (!e)
		return;
	e->ts_ns = bpf_ktime_get_ns();
	e->duration_ns = 0;
	e->arg = 0;
	e->stream = 0;
	e->pid = tgid;
	e->tid = tid;
	e->other_pid = other;
	e->ret = 0;
	e->call_op = OP_NONE;
	e->call_flags = 0;
	e->stack_id = -1;
	e->op = op;
	e->kind = KIND_NONE;
	e->cpu = bpf_get_smp_processor_id();
	event_submit(e);
}

/* Children of targets are targets.  The tracepoint fires for new threads
 * too (child_pid is then a tid): that key is harmless and removed when the
 * thread exits. */
static __always_inline int on_sched_process_fork(struct tracepoint__sched__sched_process_fork *args)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_target(tgid))
		return 0;
	add_target(args->child_pid);
	return 0;
}

static __always_inline int on_sched_process_exec(struct tracepoint__sched__sched_process_exec *args)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	/* The name taken at the first switch-out may be the pre-exec one
	 * (a forked shell or interpreter): refresh it. */
	struct ingero_proc_stat *ps = proc_stats_get(&tgid);
	if (ps)
		bpf_get_current_comm(&ps->comm, sizeof(ps->comm));
	if (!is_target(tgid)) {
#ifdef TARGET_COMM
		if (!comm_matches())
			return 0;
		add_target(tgid);
#else
		return 0;
#endif
	}
	emit_proc(OP_PROC_EXEC, tgid, (u32)id, args->old_pid);
	return 0;
}

static __always_inline int on_sched_process_exit(struct tracepoint__sched__sched_process_exit *args)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	u32 tid = (u32)id;
	thread_forget(tid); /* call state is task storage: freed with the task */
	if (tid != tgid) {
		del_target(tid); /* a thread key added at fork */
		return 0;
	}
	if (is_target(tgid)) {
		emit_proc(OP_PROC_EXIT, tgid, tid, 0);
		del_target(tgid);
	}
	return 0;
}
