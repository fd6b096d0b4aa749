/* SPDX-License-Identifier: Apache-2.0
 *
 * sched.bpf.c - scheduler tracepoints.  Included by ingero.bpf.c, which holds
 * the maps (reached through its accessors) and the attach points.
 *
 * - one OP_SCHED_SWITCH row per off-CPU interval of every traced thread,
 *   emitted at switch-in: ts = switch-out, duration = off-CPU time, kind =
 *   why it left, other_pid = the process that ran next, arg = runqueue
 *   latency (wakeup -> switch-in; the whole interval when preempted);
 * - host-wide per-process totals (struct ingero_proc_stat) harvested by user
 *   space once a second: names the competitors without a row per switch;
 * - targets follow fork, exec (TARGET_COMM) and exit.
 *
 * Plain tracepoints, not raw ones: their fields come from the running
 * kernel's format files, while struct task_struct offsets would come from
 * headers that need not match the running kernel.
 */

/* sched_switch prev_state: 0 (R) or TASK_REPORT_MAX (0x100, "R+") means
 * still runnable, i.e. preempted; 1 = S; 2 = D. */
#define STATE_PREEMPT_BIT 0x100

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

static __always_inline int on_sched_switch(struct tracepoint__sched__sched_switch *args)
{
	u64 now = bpf_ktime_get_ns();
	u64 id = bpf_get_current_pid_tgid();
	u32 prev_tgid = id >> 32;
	u32 prev_tid = args->prev_pid;
	u32 next_tid = args->next_pid;
	u8 kind = switch_kind(args->prev_state);

	u32 next_tgid = next_tid;
	u32 *known = tid_tgid_get(&next_tid);
	if (known)
		next_tgid = *known;

	if (prev_tid != 0) { /* tid 0 is the idle task */
		u32 *mapped = tid_tgid_get(&prev_tid);
		if (!mapped || *mapped != prev_tgid) /* an LRU update costs far more than a lookup */
			tid_tgid_put(&prev_tid, &prev_tgid);
		struct ingero_proc_stat *ps = proc_stat(prev_tgid, args->prev_comm);
		u64 *since = oncpu_since_get();
		if (ps) {
			if (since && *since && now > *since)
				__sync_fetch_and_add(&ps->oncpu_ns, now - *since);
			if (kind == KIND_PREEMPTED)
				__sync_fetch_and_add(&ps->involuntary, 1);
			else
				__sync_fetch_and_add(&ps->voluntary, 1);
		}
	}
	u64 *since = oncpu_since_get();
	if (since)
		*since = now;

	if (prev_tid != 0 && is_target(prev_tgid)) {
		struct offcpu_state s = {};
		s.ts = now;
		s.wake_ts = kind == KIND_PREEMPTED ? now : 0; /* runnable all along */
		s.tgid = prev_tgid;
		s.other_pid = next_tid ? next_tgid : 0;
		s.stack_id = ingero_stack_id(args);
		s.cpu = bpf_get_smp_processor_id();
		s.kind = kind;
		offcpu_put(&prev_tid, &s);
		if (kind == KIND_PREEMPTED && next_tid != 0) {
			struct ingero_proc_stat *np = proc_stat(next_tgid, args->next_comm);
			if (np)
				__sync_fetch_and_add(&np->preempted_traced, 1);
		}
	}

	if (next_tid == 0)
		return 0;
	struct offcpu_state *s = offcpu_get(&next_tid);
	if (!s)
		return 0;
	struct ingero_event *e = event_reserve();
	if (e) {
		e->ts_ns = s->ts;
		e->duration_ns = now - s->ts;
		e->arg = s->wake_ts && now > s->wake_ts ? now - s->wake_ts : 0;
		e->stream = 0;
		e->pid = s->tgid;
		e->tid = next_tid;
		e->other_pid = s->other_pid;
		e->ret = 0;
		e->stack_id = s->stack_id;
		e->op = OP_SCHED_SWITCH;
		e->kind = s->kind;
		e->cpu = s->cpu;
		event_submit(e);
	}
	offcpu_del(&next_tid);
	return 0;
}

static __always_inline int on_wakeup(u32 tid)
{
	struct offcpu_state *s = offcpu_get(&tid);
	if (s && s->wake_ts == 0)
		s->wake_ts = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_sched_wakeup(struct tracepoint__sched__sched_wakeup *args)
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
	offcpu_del(&tid); /* call state is task storage: freed with the task */
	tid_tgid_del(&tid);
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
