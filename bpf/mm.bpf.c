/* SPDX-License-Identifier: Apache-2.0
 *
 * mm.bpf.c - user page faults of traced processes.  Included by ingero.bpf.c
 * (maps, attach points).
 * arg = faulting address, ret = the x86 error code (bit 1: write, bit 2: user).
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
	e->ret = (s32)args->error_code;
	e->stack_id = -1;
	e->op = OP_PAGE_FAULT;
	e->kind = KIND_NONE;
	e->cpu = bpf_get_smp_processor_id();
	event_submit(e);
	return 0;
}
