/* SPDX-License-Identifier: Apache-2.0
 *
 * attach.bpf.c - hold a process that is about to map CUDA until its probes are in.
 * Included by ingero.bpf.c (with INGERO_HOLDS), which holds the maps (reached
 * through its accessors) and the attach points.
 *
 * A uprobe is attached to a file, so a library nobody had mapped when the
 * trace began (a dlopen'd libnccl, a venv's libcudart, a program with the
 * runtime linked in) can only be probed once user space has seen it: the
 * calls it makes before then are lost.  So the thread that maps such a file's
 * code is stopped as the mmap returns, before it runs another instruction:
 *
 *   - sys_enter_open(at): the path, read from the caller; kept (per thread)
 *     when its base name starts like a CUDA / NCCL library (libcudart*,
 *     libcuda.so*, libnccl*) and this (cgroup, path) was not looked at yet;
 *   - sys_exit_open(at): the open succeeded: the descriptor is remembered;
 *   - sys_enter_mmap of that descriptor with PROT_EXEC (ld.so mapping the
 *     code; a program that only reads the file, a tracer, a copy, is never
 *     stopped): SIGSTOP to the thread (the whole process stops as the mmap
 *     returns) and one struct ingero_hold to user space, which attaches the
 *     file and sends SIGCONT (ingero/collect/holds.py; a bound caps the wait);
 *   - sys_enter_execve / sys_exit_execve: the same for a program a traced
 *     process execs (explicit targets only: the default mode looks at a new
 *     program without stopping it).
 *
 * Not stopped (HOLD_NOSTOP; user space attaches at once all the same): a
 * child of an interactive shell, which would see the stop and suspend the
 * job (task_newtask marks the children of the shells user space lists).
 */

#define HOLD_SIGSTOP 19
#define HOLD_CLONE_THREAD 0x00010000ULL
#define HOLD_PENDING_OPEN (1ULL << 32)
#define HOLD_PENDING_EXEC (2ULL << 32)
#define HOLD_PROT_EXEC 0x4

/* The base name starts with one of the library prefixes.  The scan buffer is
 * twice the path, so base + i masked stays inside it whatever base is. */
#define HOLD_CH(i, c) (p[(base + (i)) & (2 * HOLD_PATH_MAX - 1)] == (c))

static __always_inline int hold_name_wanted(const char *p, int n)
{
	/* the last '/', found from the end (n counts the NUL): the loop ends at
	 * the first one, so the verifier follows one path per length, not 2^n */
	u32 base = 0;
	for (int i = 0; i < HOLD_PATH_MAX; i++) {
		int j = n - 2 - i;
		if (j < 0)
			break;
		if (p[j & (HOLD_PATH_MAX - 1)] == '/') {
			base = j + 1;
			break;
		}
	}
	if (!(HOLD_CH(0, 'l') && HOLD_CH(1, 'i') && HOLD_CH(2, 'b')))
		return 0;
	if (HOLD_CH(3, 'n') && HOLD_CH(4, 'c') && HOLD_CH(5, 'c') && HOLD_CH(6, 'l'))
		return 1; /* libnccl* */
	if (!(HOLD_CH(3, 'c') && HOLD_CH(4, 'u') && HOLD_CH(5, 'd') && HOLD_CH(6, 'a')))
		return 0;
	if (HOLD_CH(7, 'r') && HOLD_CH(8, 't'))
		return 1; /* libcudart* */
	return HOLD_CH(7, '.') && HOLD_CH(8, 's') && HOLD_CH(9, 'o'); /* libcuda.so* */
}

static __always_inline int hold_enabled(u32 tgid)
{
	struct ingero_hold_cfg *cfg = hold_cfg_get();
	return cfg && cfg->enabled && cfg->tracer_tgid != tgid;
}

/* At a syscall's entry: keep the path for its exit if it may need a hold. */
static __always_inline void hold_enter(const char *filename, u8 kind)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	if (!hold_enabled(tgid))
		return;
#if !TRACE_ALL_CUDA
	/* (with --comm a process becomes a target during its exec: asked again at the exit) */
#ifdef TARGET_COMM
	if (kind != HOLD_EXEC && !is_target(tgid))
#else
	if (!is_target(tgid))
#endif
		return;
#endif
	struct hold_scan *s = hold_scratch_get();
	if (!s)
		return;
	/* the key is hashed whole, and the name match may read past the path's end:
	 * no byte of an earlier path may be left behind */
	__builtin_memset(s, 0, sizeof(*s));
	s->key.cgroup = bpf_get_current_cgroup_id();
	int n = bpf_probe_read_user_str(s->key.path, sizeof(s->key.path), filename);
	if (n <= 0)
		return;
	if (kind == HOLD_OPEN && !hold_name_wanted((const char *)s->key.path, n))
		return;
	if (hold_known_get(&s->key))
		return;
	/* an exec is found again by tgid: a non-leader thread's exec takes the leader's tid */
	u64 slot = kind == HOLD_OPEN ? (HOLD_PENDING_OPEN | (u32)id) : (HOLD_PENDING_EXEC | tgid);
	hold_pending_put(&slot, &s->key);
}

/* Stop the calling thread (as it returns to user space) and tell user space. */
static __always_inline void hold_now(u32 tgid, u32 tid, struct ingero_hold_key *key, u8 kind, s32 fd)
{
	struct ingero_hold *h = hold_reserve();
	if (!h)
		return; /* the ring is full: nobody would be told, so nothing is stopped */
	h->ts_ns = bpf_ktime_get_ns();
	h->tgid = tgid;
	h->tid = tid;
	h->fd = fd;
	h->kind = kind;
	h->pad[0] = 0;
	h->pad[1] = 0;
	__builtin_memcpy(&h->key, key, sizeof(h->key));
	u8 flags = 0;
	int stop = 1;
#if TRACE_ALL_CUDA
	if (kind == HOLD_EXEC)
		stop = 0; /* every program on the host: looked at, never stopped */
#endif
	if (stop && hold_nostop_get(&tgid)) {
		stop = 0;
		flags |= HOLD_NOSTOP;
	}
	if (stop) {
		/* listed before the signal: a tracer that dies now leaves it to the guard to resume */
		u64 ts = h->ts_ns;
		held_put(&tgid, &ts);
		if (bpf_send_signal_thread(HOLD_SIGSTOP) == 0)
			flags |= HOLD_STOPPED;
		else
			held_del(&tgid);
	}
	h->flags = flags;
	hold_submit(h);
}

/* At an open's exit: a kept path that opened is remembered by its descriptor
 * until it is mapped executable (a reader never maps it so: not held). */
static __always_inline void hold_open_exit(long ret)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	u64 slot = HOLD_PENDING_OPEN | (u32)id;
	struct ingero_hold_key *key = hold_pending_get(&slot);
	if (ret < 0) {
		if (key)
			hold_pending_del(&slot);
		return;
	}
	if (!key && !hold_enabled(tgid))
		return;
	u64 fd_slot = ((u64)tgid << 32) | (u32)ret;
	if (!key) {
		hold_fds_del(&fd_slot); /* the number reused for another file */
		return;
	}
	hold_fds_put(&fd_slot, key);
	hold_pending_del(&slot);
}

/* mmap of a remembered descriptor with PROT_EXEC: ld.so mapping the library's
 * code (dlopen, or the program's own link map).  The thread stops as the mmap
 * returns, before the library's initialisers and any call into it. */
static __always_inline void hold_mmap(u64 prot, long fd)
{
	if (!(prot & HOLD_PROT_EXEC) || fd < 0)
		return;
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	u64 fd_slot = ((u64)tgid << 32) | (u32)fd;
	struct ingero_hold_key *key = hold_fds_get(&fd_slot);
	if (!key)
		return;
	if (hold_enabled(tgid))
		hold_now(tgid, (u32)id, key, HOLD_OPEN, (s32)fd);
	hold_fds_del(&fd_slot);
}

/* At an exec's exit: a successful exec of a kept path is held. */
static __always_inline void hold_exec_exit(long ret)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	u64 slot = HOLD_PENDING_EXEC | tgid;
	struct ingero_hold_key *key = hold_pending_get(&slot);
	if (!key)
		return;
	int drop = ret < 0 || !hold_enabled(tgid);
#if !TRACE_ALL_CUDA
	drop = drop || !is_target(tgid);
#endif
	if (!drop)
		hold_now(tgid, (u32)id, key, HOLD_EXEC, -1);
	hold_pending_del(&slot);
}

static __always_inline int on_sys_enter_openat(struct tracepoint__syscalls__sys_enter_openat *args)
{
	hold_enter((const char *)args->filename, HOLD_OPEN);
	return 0;
}

static __always_inline int on_sys_exit_openat(struct tracepoint__syscalls__sys_exit_openat *args)
{
	hold_open_exit(args->ret);
	return 0;
}

static __always_inline int on_sys_enter_open(struct tracepoint__syscalls__sys_enter_open *args)
{
	hold_enter((const char *)args->filename, HOLD_OPEN);
	return 0;
}

static __always_inline int on_sys_exit_open(struct tracepoint__syscalls__sys_exit_open *args)
{
	hold_open_exit(args->ret);
	return 0;
}

static __always_inline int on_sys_enter_mmap(struct tracepoint__syscalls__sys_enter_mmap *args)
{
	hold_mmap(args->prot, (long)args->fd);
	return 0;
}

static __always_inline int on_sys_enter_execve(struct tracepoint__syscalls__sys_enter_execve *args)
{
	hold_enter((const char *)args->filename, HOLD_EXEC);
	return 0;
}

static __always_inline int on_sys_exit_execve(struct tracepoint__syscalls__sys_exit_execve *args)
{
	hold_exec_exit(args->ret);
	return 0;
}

/* A shell's new child (not a thread) is never stopped: runs in the parent. */
static __always_inline int on_task_newtask(struct tracepoint__task__task_newtask *args)
{
	if (args->clone_flags & HOLD_CLONE_THREAD)
		return 0;
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	if (hold_shells_get(&parent)) {
		u32 child = args->pid;
		hold_nostop_put(&child);
	}
	return 0;
}
