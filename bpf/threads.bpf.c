/* SPDX-License-Identifier: Apache-2.0
 *
 * threads.bpf.c - where a thread's state lives.  Included by ingero.bpf.c
 * (which holds the maps) before the families that use it: cuda (the call
 * state), sched (the off-CPU interval), mm (the call state at a fault).
 *
 * A thread's slot is thread_slots[tid & (THREAD_SLOTS - 1)], owned by one
 * thread at a time (owner = its pid_tgid: one compare says "mine"): claimed
 * by compare-and-swap when free, freed (zeroed) when the thread ends.  Only the thread itself claims its slot (a CUDA probe, or its
 * own switch-out), so the call state is only ever touched by its thread.  A
 * tid whose slot another live tid owns (possible only where pid_max >
 * THREAD_SLOTS; systemd sets 4194304) keeps its call state in task storage
 * (`inflight`) and its off-CPU state in the `threads` hash.
 */

static __always_inline struct thread_slot *slot_of(u32 tid)
{
	return thread_slot_at(tid & (THREAD_SLOTS - 1));
}

/* The current thread's slot (id = bpf_get_current_pid_tgid()), claimed if
 * free; NULL if another thread owns it.  A slot just claimed, or owned by
 * this tid for another process (the tid was reused after an exit no probe
 * saw), starts afresh: its off-CPU state empty, its call state taken from
 * task storage, where it lived while the slot was taken (one lookup per
 * claim: a thread's call in progress or queued work carries over). */
static __always_inline struct thread_slot *own_slot(u64 id)
{
	struct thread_slot *s = slot_of((u32)id);
	if (!s)
		return 0;
	u64 owner = s->owner;
	if (owner == id)
		return s;
	if ((u32)owner == (u32)id)
		s->owner = id;
	else if (owner != 0 || __sync_val_compare_and_swap(&s->owner, 0, id) != 0)
		return 0;
	struct thread_state st = {};
	st.tgid = id >> 32;
	s->st = st;
	struct call_state *old = inflight_here(0);
	if (old) {
		s->cs = *old;
	} else {
		struct call_state cs = {};
		s->cs = cs;
	}
	return s;
}

/* The current thread's CUDA call state: in its slot, else in task storage;
 * created (the slot claimed, or a task storage entry) when `create`. */
static __always_inline struct call_state *call_state_here(u64 id, int create)
{
	struct thread_slot *s = slot_of((u32)id);
	if (s && s->owner == id)
		return &s->cs;
	if (create && (s = own_slot(id)))
		return &s->cs;
	return inflight_here(create);
}

/* The off-CPU state of any thread (a wakeup, a switch-in), or NULL. */
static __always_inline struct thread_state *thread_find(u32 tid)
{
	struct thread_slot *s = slot_of(tid);
	if (s && (u32)s->owner == tid)
		return &s->st;
	return thread_get(&tid);
}

/* The off-CPU state of the thread now switching out (current), created when
 * missing; *slot is set to its slot (left NULL when its state is in the
 * hash).  The hash update (far costlier than a lookup on an LRU map) happens
 * once per thread. */
static __always_inline struct thread_state *current_thread(u64 id, struct thread_slot **slot)
{
	u32 tid = id, tgid = id >> 32;
	struct thread_slot *s = own_slot(id);
	if (s) {
		*slot = s;
		return &s->st;
	}
	struct thread_state *t = thread_get(&tid);
	if (t && t->tgid == tgid)
		return t;
	struct thread_state fresh = {};
	fresh.tgid = tgid;
	thread_put(&tid, &fresh);
	return thread_get(&tid);
}

/* The thread has ended (its exit, or its last switch-out, which comes after
 * the exit tracepoint): free its slot and entry.  Freed slots hold zeros. */
static __always_inline void thread_forget(u32 tid)
{
	struct thread_slot *s = slot_of(tid);
	if (s && (u32)s->owner == tid) {
		struct thread_state st = {};
		struct call_state cs = {};
		s->st = st;
		s->cs = cs;
		s->owner = 0;
	}
	thread_del(&tid);
}
