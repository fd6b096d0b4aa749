/* SPDX-License-Identifier: Apache-2.0
 *
 * attach.h - what bpf/attach.bpf.c and ingero/collect/holds.py share: the
 * record of one hold, the key of a path already looked at, the settings.
 * Fixed-width types only; ingero/collect/holds.py mirrors every struct and
 * enum here (tests/unit/test_holds.py compares the layouts).
 */
#ifndef INGERO_ATTACH_H
#define INGERO_ATTACH_H

#ifndef __KERNEL__
#include <stdint.h>
typedef uint8_t u8;
typedef uint32_t u32;
typedef int32_t s32;
typedef uint64_t u64;
#endif

/* Paths are read up to this many bytes (a longer one is cut: its key is
 * still unique enough, and user space reads the file through /proc). */
#define HOLD_PATH_MAX 256

enum ingero_hold_kind {
	HOLD_OPEN = 1, /* opened a file named like a CUDA / NCCL library (fd in the record) */
	HOLD_EXEC = 2, /* a traced process exec'd a program (a runtime may be linked into it) */
};

enum ingero_hold_flag {
	HOLD_STOPPED = 1, /* SIGSTOP was sent: user space must send SIGCONT */
	HOLD_NOSTOP = 2,  /* not stopped: a job of an interactive shell (the shell would see it stop) */
};

/* A path as one process group of processes sees it: the cgroup stands in
 * for the mount namespace (a container has its own of both). */
struct ingero_hold_key {
	u64 cgroup;
	char path[HOLD_PATH_MAX];
};

/* One hold, sent to user space through hold_ring once the signal is queued. */
struct ingero_hold {
	u64 ts_ns; /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) when the thread was stopped */
	u32 tgid;
	u32 tid;
	s32 fd; /* HOLD_OPEN: the descriptor the open returned; -1 for HOLD_EXEC */
	u8 kind;
	u8 flags;
	u8 pad[2];
	struct ingero_hold_key key;
};

/* hold_cfg[0], written by user space.  enabled is 0 until the holder runs
 * and again before it stops: nothing is stopped that nobody will resume. */
struct ingero_hold_cfg {
	u32 enabled;
	u32 tracer_tgid; /* never held: the tracer opens these libraries to read them */
};

#endif
