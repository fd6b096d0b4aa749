/* SPDX-License-Identifier: Apache-2.0
 *
 * cupti_inject.c - ingero's CUPTI injection library: the device's own
 * timeline of a traced `--cmd`.
 *
 * The CUDA driver loads the library named by CUDA_INJECTION64_PATH at
 * cuInit and calls its InitializeInjection (how Nsight Systems and other
 * always-on profilers get into a job).  `ingero trace --cmd` builds this file
 * (collect/cupti_inject.py) against NVIDIA's CUPTI headers and sets that
 * variable, and INGERO_CUPTI_DIR, for the command.  Here, at
 * InitializeInjection:
 *
 *   - libcupti is found at run time (dlopen): the one already loaded in the
 *     process first (PyTorch's Kineto loads its own: one CUPTI per process),
 *     else INGERO_CUPTI_LIB (the tracer found it), else by soname;
 *   - activity records are enabled for kernels (concurrent), memcpy, memset
 *     and synchronisation, and for the runtime and driver calls that submit
 *     device work or wait for it (their records carry the calling thread and
 *     the correlation id a kernel or copy names: the tracer joins them to its
 *     own rows of those calls);
 *   - each buffer CUPTI completes is turned into fixed-size records
 *     (cupti_ring.h) in a ring in shared memory, INGERO_CUPTI_DIR/<pid>.ring,
 *     which the tracer reads; every buffer is preceded by a measured pair of
 *     CUPTI's clock and CLOCK_MONOTONIC (the BPF events' clock), the bracket
 *     kept, so the tracer maps each record onto the events' clock;
 *   - a thread flushes completed records every FLUSH_MS (CUPTI hands over
 *     only full buffers on its own), and an exit handler flushes the rest.
 *
 * Nothing is probed and nothing of the process is touched beyond CUPTI: a
 * failure (no libcupti, CUPTI refusing) is written into the ring's note and
 * the process runs on, only without a device timeline.
 *
 * Record layouts come from NVIDIA's headers; only fields at offsets every
 * CUPTI version since CUDA 11 shares are read (asserted below against the
 * older structs in cupti_activity_deprecated.h), so a job's older libcupti
 * (CUPTI 12 emits CUpti_ActivityKernel9) reads the same.
 */
#define _GNU_SOURCE
#include <cupti.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cupti_ring.h"

#define EXPORT __attribute__((visibility("default")))

#define BUFFER_BYTES (1u << 20)          /* per CUPTI buffer */
#define FLUSH_MS 500                     /* completed records reach the tracer at most this late */
#define DEFAULT_RING_RECORDS (1u << 19)  /* 32 MiB: ~2 s at 250 k records/s */
#define MAX_CBID 4096                    /* callback ids tried per domain */
#define NAME_SLOTS 8192                  /* kernel names sent, by address */

/* Fields read from every record kind: the same offsets in the oldest layout we accept. */
#define SAME_OFFSET(a, f, b) _Static_assert(offsetof(a, f) == offsetof(b, f), #a "." #f " moved")
SAME_OFFSET(CUpti_ActivityKernel10, start, CUpti_ActivityKernel4);
SAME_OFFSET(CUpti_ActivityKernel10, end, CUpti_ActivityKernel4);
SAME_OFFSET(CUpti_ActivityKernel10, deviceId, CUpti_ActivityKernel4);
SAME_OFFSET(CUpti_ActivityKernel10, contextId, CUpti_ActivityKernel4);
SAME_OFFSET(CUpti_ActivityKernel10, streamId, CUpti_ActivityKernel4);
SAME_OFFSET(CUpti_ActivityKernel10, correlationId, CUpti_ActivityKernel4);
SAME_OFFSET(CUpti_ActivityKernel10, name, CUpti_ActivityKernel4);
SAME_OFFSET(CUpti_ActivityKernel10, correlationId, CUpti_ActivityKernel9);
SAME_OFFSET(CUpti_ActivityKernel10, name, CUpti_ActivityKernel9);
SAME_OFFSET(CUpti_ActivityMemcpy6, bytes, CUpti_ActivityMemcpy);
SAME_OFFSET(CUpti_ActivityMemcpy6, start, CUpti_ActivityMemcpy);
SAME_OFFSET(CUpti_ActivityMemcpy6, streamId, CUpti_ActivityMemcpy);
SAME_OFFSET(CUpti_ActivityMemcpy6, correlationId, CUpti_ActivityMemcpy);
SAME_OFFSET(CUpti_ActivityMemcpy6, runtimeCorrelationId, CUpti_ActivityMemcpy);
SAME_OFFSET(CUpti_ActivityMemset4, bytes, CUpti_ActivityMemset);
SAME_OFFSET(CUpti_ActivityMemset4, start, CUpti_ActivityMemset);
SAME_OFFSET(CUpti_ActivityMemset4, streamId, CUpti_ActivityMemset);
SAME_OFFSET(CUpti_ActivityMemset4, correlationId, CUpti_ActivityMemset);
SAME_OFFSET(CUpti_ActivitySynchronization2, start, CUpti_ActivitySynchronization);
SAME_OFFSET(CUpti_ActivitySynchronization2, correlationId, CUpti_ActivitySynchronization);
SAME_OFFSET(CUpti_ActivitySynchronization2, streamId, CUpti_ActivitySynchronization);
_Static_assert(sizeof(struct ingero_cupti_rec) == 64, "ring record");
_Static_assert(sizeof(struct ingero_cupti_name) == 64, "name record");
_Static_assert(sizeof(struct ingero_cupti_ring) <= INGERO_CUPTI_HEADER_BYTES, "ring header");

/* --- CUPTI, resolved at run time ------------------------------------------ */

#define CUPTI_FUNCTIONS(X)                                                                                   \
	X(cuptiGetVersion, 1)                                                                                \
	X(cuptiGetResultString, 1)                                                                           \
	X(cuptiGetTimestamp, 1)                                                                              \
	X(cuptiActivityRegisterCallbacks, 1)                                                                 \
	X(cuptiActivityEnable, 1)                                                                            \
	X(cuptiActivityGetNextRecord, 1)                                                                     \
	X(cuptiActivityFlushAll, 1)                                                                          \
	X(cuptiGetCallbackName, 1)                                                                           \
	X(cuptiActivityGetNumDroppedRecords, 0)                                                              \
	X(cuptiSetThreadIdType, 0)                                                                           \
	X(cuptiActivityEnableRuntimeApi, 0)                                                                  \
	X(cuptiActivityEnableDriverApi, 0)

static struct {
#define DECLARE(name, required) __typeof__(name) *name;
	CUPTI_FUNCTIONS(DECLARE)
#undef DECLARE
} cu;

/* --- state ------------------------------------------------------------------ */

static pthread_mutex_t ring_mu = PTHREAD_MUTEX_INITIALIZER; /* the ring's one writer */
static pthread_mutex_t flush_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ingero_cupti_ring *ring;
static struct ingero_cupti_rec *slots;
static uint64_t mask;
static uint64_t head; /* records written, published to ring->head */
static int stopping;
static int initialized;
static pid_t owner; /* the process that set CUPTI up (a forked child must not call it) */

/* API records wanted, when CUPTI cannot select them itself (before CUDA 12.x's
 * cuptiActivityEnableRuntimeApi): filtered here by callback id. */
static unsigned char wanted_runtime[MAX_CBID / 8], wanted_driver[MAX_CBID / 8];
static int filter_runtime, filter_driver;
static const void *names_sent[NAME_SLOTS];

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void note(const char *fmt, const char *a, const char *b)
{
	if (ring)
		snprintf(ring->note, sizeof(ring->note), fmt, a ? a : "", b ? b : "");
}

static const char *result(CUptiResult r)
{
	const char *s = NULL;
	if (cu.cuptiGetResultString && cu.cuptiGetResultString(r, &s) == CUPTI_SUCCESS && s)
		return s;
	return "CUPTI error";
}

/* --- the ring ----------------------------------------------------------------- */

/* A free slot, or NULL (counted as dropped).  ring_mu held. */
static struct ingero_cupti_rec *slot(void)
{
	uint64_t tail = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
	if (head - tail >= mask + 1) {
		ring->dropped++;
		return NULL;
	}
	struct ingero_cupti_rec *r = &slots[head & mask];
	head++;
	memset(r, 0, sizeof(*r));
	return r;
}

static void publish(void)
{
	__atomic_store_n(&ring->head, head, __ATOMIC_RELEASE);
}

/* The text of name id `id`, in INGERO_CUPTI_NAME_PART-byte parts.  ring_mu held. */
static void send_name(uint64_t id, const char *text)
{
	size_t n = strnlen(text, INGERO_CUPTI_NAME_MAX);
	uint8_t part = 0;
	size_t off = 0;
	do {
		struct ingero_cupti_name *r = (struct ingero_cupti_name *)slot();
		if (!r)
			return;
		size_t k = n - off < INGERO_CUPTI_NAME_PART ? n - off : INGERO_CUPTI_NAME_PART;
		r->type = CUPTI_REC_NAME;
		r->part = part++;
		r->len = (uint8_t)k;
		r->id = id;
		memcpy(r->text, text + off, k);
		off += k;
		r->last = off >= n;
	} while (off < n);
}

/* A kernel's name, sent the first time its address is seen (CUPTI keeps one
 * string per kernel).  A full table sends again: duplicates are harmless. */
static uint64_t kernel_name(const char *name)
{
	if (!name)
		return 0;
	size_t h = ((uintptr_t)name >> 4) * 0x9e3779b97f4a7c15ull >> 51; /* 13 bits: NAME_SLOTS */
	for (unsigned i = 0; i < 16; i++) {
		size_t k = (h + i) & (NAME_SLOTS - 1);
		if (names_sent[k] == name)
			return (uint64_t)(uintptr_t)name;
		if (!names_sent[k]) {
			names_sent[k] = name;
			break;
		}
	}
	send_name((uint64_t)(uintptr_t)name, name);
	return (uint64_t)(uintptr_t)name;
}

/* CUPTI's clock against CLOCK_MONOTONIC: the tightest of a few brackets.  ring_mu held. */
static void clock_pair(void)
{
	uint64_t best = UINT64_MAX, cupti = 0, mono = 0;
	for (int i = 0; i < 4; i++) {
		uint64_t c, t0 = mono_ns();
		if (cu.cuptiGetTimestamp(&c) != CUPTI_SUCCESS)
			return;
		uint64_t t1 = mono_ns();
		if (t1 - t0 < best) {
			best = t1 - t0;
			cupti = c;
			mono = t0 + (t1 - t0) / 2;
		}
	}
	struct ingero_cupti_rec *r = slot();
	if (r) {
		r->type = CUPTI_REC_CLOCK;
		r->start = cupti;
		r->end = mono;
		r->bytes = best;
	}
}

static int wanted(const unsigned char *bits, uint32_t cbid)
{
	return cbid < MAX_CBID && (bits[cbid / 8] >> (cbid % 8) & 1);
}

/* One CUPTI record into the ring.  ring_mu held. */
static void convert(const CUpti_Activity *a)
{
	struct ingero_cupti_rec *r;
	switch (a->kind) {
	case CUPTI_ACTIVITY_KIND_KERNEL:
	case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
		const CUpti_ActivityKernel10 *k = (const void *)a;
		uint64_t name = kernel_name(k->name);
		if (!(r = slot()))
			return;
		r->type = CUPTI_REC_KERNEL;
		r->start = k->start;
		r->end = k->end;
		r->device = k->deviceId;
		r->context = k->contextId;
		r->stream = k->streamId;
		r->correlation = k->correlationId;
		r->name = name;
		return;
	}
	case CUPTI_ACTIVITY_KIND_MEMCPY: {
		const CUpti_ActivityMemcpy6 *m = (const void *)a;
		if (!(r = slot()))
			return;
		r->type = CUPTI_REC_MEMCPY;
		r->kind = m->copyKind;
		r->src = m->srcKind;
		r->dst = m->dstKind;
		r->bytes = m->bytes;
		r->start = m->start;
		r->end = m->end;
		r->device = m->deviceId;
		r->context = m->contextId;
		r->stream = m->streamId;
		r->correlation = m->correlationId;
		r->runtime_correlation = m->runtimeCorrelationId;
		return;
	}
	case CUPTI_ACTIVITY_KIND_MEMSET: {
		const CUpti_ActivityMemset4 *m = (const void *)a;
		if (!(r = slot()))
			return;
		r->type = CUPTI_REC_MEMSET;
		r->src = (uint8_t)m->memoryKind;
		r->bytes = m->bytes;
		r->start = m->start;
		r->end = m->end;
		r->device = m->deviceId;
		r->context = m->contextId;
		r->stream = m->streamId;
		r->correlation = m->correlationId;
		return;
	}
	case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
		const CUpti_ActivitySynchronization2 *s = (const void *)a;
		if (!(r = slot()))
			return;
		r->type = CUPTI_REC_SYNC;
		r->kind = (uint8_t)s->type;
		r->start = s->start;
		r->end = s->end;
		r->context = s->contextId;
		r->stream = s->streamId;
		r->correlation = s->correlationId;
		return;
	}
	case CUPTI_ACTIVITY_KIND_RUNTIME:
	case CUPTI_ACTIVITY_KIND_DRIVER: {
		const CUpti_ActivityAPI *c = (const void *)a;
		int runtime = a->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
		if ((runtime && filter_runtime && !wanted(wanted_runtime, c->cbid)) ||
		    (!runtime && filter_driver && !wanted(wanted_driver, c->cbid)))
			return;
		if (!(r = slot()))
			return;
		uint64_t domain = runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
		r->type = CUPTI_REC_API;
		r->kind = (uint8_t)domain;
		r->start = c->start;
		r->end = c->end;
		r->tid = c->threadId;
		r->correlation = c->correlationId;
		r->name = domain << 32 | c->cbid;
		return;
	}
	default:
		return;
	}
}

/* --- CUPTI's buffer callbacks ------------------------------------------------- */

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
	*buffer = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, BUFFER_BYTES);
	*size = *buffer ? BUFFER_BYTES : 0;
	*max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
	(void)size;
	uint64_t c0 = thread_cpu_ns(), n = 0;
	pthread_mutex_lock(&ring_mu);
	if (ring) {
		clock_pair();
		CUpti_Activity *a = NULL;
		while (valid && cu.cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
			convert(a);
			n++;
		}
		size_t dropped = 0;
		if (cu.cuptiActivityGetNumDroppedRecords &&
		    cu.cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped) {
			struct ingero_cupti_rec *r = slot();
			if (r) {
				r->type = CUPTI_REC_DROPPED;
				r->bytes = dropped;
				r->stream = stream;
			}
		}
		publish();
		ring->cupti_records += n;
		ring->buffers++;
		ring->handled_ns += thread_cpu_ns() - c0;
	}
	pthread_mutex_unlock(&ring_mu);
	free(buffer);
}

/* CUPTI hands over a buffer only once full; this makes completed records
 * reach the tracer within FLUSH_MS however slowly they come. */
static void *flusher(void *unused)
{
	(void)unused;
	struct timespec ts = {.tv_sec = FLUSH_MS / 1000, .tv_nsec = (FLUSH_MS % 1000) * 1000000L};
	for (;;) {
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&flush_mu);
		if (stopping) {
			pthread_mutex_unlock(&flush_mu);
			return NULL;
		}
		cu.cuptiActivityFlushAll(0);
		pthread_mutex_unlock(&flush_mu);
	}
}

/* At exit: everything CUPTI holds, finished or not, then a last clock pair. */
static void flush_at_exit(void)
{
	if (getpid() != owner)
		return; /* a forked child exiting: CUPTI is its parent's */
	pthread_mutex_lock(&flush_mu);
	stopping = 1;
	cu.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
	pthread_mutex_unlock(&flush_mu);
	pthread_mutex_lock(&ring_mu);
	if (ring) {
		clock_pair();
		publish();
		__atomic_or_fetch(&ring->flags, CUPTI_RING_CLOSED, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&ring_mu);
}

/* A forked child shares the mapping but not CUPTI: it must never write. */
static void forget_ring(void)
{
	ring = NULL;
	stopping = 1;
}

/* --- set-up ---------------------------------------------------------------------- */

static void *open_cupti(void)
{
	static const char *const sonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so.11.8", "libcupti.so"};
	for (size_t i = 0; i < sizeof(sonames) / sizeof(*sonames); i++) {
		void *h = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
		if (h)
			return h;
	}
	const char *mine = getenv("INGERO_CUPTI_LIB");
	if (mine && *mine) {
		void *h = dlopen(mine, RTLD_NOW | RTLD_GLOBAL);
		if (h)
			return h;
	}
	for (size_t i = 0; i < sizeof(sonames) / sizeof(*sonames); i++) {
		void *h = dlopen(sonames[i], RTLD_NOW | RTLD_GLOBAL);
		if (h)
			return h;
	}
	return NULL;
}

static struct ingero_cupti_ring *open_ring(const char *dir)
{
	char path[4096];
	if (snprintf(path, sizeof(path), "%s/%d.ring", dir, (int)getpid()) >= (int)sizeof(path))
		return NULL;
	uint64_t records = DEFAULT_RING_RECORDS;
	const char *want = getenv("INGERO_CUPTI_RING_RECORDS");
	if (want && *want) {
		unsigned long long v = strtoull(want, NULL, 10);
		if (v >= 1024 && v <= (1ull << 24) && !(v & (v - 1)))
			records = v;
	}
	size_t bytes = INGERO_CUPTI_HEADER_BYTES + records * sizeof(struct ingero_cupti_rec);
	/* an exec'd image of the same process finds its ring: it goes on writing it */
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	int fresh = fd >= 0;
	if (fd < 0 && errno == EEXIST)
		fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return NULL;
	struct stat st;
	if (fresh ? ftruncate(fd, (off_t)bytes) != 0 : fstat(fd, &st) != 0) {
		close(fd);
		return NULL;
	}
	if (!fresh)
		bytes = (size_t)st.st_size;
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	struct ingero_cupti_ring *r = p;
	if (fresh) {
		r->version = INGERO_CUPTI_VERSION;
		r->rec_size = sizeof(struct ingero_cupti_rec);
		r->capacity = records;
		r->pid = (uint32_t)getpid();
		__atomic_store_n(&r->magic, INGERO_CUPTI_MAGIC, __ATOMIC_RELEASE);
	} else if (r->magic != INGERO_CUPTI_MAGIC || r->rec_size != sizeof(struct ingero_cupti_rec) ||
		   r->capacity == 0 || (r->capacity & (r->capacity - 1)) ||
		   INGERO_CUPTI_HEADER_BYTES + r->capacity * sizeof(struct ingero_cupti_rec) > bytes) {
		munmap(p, bytes);
		return NULL;
	}
	slots = (struct ingero_cupti_rec *)((char *)p + INGERO_CUPTI_HEADER_BYTES);
	mask = r->capacity - 1;
	head = r->head;
	return r;
}

/* The calls whose records the tracer joins to its own rows: those that submit
 * device work or wait for it, by name (CUPTI's names carry a version suffix,
 * cudaLaunchKernel_v7000; numbering differs between CUPTI versions). */
static int submits_or_waits(const char *name, int runtime)
{
	static const char *const rt[] = {"cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch",
					 "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
					 "cudaThreadSynchronize"};
	static const char *const drv[] = {"cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch",
					  "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize"};
	const char *const *list = runtime ? rt : drv;
	size_t n = runtime ? sizeof(rt) / sizeof(*rt) : sizeof(drv) / sizeof(*drv);
	for (size_t i = 0; i < n; i++)
		if (!strncmp(name, list[i], strlen(list[i])))
			return 1;
	return 0;
}

/* Select the API records of one domain: through CUPTI where it can (no other
 * call makes a record), else every call's record, filtered in convert(). */
static int select_calls(CUpti_CallbackDomain domain, unsigned char *bits, int *filter)
{
	int runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
	__typeof__(cuptiActivityEnableRuntimeApi) *one = runtime ? cu.cuptiActivityEnableRuntimeApi
								 : cu.cuptiActivityEnableDriverApi;
	int n = 0, selected = one != NULL;
	for (uint32_t cbid = 1; cbid < MAX_CBID; cbid++) {
		const char *name = NULL;
		if (cu.cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name || !submits_or_waits(name, runtime))
			continue;
		bits[cbid / 8] |= (unsigned char)(1u << (cbid % 8));
		send_name((uint64_t)domain << 32 | cbid, name);
		if (selected && one(cbid, 1) != CUPTI_SUCCESS)
			selected = 0;
		n++;
	}
	if (!selected) {
		*filter = 1;
		if (cu.cuptiActivityEnable(runtime ? CUPTI_ACTIVITY_KIND_RUNTIME : CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS)
			return 0;
	}
	return n;
}

static int set_up(void)
{
	void *lib = open_cupti();
	if (!lib) {
		note("no libcupti found (dlopen libcupti.so.13/.12: %s)%s", dlerror(), NULL);
		return 0;
	}
#define RESOLVE(name, required)                                                                              \
	cu.name = (__typeof__(cu.name))dlsym(lib, #name);                                                    \
	if (required && !cu.name) {                                                                          \
		note("libcupti lacks %s%s", #name, NULL);                                                    \
		return 0;                                                                                    \
	}
	CUPTI_FUNCTIONS(RESOLVE)
#undef RESOLVE
	uint32_t version = 0;
	cu.cuptiGetVersion(&version);
	ring->cupti_version = version;
	if (cu.cuptiSetThreadIdType)
		cu.cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM); /* gettid: the tid the tracer sees */
	CUptiResult res = cu.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
	if (res != CUPTI_SUCCESS) {
		note("cuptiActivityRegisterCallbacks: %s%s", result(res), NULL);
		return 0;
	}
	res = cu.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
	if (res != CUPTI_SUCCESS && (res = cu.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_KERNEL)) != CUPTI_SUCCESS) {
		note("cuptiActivityEnable(kernels): %s%s", result(res), NULL);
		return 0;
	}
	int copies = cu.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) == CUPTI_SUCCESS;
	int memsets = cu.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) == CUPTI_SUCCESS;
	int syncs = cu.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) == CUPTI_SUCCESS;
	pthread_mutex_lock(&ring_mu);
	int rt = select_calls(CUPTI_CB_DOMAIN_RUNTIME_API, wanted_runtime, &filter_runtime);
	int drv = select_calls(CUPTI_CB_DOMAIN_DRIVER_API, wanted_driver, &filter_driver);
	clock_pair();
	publish();
	pthread_mutex_unlock(&ring_mu);
	snprintf(ring->note, sizeof(ring->note), "CUPTI (API version %u): kernels%s%s%s, %d runtime and %d driver calls%s",
		 version, copies ? ", copies" : "", memsets ? ", memsets" : "", syncs ? ", syncs" : "", rt, drv,
		 filter_runtime || filter_driver ? " (calls filtered here)" : "");
	atexit(flush_at_exit);
	pthread_atfork(NULL, NULL, forget_ring);
	pthread_t th;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_create(&th, &attr, flusher, NULL);
	pthread_attr_destroy(&attr);
	return 1;
}

/* Called by the CUDA driver at cuInit (once per process: an exec'd image again).
 * Returns 1: a failure here must not fail the application's cuInit. */
EXPORT int InitializeInjection(void)
{
	if (__atomic_exchange_n(&initialized, 1, __ATOMIC_ACQ_REL))
		return 1;
	const char *dir = getenv("INGERO_CUPTI_DIR");
	if (!dir || !*dir)
		return 1;
	ring = open_ring(dir);
	if (!ring)
		return 1;
	owner = getpid();
	int ok = set_up();
	__atomic_or_fetch(&ring->flags, ok ? CUPTI_RING_READY : CUPTI_RING_FAILED, __ATOMIC_RELEASE);
	if (!ok) {
		pthread_mutex_lock(&ring_mu);
		publish();
		pthread_mutex_unlock(&ring_mu);
	}
	return 1;
}
