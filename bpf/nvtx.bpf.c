/* SPDX-License-Identifier: Apache-2.0
 *
 * nvtx.bpf.c - uprobes on ingero's NVTX injection library
 * (ingero/collect/nvtx_inject.c), included by ingero.bpf.c.  The library's
 * NVTX table entries call four empty functions; each entry here reads what
 * that function was passed and emits one struct ingero_nvtx, preceded for a
 * push or start by its message in struct ingero_nvtx_text records
 * (events.h).  Entry probes only: no return to wait for, and nothing kept
 * between probes; ingero/collect/nvtx.py pairs pushes with pops and starts
 * with ends into spans rows.
 *
 * These functions run only in processes that loaded the library (`ingero
 * trace --cmd` sets NVTX_INJECTION64_PATH), a few times per training step:
 * a process that never calls NVTX never reaches a probe here.
 */

/* The message, NVTX_TEXT_PART bytes per text record (part 0 first), then the
 * range record: a reader always meets the text first. */
static __always_inline void nvtx_text(u64 ts, u64 id, const char *buf, u8 part)
{
	struct ingero_nvtx_text *x = (struct ingero_nvtx_text *)event_reserve();
	if (!x)
		return;
	x->ts_ns = ts;
	__builtin_memcpy(x->text, buf + NVTX_TEXT_PART * part, sizeof(x->text));
	x->pid = id >> 32;
	x->tid = id;
	__builtin_memcpy(x->text2, buf + NVTX_TEXT_PART * part + sizeof(x->text), sizeof(x->text2));
	x->op = OP_NVTX_TEXT;
	x->part = part;
	x->cpu = bpf_get_smp_processor_id();
	event_submit((struct ingero_event *)x);
}

static __always_inline int nvtx_emit(u8 op, u64 range_id, const char *message)
{
	EMPTY_RETURN();
	u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id >> 32))
		return 0;
	u64 ts = bpf_ktime_get_ns();
	/* NVTX_TEXT_MAX bytes and the NUL, rounded up to 2 parts; zeroed, so the
	 * bytes after the message are NUL in every text record */
	char buf[2 * NVTX_TEXT_PART] = {};
	u32 len = 0;
	if (message) {
		long n = bpf_probe_read_user_str(buf, NVTX_TEXT_MAX + 1, message);
		if (n > 1)
			len = n - 1;
	}
	if (len > 0)
		nvtx_text(ts, id, buf, 0);
	if (len > NVTX_TEXT_PART)
		nvtx_text(ts, id, buf, 1);
	struct ingero_nvtx *r = (struct ingero_nvtx *)event_reserve();
	if (!r)
		return 0;
	r->ts_ns = ts;
	r->id = range_id;
	r->pad0[0] = r->pad0[1] = 0;
	r->pid = id >> 32;
	r->tid = id;
	r->text_len = len;
	r->pad1 = r->pad2 = 0;
	r->op = op;
	r->pad3 = 0;
	r->cpu = bpf_get_smp_processor_id();
	event_submit((struct ingero_event *)r);
	return 0;
}

/* ingero_nvtx_push(const char *message, uintptr_t domain) */
static __always_inline int on_nvtx_push_enter(struct pt_regs *ctx)
{
	return nvtx_emit(OP_NVTX_PUSH, PT_REGS_PARM2(ctx), (const char *)PT_REGS_PARM1(ctx));
}

/* ingero_nvtx_pop(uintptr_t domain) */
static __always_inline int on_nvtx_pop_enter(struct pt_regs *ctx)
{
	return nvtx_emit(OP_NVTX_POP, PT_REGS_PARM1(ctx), 0);
}

/* ingero_nvtx_start(const char *message, uint64_t id) */
static __always_inline int on_nvtx_start_enter(struct pt_regs *ctx)
{
	return nvtx_emit(OP_NVTX_START, PT_REGS_PARM2(ctx), (const char *)PT_REGS_PARM1(ctx));
}

/* ingero_nvtx_end(uint64_t id) */
static __always_inline int on_nvtx_end_enter(struct pt_regs *ctx)
{
	return nvtx_emit(OP_NVTX_END, PT_REGS_PARM1(ctx), 0);
}
