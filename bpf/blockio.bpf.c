/* SPDX-License-Identifier: Apache-2.0
 *
 * blockio.bpf.c - block requests of every process, issue -> complete.
 * Included by ingero.bpf.c (maps, attach points).  One row per request: pid = the process that
 * issued it (at issue time), arg = bytes, duration = device latency,
 * other_pid = dev_t, ret = error, kind = read/write/flush/discard from rwbs.
 */

/* rwbs is "[F]<R|W|D|N>[F][A][S][M]": a leading F is a preflush. */
static __always_inline u8 rwbs_kind(const char *rwbs)
{
	char c = rwbs[0];
	if (c == 'F') {
		c = rwbs[1];
		if (c != 'R' && c != 'W' && c != 'D')
			return KIND_FLUSH;
	}
	if (c == 'R')
		return KIND_READ;
	if (c == 'W')
		return KIND_WRITE;
	if (c == 'D')
		return KIND_DISCARD;
	return KIND_NONE;
}

static __always_inline int on_block_rq_issue(struct tracepoint__block__block_rq_issue *args)
{
	u64 id = bpf_get_current_pid_tgid();
	struct rq_key k = {};
	k.sector = args->sector;
	k.dev = args->dev;
	char rwbs[4] = {};
	bpf_probe_read_kernel(&rwbs, sizeof(rwbs), args->rwbs);
	struct rq_state s = {};
	s.ts = bpf_ktime_get_ns();
	s.bytes = args->bytes;
	s.tgid = id >> 32;
	s.tid = (u32)id;
	s.kind = rwbs_kind(rwbs);
	block_rqs_put(&k, &s);
	return 0;
}

static __always_inline int on_block_rq_complete(struct tracepoint__block__block_rq_complete *args)
{
	struct rq_key k = {};
	k.sector = args->sector;
	k.dev = args->dev;
	struct rq_state *s = block_rqs_get(&k);
	if (!s)
		return 0;
	u64 now = bpf_ktime_get_ns();
	struct ingero_event *e = event_reserve();
	if (e) {
		e->ts_ns = s->ts;
		e->duration_ns = now - s->ts;
		e->arg = s->bytes;
		e->stream = 0;
		e->pid = s->tgid;
		e->tid = s->tid;
		e->other_pid = k.dev;
		e->ret = args->error;
		e->stack_id = -1;
		e->call_op = 0; /* ring memory is not zeroed */
		e->call_flags = 0;
		e->op = OP_BLOCK_IO;
		e->kind = s->kind;
		e->cpu = bpf_get_smp_processor_id();
		event_submit(e);
	}
	block_rqs_del(&k);
	return 0;
}
