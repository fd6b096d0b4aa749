/* SPDX-License-Identifier: Apache-2.0
 *
 * simcupti.c - a CUPTI stand-in (libcupti.so.13) for the simulated CUDA
 * runtime (demos/simcuda), for machines without a GPU.
 *
 * It exports the part of CUPTI's activity API a tracing client uses, with
 * NVIDIA's names, signatures, enums and record layouts (built against the
 * CUPTI headers the CUDA 13 toolkit ships): cuptiActivityRegisterCallbacks,
 * cuptiActivityEnable / Disable, cuptiActivityEnableRuntimeApi,
 * cuptiActivityGetNextRecord, cuptiActivityFlushAll, cuptiGetTimestamp,
 * cuptiGetCallbackName, ...  Its records come from the simulated runtime's
 * virtual device: once a client enables activity, the stand-in finds
 * simcudaSetActivityHooks among the process' loaded objects (as CUPTI reaches
 * into libcuda) and the runtime reports every call and every kernel, copy and
 * memset with the start and end its model gave them (simcuda_activity.h).
 *
 * Behaviour a client depends on, as NVIDIA's CUPTI has it:
 *   - timestamps are CLOCK_REALTIME in ns (CUPTI's default on Linux), the
 *     device's converted from the runtime's CLOCK_MONOTONIC when recorded;
 *   - correlation ids number the runtime calls; a kernel, copy or memset
 *     carries the id of the call that submitted it, an API record its own;
 *   - a kernel, copy or memset record is handed over only once its end has
 *     passed; API and synchronization records when the call returns;
 *   - records go into the client's buffers (bufferRequested); a worker thread
 *     hands over full buffers (bufferCompleted) every FLUSH_TICK_MS;
 *     cuptiActivityFlushAll hands over every buffer holding records, with
 *     CUPTI_ACTIVITY_FLAG_FLUSH_FORCED also the records not yet finished;
 *   - threadId is pthread_self() unless cuptiSetThreadIdType(SYSTEM): gettid.
 * Only runtime API records exist here (the simulated runtime has no driver
 * API); SIMCUPTI_NO_SELECT=1 makes cuptiActivityEnableRuntimeApi refuse, as
 * a CUPTI without per-call selection would, so a client's fallback (every
 * call's record, filtered by the client) runs.
 */
#define _GNU_SOURCE
#include <cupti.h>

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../simcuda/simcuda_activity.h"

#define FLUSH_TICK_MS 100
#define MAX_KIND 64

/* --- the runtime calls the simulated runtime reports, by NVIDIA's callback ids --- */

#define RT(n) {CUPTI_RUNTIME_TRACE_CBID_##n, #n}
static const struct {
	uint32_t cbid;
	const char *name; /* as cuptiGetCallbackName gives it: cudaLaunchKernel_v7000 */
} runtime_calls[] = {
	RT(cudaLaunchKernel_v7000), RT(cudaLaunchKernel_ptsz_v7000), RT(cudaLaunchKernelExC_v11060),
	RT(cudaLaunchKernelExC_ptsz_v11060), RT(cudaGraphLaunch_v10000), RT(cudaGraphLaunch_ptsz_v10000),
	RT(cudaMemcpy_v3020), RT(cudaMemcpy_ptds_v7000), RT(cudaMemcpyAsync_v3020), RT(cudaMemcpyAsync_ptsz_v7000),
	RT(cudaMemset_v3020), RT(cudaMemset_ptds_v7000), RT(cudaMemsetAsync_v3020), RT(cudaMemsetAsync_ptsz_v7000),
	RT(cudaStreamSynchronize_v3020), RT(cudaStreamSynchronize_ptsz_v7000), RT(cudaDeviceSynchronize_v3020),
	RT(cudaThreadSynchronize_v3020), RT(cudaEventSynchronize_v3020), RT(cudaMalloc_v3020), RT(cudaFree_v3020),
};
#define N_CALLS (sizeof(runtime_calls) / sizeof(*runtime_calls))

/* The entry for the runtime's (name, per-thread variant): cudaMemcpy + per-thread ->
 * cudaMemcpy_ptds_v7000.  -1: none. */
static int call_index(const char *name, int per_thread)
{
	size_t n = strlen(name);
	for (size_t i = 0; i < N_CALLS; i++) {
		const char *c = runtime_calls[i].name;
		if (strncmp(c, name, n) || c[n] != '_')
			continue;
		int pt = !strncmp(c + n, "_ptsz_", 6) || !strncmp(c + n, "_ptds_", 6);
		if (pt == !!per_thread && (pt || !strncmp(c + n, "_v", 2)))
			return (int)i;
	}
	return -1;
}

/* --- state --------------------------------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t tick_cv = PTHREAD_COND_INITIALIZER;
static CUpti_BuffersCallbackRequestFunc requested;
static CUpti_BuffersCallbackCompleteFunc completed;
static unsigned char kind_on[MAX_KIND];
static unsigned char call_on[N_CALLS]; /* cuptiActivityEnableRuntimeApi */
static int thread_id_type = CUPTI_ACTIVITY_THREAD_ID_TYPE_DEFAULT;
static _Atomic uint32_t next_correlation = 1;
static _Atomic size_t dropped;
static int attached, worker_started;

/* The client's buffer being filled, and buffers full and waiting to be handed over. */
static uint8_t *buf;
static size_t buf_size, buf_used;
#define MAX_FULL 64
static struct full {
	uint8_t *buf;
	size_t size, used;
} full[MAX_FULL];
static unsigned n_full;

/* Device records waiting for their end (CLOCK_MONOTONIC). */
union any_record {
	CUpti_Activity a;
	CUpti_ActivityKernel10 kernel;
	CUpti_ActivityMemcpy6 memcpy;
	CUpti_ActivityMemset4 memset;
};
struct pending {
	uint64_t end_mono;
	size_t size;
	union any_record r;
};
static struct pending *pending;
static size_t n_pending, cap_pending;

/* The current call of this thread (the outermost, as the runtime reports it). */
static __thread struct {
	int call;           /* runtime_calls index, -1: none */
	uint32_t correlation;
	uint64_t start;
} cur = {-1, 0, 0};

static uint64_t clock_ns(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CUPTI's timestamp: CLOCK_REALTIME.  The device's CLOCK_MONOTONIC times are
 * mapped through the offset at the moment of recording. */
static uint64_t stamp(void)
{
	return clock_ns(CLOCK_REALTIME);
}

/* CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few brackets (a thread
 * preempted between two clock reads would shift a record by the preemption), kept
 * OFFSET_KEEP_NS: the offset moves only when the wall clock is stepped. */
#define OFFSET_KEEP_NS 50000000ull
static _Atomic uint64_t offset_rt, offset_at;

static uint64_t mono_to_stamp(uint64_t mono)
{
	uint64_t now = clock_ns(CLOCK_MONOTONIC);
	if (!offset_at || now - offset_at > OFFSET_KEEP_NS) {
		uint64_t best = UINT64_MAX, off = 0;
		for (int i = 0; i < 5; i++) {
			uint64_t m0 = clock_ns(CLOCK_MONOTONIC), rt = clock_ns(CLOCK_REALTIME), m1 = clock_ns(CLOCK_MONOTONIC);
			if (m1 - m0 < best) {
				best = m1 - m0;
				off = rt - (m0 + (m1 - m0) / 2);
			}
		}
		offset_rt = off;
		offset_at = now;
	}
	return mono + offset_rt;
}

static uint32_t thread_id(void)
{
	if (thread_id_type == CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM)
		return (uint32_t)syscall(SYS_gettid);
	return (uint32_t)(uintptr_t)pthread_self();
}

/* --- buffers --------------------------------------------------------------------- */

/* Append one record to the client's buffer; mu held.  A full buffer waits for the worker. */
static void append_locked(const void *rec, size_t size)
{
	if (buf && buf_used + size > buf_size) {
		if (n_full < MAX_FULL) {
			full[n_full++] = (struct full){buf, buf_size, buf_used};
		} else {
			dropped += 1;
			return;
		}
		buf = NULL;
	}
	if (!buf) {
		uint8_t *b = NULL;
		size_t sz = 0, max_records = 0;
		if (requested)
			requested(&b, &sz, &max_records);
		if (!b || sz < size) {
			dropped += 1;
			return;
		}
		buf = b;
		buf_size = sz;
		buf_used = 0;
	}
	memcpy(buf + buf_used, rec, size);
	buf_used += size;
}

/* Device records whose end has passed (all of them when forced) into the buffers; mu held. */
static void move_finished_locked(int forced)
{
	uint64_t now = clock_ns(CLOCK_MONOTONIC);
	size_t keep = 0;
	for (size_t i = 0; i < n_pending; i++) {
		if (forced || pending[i].end_mono <= now)
			append_locked(&pending[i].r, pending[i].size);
		else
			pending[keep++] = pending[i];
	}
	n_pending = keep;
}

/* Hand the full buffers (and, flushing, the one being filled) to the client. */
static void deliver(int partial_too)
{
	struct full out[MAX_FULL + 1];
	unsigned n;
	pthread_mutex_lock(&mu);
	n = n_full;
	memcpy(out, full, n * sizeof(*out));
	n_full = 0;
	if (partial_too && buf && buf_used) {
		out[n++] = (struct full){buf, buf_size, buf_used};
		buf = NULL;
	}
	CUpti_BuffersCallbackCompleteFunc done = completed;
	pthread_mutex_unlock(&mu);
	for (unsigned i = 0; i < n; i++)
		if (done)
			done(NULL, 0, out[i].buf, out[i].size, out[i].used);
}

static void *worker(void *unused)
{
	(void)unused;
	pthread_mutex_lock(&mu);
	for (;;) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += FLUSH_TICK_MS * 1000000L;
		ts.tv_sec += ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		pthread_cond_timedwait(&tick_cv, &mu, &ts);
		move_finished_locked(0);
		int any = n_full > 0;
		pthread_mutex_unlock(&mu);
		if (any)
			deliver(0);
		pthread_mutex_lock(&mu);
	}
	return NULL;
}

/* --- what the simulated runtime reports -------------------------------------------- */

static int on(CUpti_ActivityKind k)
{
	return (unsigned)k < MAX_KIND && kind_on[k];
}

static uint32_t api_enter(const char *name, int per_thread)
{
	cur.call = call_index(name, per_thread);
	cur.correlation = next_correlation++;
	cur.start = stamp();
	return cur.correlation;
}

static void api_exit(uint32_t correlation)
{
	if (cur.call < 0 || correlation != cur.correlation)
		return;
	int call = cur.call;
	cur.call = -1;
	pthread_mutex_lock(&mu);
	if (on(CUPTI_ACTIVITY_KIND_RUNTIME) || call_on[call]) {
		CUpti_ActivityAPI r = {
			.kind = CUPTI_ACTIVITY_KIND_RUNTIME,
			.cbid = runtime_calls[call].cbid,
			.start = cur.start,
			.end = stamp(),
			.processId = (uint32_t)getpid(),
			.threadId = thread_id(),
			.correlationId = correlation,
		};
		append_locked(&r, sizeof(r));
	}
	pthread_mutex_unlock(&mu);
}

static void hold_locked(const union any_record *r, size_t size, uint64_t end_mono)
{
	if (n_pending == cap_pending) {
		size_t cap = cap_pending ? 2 * cap_pending : 4096;
		struct pending *p = realloc(pending, cap * sizeof(*p));
		if (!p) {
			dropped += 1;
			return;
		}
		pending = p;
		cap_pending = cap;
	}
	pending[n_pending].end_mono = end_mono;
	pending[n_pending].size = size;
	memcpy(&pending[n_pending].r, r, size);
	n_pending++;
}

static uint8_t memcpy_kind(int cuda_kind)
{
	switch (cuda_kind) {
	case 1: return CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
	case 2: return CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
	case 3: return CUPTI_ACTIVITY_MEMCPY_KIND_DTOD;
	case 0: return CUPTI_ACTIVITY_MEMCPY_KIND_HTOH;
	default: return CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN;
	}
}

static void device_op(const struct simcuda_device_op *op)
{
	union any_record r;
	size_t size;
	memset(&r, 0, sizeof(r));
	uint64_t start = mono_to_stamp(op->start_ns), end = start + (op->end_ns - op->start_ns);
	switch (op->kind) {
	case SIMCUDA_OP_KERNEL:
		if (!on(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) && !on(CUPTI_ACTIVITY_KIND_KERNEL))
			return;
		r.kernel.kind = on(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
									   : CUPTI_ACTIVITY_KIND_KERNEL;
		r.kernel.start = start;
		r.kernel.end = end;
		r.kernel.completed = end;
		r.kernel.contextId = 1;
		r.kernel.streamId = (uint32_t)op->stream;
		r.kernel.gridX = r.kernel.blockX = 1;
		r.kernel.gridY = r.kernel.gridZ = r.kernel.blockY = r.kernel.blockZ = 1;
		r.kernel.correlationId = op->correlation;
		r.kernel.name = op->name;
		size = sizeof(r.kernel);
		break;
	case SIMCUDA_OP_MEMCPY: {
		if (!on(CUPTI_ACTIVITY_KIND_MEMCPY))
			return;
		uint8_t host = op->host_pinned ? CUPTI_ACTIVITY_MEMORY_KIND_PINNED : CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE;
		r.memcpy.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
		r.memcpy.copyKind = memcpy_kind(op->copy_kind);
		r.memcpy.srcKind = op->copy_kind == 2 || op->copy_kind == 3 ? CUPTI_ACTIVITY_MEMORY_KIND_DEVICE : host;
		r.memcpy.dstKind = op->copy_kind == 1 || op->copy_kind == 3 ? CUPTI_ACTIVITY_MEMORY_KIND_DEVICE : host;
		r.memcpy.bytes = op->bytes;
		r.memcpy.start = start;
		r.memcpy.end = end;
		r.memcpy.contextId = 1;
		r.memcpy.streamId = (uint32_t)op->stream;
		r.memcpy.correlationId = op->correlation;
		r.memcpy.runtimeCorrelationId = op->correlation;
		size = sizeof(r.memcpy);
		break;
	}
	case SIMCUDA_OP_MEMSET:
		if (!on(CUPTI_ACTIVITY_KIND_MEMSET))
			return;
		r.memset.kind = CUPTI_ACTIVITY_KIND_MEMSET;
		r.memset.bytes = op->bytes;
		r.memset.start = start;
		r.memset.end = end;
		r.memset.contextId = 1;
		r.memset.streamId = (uint32_t)op->stream;
		r.memset.correlationId = op->correlation;
		r.memset.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
		size = sizeof(r.memset);
		break;
	default:
		return;
	}
	pthread_mutex_lock(&mu);
	hold_locked(&r, size, op->end_ns);
	pthread_mutex_unlock(&mu);
}

static void sync_wait(int kind, uint32_t correlation, int stream, uint64_t start_ns, uint64_t end_ns)
{
	pthread_mutex_lock(&mu);
	if (on(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION)) {
		uint64_t start = mono_to_stamp(start_ns);
		CUpti_ActivitySynchronization2 r = {
			.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
			.type = (CUpti_ActivitySynchronizationType)kind,
			.start = start,
			.end = start + (end_ns - start_ns),
			.correlationId = correlation,
			.contextId = 1,
			.streamId = (uint32_t)stream,
		};
		append_locked(&r, sizeof(r));
	}
	pthread_mutex_unlock(&mu);
}

static const struct simcuda_activity_hooks hooks = {
	.version = SIMCUDA_ACTIVITY_VERSION,
	.api_enter = api_enter,
	.api_exit = api_exit,
	.device_op = device_op,
	.sync = sync_wait,
};

/* The loaded objects' paths (collected first: dlopen inside dl_iterate_phdr's walk is not safe). */
struct paths {
	char *p[256];
	int n;
};

static int collect(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	struct paths *ps = data;
	if (info->dlpi_name && *info->dlpi_name && ps->n < 256)
		ps->p[ps->n++] = strdup(info->dlpi_name);
	return 0;
}

/* Find the simulated runtime and hand it the hooks; once.  Called without mu. */
static void attach(void)
{
	if (__atomic_exchange_n(&attached, 1, __ATOMIC_ACQ_REL))
		return;
	struct paths ps = {.n = 0};
	dl_iterate_phdr(collect, &ps);
	int done = 0;
	for (int i = 0; i < ps.n; i++) {
		if (!done) {
			void *h = dlopen(ps.p[i], RTLD_NOW | RTLD_NOLOAD);
			void (*set)(const struct simcuda_activity_hooks *) = h ? dlsym(h, "simcudaSetActivityHooks") : NULL;
			if (set) {
				set(&hooks);
				done = 1;
			}
			if (h)
				dlclose(h);
		}
		free(ps.p[i]);
	}
}

static void start_worker(void)
{
	if (__atomic_exchange_n(&worker_started, 1, __ATOMIC_ACQ_REL))
		return;
	pthread_t th;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_create(&th, &attr, worker, NULL);
	pthread_attr_destroy(&attr);
}

/* --- the exported API ------------------------------------------------------------- */

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *version)
{
	if (!version)
		return CUPTI_ERROR_INVALID_PARAMETER;
	*version = CUPTI_API_VERSION;
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult r, const char **str)
{
	if (!str)
		return CUPTI_ERROR_INVALID_PARAMETER;
	switch (r) {
	case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
	case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
	case CUPTI_ERROR_INVALID_KIND: *str = "CUPTI_ERROR_INVALID_KIND"; break;
	case CUPTI_ERROR_MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
	case CUPTI_ERROR_NOT_INITIALIZED: *str = "CUPTI_ERROR_NOT_INITIALIZED"; break;
	default: *str = "CUPTI_ERROR_UNKNOWN"; break;
	}
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *timestamp)
{
	if (!timestamp)
		return CUPTI_ERROR_INVALID_PARAMETER;
	*timestamp = stamp();
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiSetThreadIdType(CUpti_ActivityThreadIdType type)
{
	if (type != CUPTI_ACTIVITY_THREAD_ID_TYPE_DEFAULT && type != CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM)
		return CUPTI_ERROR_INVALID_PARAMETER;
	thread_id_type = type;
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetThreadIdType(CUpti_ActivityThreadIdType *type)
{
	if (!type)
		return CUPTI_ERROR_INVALID_PARAMETER;
	*type = (CUpti_ActivityThreadIdType)thread_id_type;
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc funcBufferRequested,
						   CUpti_BuffersCallbackCompleteFunc funcBufferCompleted)
{
	if (!funcBufferRequested || !funcBufferCompleted)
		return CUPTI_ERROR_INVALID_PARAMETER;
	pthread_mutex_lock(&mu);
	requested = funcBufferRequested;
	completed = funcBufferCompleted;
	pthread_mutex_unlock(&mu);
	return CUPTI_SUCCESS;
}

static int supported(CUpti_ActivityKind kind)
{
	switch (kind) {
	case CUPTI_ACTIVITY_KIND_KERNEL:
	case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
	case CUPTI_ACTIVITY_KIND_MEMCPY:
	case CUPTI_ACTIVITY_KIND_MEMSET:
	case CUPTI_ACTIVITY_KIND_RUNTIME:
	case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
		return 1;
	default:
		return 0;
	}
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind)
{
	if (!supported(kind))
		return kind == CUPTI_ACTIVITY_KIND_DRIVER ? CUPTI_ERROR_NOT_SUPPORTED : CUPTI_ERROR_INVALID_KIND;
	if (!completed)
		return CUPTI_ERROR_NOT_INITIALIZED;
	pthread_mutex_lock(&mu);
	kind_on[kind] = 1;
	if (kind == CUPTI_ACTIVITY_KIND_RUNTIME)
		memset(call_on, 0, sizeof(call_on)); /* the kind overrides per-call settings made before */
	pthread_mutex_unlock(&mu);
	attach();
	start_worker();
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind)
{
	if (!supported(kind))
		return CUPTI_ERROR_INVALID_KIND;
	pthread_mutex_lock(&mu);
	kind_on[kind] = 0;
	pthread_mutex_unlock(&mu);
	return CUPTI_SUCCESS;
}

/* Per-call API records.  SIMCUPTI_NO_SELECT=1 plays a CUPTI that cannot select them
 * (CUPTI_ERROR_NOT_SUPPORTED): a client then takes every call's record. */
CUptiResult CUPTIAPI cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable)
{
	const char *old = getenv("SIMCUPTI_NO_SELECT");
	if (old && *old == '1')
		return CUPTI_ERROR_NOT_SUPPORTED;
	if (!completed)
		return CUPTI_ERROR_NOT_INITIALIZED;
	for (size_t i = 0; i < N_CALLS; i++)
		if (runtime_calls[i].cbid == cbid) {
			pthread_mutex_lock(&mu);
			call_on[i] = enable ? 1 : 0;
			pthread_mutex_unlock(&mu);
			attach();
			start_worker();
			return CUPTI_SUCCESS;
		}
	return CUPTI_SUCCESS; /* a call the simulated runtime never makes: nothing to record */
}

CUptiResult CUPTIAPI cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable)
{
	(void)cbid, (void)enable;
	return CUPTI_SUCCESS; /* no driver API here: no record to make */
}

CUptiResult CUPTIAPI cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char **name)
{
	if (!name)
		return CUPTI_ERROR_INVALID_PARAMETER;
	*name = NULL;
	if (domain != CUPTI_CB_DOMAIN_RUNTIME_API)
		return CUPTI_ERROR_INVALID_PARAMETER;
	for (size_t i = 0; i < N_CALLS; i++)
		if (runtime_calls[i].cbid == cbid) {
			*name = runtime_calls[i].name;
			return CUPTI_SUCCESS;
		}
	return CUPTI_ERROR_INVALID_PARAMETER;
}

static size_t record_size(const CUpti_Activity *a)
{
	switch (a->kind) {
	case CUPTI_ACTIVITY_KIND_KERNEL:
	case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(CUpti_ActivityKernel10);
	case CUPTI_ACTIVITY_KIND_MEMCPY: return sizeof(CUpti_ActivityMemcpy6);
	case CUPTI_ACTIVITY_KIND_MEMSET: return sizeof(CUpti_ActivityMemset4);
	case CUPTI_ACTIVITY_KIND_RUNTIME: return sizeof(CUpti_ActivityAPI);
	case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: return sizeof(CUpti_ActivitySynchronization2);
	default: return 0;
	}
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer, size_t validBufferSizeBytes, CUpti_Activity **record)
{
	if (!buffer || !record)
		return CUPTI_ERROR_INVALID_PARAMETER;
	size_t off = 0;
	if (*record) {
		size_t size = record_size(*record);
		if (!size)
			return CUPTI_ERROR_INVALID_KIND;
		off = (size_t)((uint8_t *)*record - buffer) + size;
	}
	if (off + sizeof(CUpti_Activity) > validBufferSizeBytes)
		return CUPTI_ERROR_MAX_LIMIT_REACHED;
	CUpti_Activity *next = (CUpti_Activity *)(buffer + off);
	size_t size = record_size(next);
	if (!size || off + size > validBufferSizeBytes)
		return CUPTI_ERROR_INVALID_KIND;
	*record = next;
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag)
{
	pthread_mutex_lock(&mu);
	move_finished_locked(flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
	pthread_mutex_unlock(&mu);
	deliver(1);
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushPeriod(uint32_t time)
{
	(void)time; /* full buffers go every FLUSH_TICK_MS here */
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t *n)
{
	(void)context, (void)streamId;
	if (!n)
		return CUPTI_ERROR_INVALID_PARAMETER;
	*n = __atomic_exchange_n(&dropped, 0, __ATOMIC_ACQ_REL);
	return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiFinalize(void)
{
	cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
	pthread_mutex_lock(&mu);
	memset(kind_on, 0, sizeof(kind_on));
	memset(call_on, 0, sizeof(call_on));
	pthread_mutex_unlock(&mu);
	return CUPTI_SUCCESS;
}
