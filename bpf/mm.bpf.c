/* SPDX-License-Identifier: Apache-2.0
 *
 * mm.bpf.c - user page faults of traced processes.  Included by ingero.bpf.c
 * (maps, attach points).
 * arg = faulting address, ret = the x86 error code (bit 1: write, bit 2: user),
 * call_op / call_flags = the thread's CUDA state at the fault (events.h).
 */

static __always_inline int on_page_fault_user(struct tracepoint__exceptions__page_fault_user *args)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	if (!is_target(tgid))
		return 0;
	struct ingero_event *e = event_reserve();
	if (!e)
		return 0;
	e->ts_ns = bpf_ktime_get_ns();
	e->duration_ns = 0;
	e->arg = args->address;
	e->stream = 0;
	e->pid = tgid;
	e->tid = (u32)id;
	e->other_pid = 0;
	/* bits 0-14 only: ret is 16 bits (events.h); higher bits are SGX / SEV-SNP */
	e->ret = (s16)(args->error_code & 0x7fff);
	struct call_state *c = call_state_here(id, 0);
	e->call_op = c && c->depth ? c->op : OP_NONE;
	e->call_flags = c ? c->flags : 0;
	e->stack_id = -1;
	e->op = OP_PAGE_FAULT;
	e->kind = KIND_NONE;
	e->cpu = bpf_get_smp_processor_id();
	event_submit(e);
	return 0;
}
