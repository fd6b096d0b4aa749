/* Test-only harness for bpf/stack.h: proves --stack on its own, without the
 * trace pipeline.  One uprobe handler (attached by the tests to any function,
 * e.g. libcudart's cudaMalloc) and sched_switch for the tgids in
 * harness_pids; both emit struct ingero_event with stack_id filled. */
#include <uapi/linux/ptrace.h>
#include "events.h"
#include "stack.h"

BPF_RINGBUF_OUTPUT(harness_events, 256);
BPF_HASH(harness_pids, u32, u8, 64);

static __always_inline void harness_emit(void *ctx, u8 op, u8 kind, u32 tgid, u32 tid)
{
	struct ingero_event *e = harness_events.ringbuf_reserve(sizeof(*e));
	if (!e)
		return;
	e->duration_ns = 0;
	e->arg = 0;
	e->stream = 0;
	e->other_pid = 0;
	e->ret = 0;
	e->ts_ns = bpf_ktime_get_ns();
	e->pid = tgid;
	e->tid = tid;
	e->op = op;
	e->kind = kind;
	e->cpu = bpf_get_smp_processor_id();
	e->stack_id = ingero_stack_id(ctx);
	harness_events.ringbuf_submit(e, 0);
}

int harness_uprobe(struct pt_regs *ctx)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tgid = pid_tgid >> 32;
	if (!harness_pids.lookup(&tgid))
		return 0;
	harness_emit(ctx, OP_CUDA_MALLOC, KIND_NONE, tgid, (u32)pid_tgid);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_switch)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tgid = pid_tgid >> 32;
	if (!harness_pids.lookup(&tgid))
		return 0;
	/* prev_state 0 (or the TASK_REPORT_MAX bit) = still runnable. */
	long state = args->prev_state;
	if (state != 0 && !(state & 0x100))
		return 0;
	harness_emit(args, OP_SCHED_SWITCH, KIND_PREEMPTED, tgid, (u32)pid_tgid);
	return 0;
}
