/* SPDX-License-Identifier: Apache-2.0
 *
 * simcuda_activity.h - what the simulated runtime (simcuda.c) tells the
 * simulated CUPTI (demos/simcupti/simcupti.c): the calls it was made and the
 * device work it placed on its virtual timeline, as the real driver tells
 * libcupti (through its export tables) what it submitted and when the GPU
 * ran it.
 *
 * The CUPTI stand-in finds simcudaSetActivityHooks among the process' loaded
 * objects when its client enables activity, and hands over its hooks; from
 * then on every call below is reported.  Hooks run on the calling thread;
 * device_op and sync run with the runtime's lock held: they only record.
 */
#ifndef SIMCUDA_ACTIVITY_H
#define SIMCUDA_ACTIVITY_H

#include <stdint.h>

#define SIMCUDA_ACTIVITY_VERSION 1

enum simcuda_op_kind { SIMCUDA_OP_KERNEL = 0, SIMCUDA_OP_MEMCPY = 1, SIMCUDA_OP_MEMSET = 2 };

/* A host wait, as CUPTI's synchronization records type them. */
enum simcuda_sync_kind { SIMCUDA_SYNC_EVENT = 1, SIMCUDA_SYNC_STREAM = 3, SIMCUDA_SYNC_CONTEXT = 4 };

struct simcuda_device_op {
	int kind;          /* enum simcuda_op_kind */
	int copy_kind;     /* memcpy: cudaMemcpyKind (1 H2D, 2 D2H, 3 D2D, 0 H2H), resolved */
	int host_pinned;   /* memcpy: the host side is pinned (else pageable, staged) */
	int stream;        /* the runtime's stream index (0: the legacy default stream) */
	uint32_t correlation; /* of the call that submitted it (0: none recorded) */
	uint64_t start_ns, end_ns; /* CLOCK_MONOTONIC: when the modelled device ran it */
	uint64_t bytes;
	const char *name;  /* kernel: one string per kernel function, kept for the process' life */
};

struct simcuda_activity_hooks {
	uint32_t version; /* SIMCUDA_ACTIVITY_VERSION */
	/* A runtime call begins (its name as NVIDIA's library exports it, without the
	 * _ptsz/_ptds suffix, and whether it was that variant): its correlation id, 0 when
	 * not recorded.  Nested calls (a graph launch launching) report the outermost only. */
	uint32_t (*api_enter)(const char *name, int per_thread);
	void (*api_exit)(uint32_t correlation);
	void (*device_op)(const struct simcuda_device_op *op);
	void (*sync)(int kind, uint32_t correlation, int stream, uint64_t start_ns, uint64_t end_ns);
};

#endif
