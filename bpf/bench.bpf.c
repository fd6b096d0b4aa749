/* SPDX-License-Identifier: Apache-2.0
 *
 * bench.bpf.c - record generator for bench/bench_ingest.py.  Included by
 * ingero.bpf.c when compiled with -DINGERO_BENCH (and nothing else is).
 *
 * Each getppid() of BENCH_PID emits BENCH_BURST records into the same ring
 * buffer and with the same reserve/submit path as the real probes, so the
 * benchmark measures the real user-space reader, decoder and store.
 */
#ifndef BENCH_PID
#define BENCH_PID 0
#endif
#ifndef BENCH_BURST
#define BENCH_BURST 32 /* records per syscall: keeps the generator's syscall cost small */
#endif

static __always_inline int on_sys_enter_getppid(struct tracepoint__syscalls__sys_enter_getppid *args)
{
	u64 id = bpf_get_current_pid_tgid();
	if ((id >> 32) != BENCH_PID)
		return 0;
	u64 now = bpf_ktime_get_ns();
	u32 cpu = bpf_get_smp_processor_id();
#pragma unroll
	for (int i = 0; i < BENCH_BURST; i++) {
		struct ingero_event *e = event_reserve();
		if (!e)
			continue; /* each lost record counted (event_reserve), not one per burst */
		e->ts_ns = now + i;
		e->duration_ns = 1000 + i;
		e->arg = 4096;
		e->stream = 0;
		e->pid = id >> 32;
		e->tid = (u32)id;
		e->other_pid = 0;
		e->ret = 0;
		e->stack_id = -1;
		e->call_op = 0; /* ring memory is not zeroed */
		e->call_flags = 0;
		e->op = OP_BENCH;
		e->kind = KIND_NONE;
		e->cpu = cpu;
		event_submit(e);
	}
	return 0;
}
