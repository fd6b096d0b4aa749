/* SPDX-License-Identifier: Apache-2.0
 *
 * sample.bpf.c - a low-rate CPU sampler of the traced threads (--stack).
 * Included by ingero.bpf.c (which holds the maps) when compiled with
 * INGERO_SAMPLE; user space (ingero/collect/loader.py) attaches the
 * `cpu_sample` program to a software cpu-clock perf event on every CPU at
 * SAMPLE_HZ (~99 Hz: off the kernel's 100/250/1000 Hz ticks, so the samples
 * do not lock step with periodic work).
 *
 * Each sample that interrupts a thread of a target process is one
 * OP_CPU_SAMPLE record: ts = the sample, duration = the sampling period (so
 * sum(duration_ns) estimates CPU time), stack_id = the thread's call site
 * (bpf/stack.h: its Python frames), call_op / call_flags = its CUDA call
 * state, as sched_switch and page_fault carry it (the call it was inside;
 * whether device work it queued since its last sync may still run).  Any
 * other task (another process, the idle task) costs one lookup and no record.
 *
 * Cost: the program runs SAMPLE_HZ times per second per CPU; a sample of a
 * traced Python thread walks its frames (3 user reads per frame, stack.h).
 * Measured in docs/rules.md ("host-bound").
 */

#ifndef SAMPLE_PERIOD_NS
#define SAMPLE_PERIOD_NS 10101010 /* 1 s / 99 */
#endif

static __always_inline int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, tgid = id >> 32;
	if (tid == 0)
		return 0; /* the idle task */
	/* The thread's slot holds its cached "is a target" answer and its call
	 * state; a thread whose slot another owns asks the targets map. */
	struct thread_slot *slot = slot_of(tid);
	struct call_state *c = 0;
	if (slot && slot->owner == id) {
		if (!is_target_cached(tgid, &slot->st.traced))
			return 0;
		c = &slot->cs;
	} else {
		if (!is_target(tgid))
			return 0;
		c = inflight_here(0);
	}
	/* the walk before the claim: a claimed slot holds up the reader until submitted */
	s32 stack_id = ingero_stack_id(ctx);
	struct ingero_event *e = event_reserve();
	if (!e)
		return 0;
	e->ts_ns = bpf_ktime_get_ns();
	e->duration_ns = SAMPLE_PERIOD_NS;
	e->arg = 0;
	e->stream = 0;
	e->pid = tgid;
	e->tid = tid;
	e->other_pid = 0;
	e->ret = 0;
	e->call_op = c && c->depth ? c->op : OP_NONE;
	e->call_flags = c ? c->flags : 0;
	e->stack_id = stack_id;
	e->op = OP_CPU_SAMPLE;
	e->kind = KIND_NONE;
	e->cpu = bpf_get_smp_processor_id();
	event_submit(e);
	return 0;
}
