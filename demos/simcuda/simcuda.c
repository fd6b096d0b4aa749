/* SPDX-License-Identifier: Apache-2.0
 *
 * simcuda.c - a simulated CUDA runtime (libcudart.so.12) for machines
 * without a GPU.
 *
 * It exports the CUDA runtime symbols ingero's tracer probes, with NVIDIA's
 * names and C signatures (versioned libcudart.so.12 like NVIDIA's), so the
 * uprobes, their argument decoding and the host-side effects are all real;
 * only the device is modelled.
 *
 * The device model
 * ----------------
 * Two engines, as on a real GPU: a compute engine (kernels) and a copy
 * engine (DMA).  Each engine runs one operation at a time.  An operation
 * queued on stream S starts at
 *     max(now, engine tail, tail of S, tail of the legacy default stream)
 * and the legacy default stream (stream 0) waits for every stream, as
 * CUDA's legacy default stream does.  Start and end times are computed on
 * a virtual timeline (CLOCK_MONOTONIC) when the operation is queued, so the
 * modelled device is not slowed by host CPU contention - just like a real
 * GPU, which keeps running while the host thread is preempted.
 *
 * A device thread retires finished operations (in batches, at most every
 * 5 ms, so it does not compete with the host thread for a CPU), which
 * accounts the engines' busy time.  Launches block when
 * SIMCUDA_QUEUE_DEPTH operations are pending, as CUDA's launch queue does,
 * until the oldest one ends.
 *
 * Host-side costs are real work on the calling thread:
 *   - every launch spins SIMCUDA_LAUNCH_US of CPU (driver launch overhead);
 *   - pageable copies (host pointer not from cudaMallocHost/cudaHostAlloc/
 *     cudaHostRegister) are staged through a pinned bounce buffer in
 *     STAGE_CHUNK pieces: a real memcpy on the calling thread, then the DMA
 *     of that chunk, waited for before the next one.  So they are slower
 *     than pinned copies and synchronous even through cudaMemcpyAsync,
 *     which is what CUDA does with pageable memory;
 *   - pinned cudaMemcpyAsync only queues the DMA and returns.
 *
 * Waiting follows CUDA's wait policies, for every wait: syncs, synchronous
 * copies, cudaEventSynchronize and a launch facing a full queue.  The policy
 * is cudaSetDeviceFlags' (or SIMCUDA_SCHEDULE=auto|spin|yield|block):
 *   - cudaDeviceScheduleAuto (the default, as in CUDA): CUDA's heuristic -
 *     spin while the process has no more active contexts than the host has
 *     logical CPUs, else yield.  This runtime has one context per process,
 *     so Auto spins on any host with a CPU: what every ordinary
 *     one-GPU-per-process job does;
 *   - cudaDeviceScheduleSpin burns CPU until the device is done: the waiting
 *     thread is on CPU (or runnable) the whole time, never asleep;
 *   - cudaDeviceScheduleYield calls sched_yield in a loop: on CPU too, but a
 *     runnable neighbour gets the core at every turn (switch-outs while
 *     runnable);
 *   - cudaDeviceScheduleBlockingSync sleeps with clock_nanosleep until the
 *     device is done: a voluntary sleep to the scheduler, with 1 ns of timer
 *     slack, as an interrupt's wake-up has none (sleep_until_device).
 * Under every policy a thread kept off CPU when the device finishes returns
 * late; simcudaWaitLateNs() sums how late (the truth a rule about CPU
 * contention inside waits is checked against).
 *
 * Gated work (for demos/simnccl, the simulated NCCL): simcudaEnqueueGated
 * queues device work on a stream whose start another process decides - a
 * collective starts when the last rank enters it.  The call returns at once;
 * whatever later needs the stream's end (a sync, an event record, later work
 * on the stream) first waits, by the same wait policy, for the gate's word in
 * shared memory to reach its value (blocking sync sleeps on it as a futex),
 * then places the work on the timeline from the start time the last rank
 * wrote.  simcudaGateWaitNs() sums the time spent waiting for gates.
 *
 * The driver's injection (CUDA_INJECTION64_PATH): at its first call the
 * runtime loads that library and calls its InitializeInjection, as NVIDIA's
 * driver does at cuInit (how CUPTI-based profilers get into a job).  A CUPTI
 * stand-in (demos/simcupti: libcupti.so beside this library) that such a
 * library loads hands its hooks to simcudaSetActivityHooks; from then on the
 * runtime reports every call that submits device work or waits for it (with a
 * correlation id the stand-in assigns), and every kernel, copy and memset with
 * the start and end the model gave it (simcuda_activity.h).
 *
 * Knobs (environment, read once at load; setters below at run time):
 *   SIMCUDA_KERNEL_US      default kernel duration (100)
 *   SIMCUDA_LAUNCH_US      host CPU per launch (5; real launches cost ~3-8 us)
 *   SIMCUDA_H2D_GBPS       DMA bandwidth both directions (12; PCIe 3 x16 ~12 GB/s)
 *   SIMCUDA_COPY_LATENCY_US fixed DMA setup per copy (8)
 *   SIMCUDA_SCHEDULE       auto (default) | spin | yield | block
 *   SIMCUDA_DEVICE_MEM_MB  device memory for cudaMalloc (16384)
 *   SIMCUDA_QUEUE_DEPTH    pending operations before launches block (1024)
 *   SIMCUDA_TIMELINE       write every device operation here ("%p": the pid)
 *
 * Kernel duration per launch: pass func == &simcudaTimedKernel and
 * args[0] pointing to a uint32 of microseconds; or call
 * simcudaSetNextKernelUs(us) (this thread's next launch only) or
 * simcudaSetKernelUs(us) (sticky default for every thread).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "simcuda_activity.h"

#define EXPORT __attribute__((visibility("default")))

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef void *cudaGraphExec_t;

enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInitializationError = 3,
	cudaErrorInvalidDevice = 101,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorNotReady = 600,
};

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

enum {
	cudaDeviceScheduleAuto = 0,
	cudaDeviceScheduleSpin = 1,
	cudaDeviceScheduleYield = 2,
	cudaDeviceScheduleBlockingSync = 4,
	cudaDeviceScheduleMask = 7,
};

typedef struct {
	unsigned int x, y, z;
} dim3;

typedef struct {
	int id;
	char pad[4];
	char val[64];
} cudaLaunchAttribute;

typedef struct {
	dim3 gridDim;
	dim3 blockDim;
	size_t dynamicSmemBytes;
	cudaStream_t stream;
	cudaLaunchAttribute *attrs;
	unsigned int numAttrs;
} cudaLaunchConfig_t;

/* ---- model parameters --------------------------------------------------- */

#define NS_PER_US 1000ull
#define NS_PER_S 1000000000ull
#define MAX_STREAMS 256
#define MAX_PINNED 4096
/* CUDA stages pageable copies through pinned buffers of a few MB; 2 MiB is
 * in the range reported for recent drivers. */
#define STAGE_CHUNK (2u << 20)
/* Fake device addresses: far from any host mapping, so a pointer tells
 * which side it lives on (cudaMemcpyDefault resolves the kind from it). */
#define DEVICE_BASE 0x7e0000000000ull

static uint64_t kernel_ns = 100 * NS_PER_US;
static uint64_t launch_ns = 5 * NS_PER_US;
static double dma_bytes_per_ns = 12.0; /* 12 GB/s */
static uint64_t copy_latency_ns = 8 * NS_PER_US;
static int schedule = cudaDeviceScheduleAuto;
static uint64_t device_mem = 16384ull << 20;
static unsigned queue_depth = 1024;

/* ---- state (all guarded by mu) ------------------------------------------ */

enum engine { ENGINE_COMPUTE = 0, ENGINE_COPY = 1, N_ENGINES = 2 };

struct op {
	uint64_t start_ns, end_ns;
	int engine;
};

struct pinned {
	uintptr_t lo, hi;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queued_cv = PTHREAD_COND_INITIALIZER; /* device thread: work arrived */
static pthread_cond_t space_cv = PTHREAD_COND_INITIALIZER;  /* a slot freed (for observers) */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static struct op *queue; /* ring of pending operations, FIFO by queue time */
static unsigned q_head, q_len;
static uint64_t engine_tail[N_ENGINES];
static uint64_t stream_tail[MAX_STREAMS]; /* [0] = legacy default stream */
static uint64_t all_tail;                  /* end of the last op on any stream */
static unsigned char stream_used[MAX_STREAMS];
static uint64_t retired_busy[N_ENGINES];   /* busy ns of retired operations */
static uint64_t ops_total[N_ENGINES];
static uint64_t start_ns;
static struct pinned pinned[MAX_PINNED];
static unsigned n_pinned;
static uint64_t device_next = DEVICE_BASE;
static uint64_t device_used;
#define MAX_ALLOCS 65536
static struct pinned allocs[MAX_ALLOCS]; /* live cudaMalloc blocks [lo, hi) */
static unsigned n_allocs;

/* Gated device work (simcudaEnqueueGated): per stream, in stream order, work
 * whose start another process decides (the last rank entering a collective). */
#define MAX_GATES 16
struct gate {
	const volatile uint32_t *word; /* opens when (int32_t)(*word - value) >= 0 */
	uint32_t value;
	const volatile uint64_t *start_ns; /* CLOCK_MONOTONIC start, valid once open */
	uint64_t dur_ns;
	uint64_t queued_ns; /* when it was queued (SIMCUDA_TIMELINE: resident from then on) */
};
static struct gate gates[MAX_STREAMS][MAX_GATES];
static unsigned n_gates[MAX_STREAMS];
static _Atomic uint64_t gate_wait_ns; /* time waits spent for gates to open */
static int gate_open(const struct gate *g);

static __thread cudaError_t last_error;
static __thread uint64_t next_kernel_ns; /* 0 = none */

/* The CUPTI stand-in's hooks (simcudaSetActivityHooks), NULL until it asks. */
static const struct simcuda_activity_hooks *_Atomic hooks;
static __thread uint32_t api_corr;  /* the current call's correlation id (0: none) */
static __thread int api_depth;      /* calls nested in this thread: only the outermost is reported */

struct sim_event {
	uint64_t magic;
	uint64_t done_ns; /* 0 = never recorded */
};
#define EVENT_MAGIC 0x53494d4556454e54ull

/* ---- time helpers --------------------------------------------------------- */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
	struct timespec ts = {.tv_sec = (time_t)(t / NS_PER_S), .tv_nsec = (long)(t % NS_PER_S)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* cudaDeviceScheduleBlockingSync: CUDA's waiting thread sleeps until the GPU's
 * completion interrupt wakes it, microseconds after the work ends.  A timer
 * sleep adds the thread's timer slack instead (50 us for a normal thread): a
 * blocking sync after one 10 us kernel returned after 64 us here, after 15 us
 * with 1 ns of slack, and the 50 us read as device time to anything watching.
 * So the sleep runs with 1 ns of slack, and the caller's own is put back. */
static void sleep_until_device(uint64_t t)
{
	int old = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	sleep_until(t);
	if (old > 0)
		prctl(PR_SET_TIMERSLACK, (unsigned long)old, 0, 0, 0);
}

static void spin_for(uint64_t ns)
{
	uint64_t until = now_ns() + ns;
	volatile uint64_t sink = 0;
	while (now_ns() < until)
		sink++;
}

/* Active contexts of this process: the runtime models one device with its
 * primary context, created at the first call. */
#define ACTIVE_CONTEXTS 1

/* The policy a wait follows: Auto resolved the way CUDA documents it (spin
 * when contexts <= logical CPUs, else yield). */
static long host_cpus = 1; /* logical CPUs online, read once at init */

static int effective_schedule(void)
{
	if (schedule != cudaDeviceScheduleAuto)
		return schedule;
	return ACTIVE_CONTEXTS <= host_cpus ? cudaDeviceScheduleSpin : cudaDeviceScheduleYield;
}

/* SIMCUDA_TIMELINE: one line per device operation, "engine start_ns end_ns"
 * (CLOCK_MONOTONIC; engine 0 compute, 1 copy), the device's own timeline for
 * checking what is inferred from the calls (bench/bench_device_infer.py). */
static FILE *timeline;
static __thread int timeline_held; /* a staged copy's chunks: written as one operation */

/* One operation's line; called with mu held. */
static void timeline_write(int e, uint64_t start, uint64_t end)
{
	fprintf(timeline, "%d %llu %llu\n", e, (unsigned long long)start, (unsigned long long)end);
}

static void timeline_close(void)
{
	pthread_mutex_lock(&mu);
	if (timeline)
		fclose(timeline);
	timeline = NULL;
	pthread_mutex_unlock(&mu);
}

static void timeline_open(const char *path)
{
	/* "%p" in the path is the process id: each process of a run has its own file */
	char buf[4096];
	const char *p = strstr(path, "%p");
	if (p && (size_t)(p - path) < sizeof(buf) - 32) {
		snprintf(buf, sizeof(buf), "%.*s%ld%s", (int)(p - path), path, (long)getpid(), p + 2);
		path = buf;
	}
	timeline = fopen(path, "w");
	if (timeline)
		atexit(timeline_close);
}

static _Atomic uint64_t waits_late_ns; /* sum of (return - device done) over waits that waited */

/* Wait for the device to reach time t, the way the schedule flag says. */
static void wait_until(uint64_t t)
{
	if (now_ns() >= t)
		return;
	switch (effective_schedule()) {
	case cudaDeviceScheduleSpin:
		while (now_ns() < t)
			;
		break;
	case cudaDeviceScheduleYield:
		while (now_ns() < t)
			sched_yield();
		break;
	default:
		sleep_until_device(t);
	}
	waits_late_ns += now_ns() - t;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return dflt;
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	return *end ? dflt : (uint64_t)v;
}

/* ---- the device thread ---------------------------------------------------- */

/* Retire one finished operation at the head of the queue.  mu held. */
static void retire_head_locked(void)
{
	struct op *head = &queue[q_head];
	retired_busy[head->engine] += head->end_ns - head->start_ns;
	q_head = (q_head + 1) % queue_depth;
	q_len--;
}

/* The device thread retires finished operations in batches, at most every
 * RETIRE_TICK_NS: waking at every kernel's end would make it a competitor of
 * the training loop on the loop's own core (thousands of wake-ups a second
 * with short kernels).  Timing does not depend on it - the timeline does -
 * and a launcher facing a full queue retires the head itself. */
#define RETIRE_TICK_NS (5 * 1000 * 1000ull)

static void *device_main(void *unused)
{
	(void)unused;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (q_len == 0)
			pthread_cond_wait(&queued_cv, &mu);
		uint64_t t = now_ns();
		int freed = 0;
		while (q_len && queue[q_head].end_ns <= t) {
			retire_head_locked();
			freed = 1;
		}
		if (freed)
			pthread_cond_broadcast(&space_cv);
		if (q_len == 0)
			continue;
		uint64_t wake = queue[q_head].end_ns;
		if (wake < t + RETIRE_TICK_NS)
			wake = t + RETIRE_TICK_NS;
		pthread_mutex_unlock(&mu);
		sleep_until(wake);
		pthread_mutex_lock(&mu);
	}
	return NULL;
}

/* CUDA_INJECTION64_PATH: loaded and initialised at the first call, as the driver
 * does at cuInit; a library that fails to load or lacks the entry point is skipped. */
static void load_injection(void)
{
	const char *path = getenv("CUDA_INJECTION64_PATH");
	if (!path || !*path)
		return;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return;
	int (*initialize)(void) = (int (*)(void))dlsym(h, "InitializeInjection");
	if (initialize)
		initialize();
}

static void init(void)
{
	kernel_ns = env_u64("SIMCUDA_KERNEL_US", kernel_ns / NS_PER_US) * NS_PER_US;
	launch_ns = env_u64("SIMCUDA_LAUNCH_US", launch_ns / NS_PER_US) * NS_PER_US;
	copy_latency_ns = env_u64("SIMCUDA_COPY_LATENCY_US", copy_latency_ns / NS_PER_US) * NS_PER_US;
	device_mem = env_u64("SIMCUDA_DEVICE_MEM_MB", device_mem >> 20) << 20;
	queue_depth = (unsigned)env_u64("SIMCUDA_QUEUE_DEPTH", queue_depth);
	if (queue_depth < 2)
		queue_depth = 2;
	const char *bw = getenv("SIMCUDA_H2D_GBPS");
	if (bw && atof(bw) > 0)
		dma_bytes_per_ns = atof(bw);
	host_cpus = sysconf(_SC_NPROCESSORS_ONLN);
	const char *sch = getenv("SIMCUDA_SCHEDULE");
	if (sch && !strcmp(sch, "spin"))
		schedule = cudaDeviceScheduleSpin;
	else if (sch && !strcmp(sch, "yield"))
		schedule = cudaDeviceScheduleYield;
	else if (sch && !strcmp(sch, "block"))
		schedule = cudaDeviceScheduleBlockingSync;
	const char *tl = getenv("SIMCUDA_TIMELINE");
	if (tl && *tl)
		timeline_open(tl);
	queue = calloc(queue_depth, sizeof(*queue));
	start_ns = now_ns();
	stream_used[0] = 1;
	pthread_t th;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_create(&th, &attr, device_main, NULL);
	pthread_attr_destroy(&attr);
	load_injection();
}

static void ensure_init(void)
{
	pthread_once(&init_once, init);
}

static cudaError_t ret(cudaError_t e)
{
	if (e != cudaSuccess)
		last_error = e;
	return e;
}

/* A call the CUPTI stand-in records (its API record, and the correlation id of
 * the device work it submits); the outermost of nested ones only. */
static void api_begin(const char *name, int per_thread)
{
	ensure_init(); /* the first call loads the injection, as cuInit does */
	if (api_depth++)
		return;
	const struct simcuda_activity_hooks *h = hooks;
	api_corr = h ? h->api_enter(name, per_thread) : 0;
}

static cudaError_t api_end(cudaError_t e)
{
	if (--api_depth == 0) {
		const struct simcuda_activity_hooks *h = hooks;
		if (h && api_corr)
			h->api_exit(api_corr);
		api_corr = 0;
	}
	return e;
}

#define API(name, per_thread, call)                                                                          \
	do {                                                                                                 \
		api_begin(name, per_thread);                                                                 \
		return api_end(call);                                                                        \
	} while (0)

/* A host wait of the current call, for the stand-in's synchronization records. */
static void report_sync(int kind, int si, uint64_t start)
{
	const struct simcuda_activity_hooks *h = hooks;
	if (h && api_corr)
		h->sync(kind, api_corr, si, start, now_ns());
}

/* Stream handle -> index; -1 when invalid.  Handles are index values, like
 * opaque pointers; NULL is the legacy default stream.  The per-thread
 * default stream handle (2) is folded onto the default stream. */
static int stream_index(cudaStream_t s)
{
	uintptr_t i = (uintptr_t)s;
	if (i == 0 || i == 2)
		return 0;
	if (i >= MAX_STREAMS || !stream_used[i])
		return -1;
	return (int)i;
}

/* Queue one operation of duration dur on engine e and stream si, starting no
 * earlier than not_before (and now); returns its end time.  Called with mu
 * held; may wait for a queue slot. */
static uint64_t enqueue_locked_at(int e, int si, uint64_t dur, uint64_t not_before, uint64_t queued,
				  const struct simcuda_device_op *what)
{
	/* a full launch queue blocks the launcher until the oldest operation ends */
	while (q_len >= queue_depth) {
		uint64_t end = queue[q_head].end_ns;
		if (now_ns() >= end) {
			retire_head_locked();
			continue;
		}
		pthread_mutex_unlock(&mu);
		wait_until(end);
		pthread_mutex_lock(&mu);
	}
	uint64_t t = now_ns();
	uint64_t start = t > not_before ? t : not_before;
	if (engine_tail[e] > start)
		start = engine_tail[e];
	uint64_t dep = si == 0 ? all_tail : (stream_tail[si] > stream_tail[0] ? stream_tail[si] : stream_tail[0]);
	if (dep > start)
		start = dep;
	uint64_t end = start + dur;
	/* gated work (a collective) occupies the device from when the stream reaches it, its
	 * wait for the peers included, as a real NCCL kernel does: what a GPU timeline shows */
	uint64_t shown = start;
	if (queued) {
		shown = queued > engine_tail[e] ? queued : engine_tail[e];
		if (dep > shown)
			shown = dep;
		if (shown > start)
			shown = start;
	}
	if (timeline && !timeline_held)
		timeline_write(e, shown, end);
	const struct simcuda_activity_hooks *h = hooks;
	if (h && what && !timeline_held) {
		struct simcuda_device_op op = *what;
		op.stream = si;
		op.correlation = api_corr;
		op.start_ns = shown;
		op.end_ns = end;
		h->device_op(&op);
	}
	engine_tail[e] = end;
	stream_tail[si] = end;
	if (end > all_tail)
		all_tail = end;
	struct op *o = &queue[(q_head + q_len) % queue_depth];
	o->start_ns = start;
	o->end_ns = end;
	o->engine = e;
	q_len++;
	ops_total[e]++;
	pthread_cond_signal(&queued_cv);
	return end;
}

static uint64_t enqueue_locked(int e, int si, uint64_t dur, const struct simcuda_device_op *what)
{
	return enqueue_locked_at(e, si, dur, 0, 0, what);
}

static void resolve_gates(int si);

static uint64_t enqueue(int e, int si, uint64_t dur, const struct simcuda_device_op *what)
{
	/* work behind a pending gate (a collective waiting for its peers) can only be
	 * placed on the timeline once the gate's start is known */
	resolve_gates(si);
	pthread_mutex_lock(&mu);
	uint64_t end = enqueue_locked(e, si, dur, what);
	pthread_mutex_unlock(&mu);
	return end;
}

static uint64_t tail_of(int si)
{
	resolve_gates(si);
	pthread_mutex_lock(&mu);
	uint64_t t = si == 0 ? all_tail : stream_tail[si];
	pthread_mutex_unlock(&mu);
	return t;
}

static int is_pinned(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	int hit = 0;
	pthread_mutex_lock(&mu);
	for (unsigned i = 0; i < n_pinned; i++)
		if (a >= pinned[i].lo && a + n <= pinned[i].hi) {
			hit = 1;
			break;
		}
	pthread_mutex_unlock(&mu);
	return hit;
}

static int is_device(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	return a >= DEVICE_BASE && a < DEVICE_BASE + (1ull << 40);
}

static uint64_t dma_ns(size_t bytes)
{
	return copy_latency_ns + (uint64_t)((double)bytes / dma_bytes_per_ns);
}

/* ---- kernels -------------------------------------------------------------- */

/* Pass &simcudaTimedKernel as the kernel function: args[0] -> uint32 us. */
EXPORT const char simcudaTimedKernel[8] = "simkern";

/* A kernel's name for the CUPTI stand-in: one string per function, as CUPTI keeps. */
static const char *kernel_name(const void *func)
{
	if (func == (const void *)simcudaTimedKernel)
		return "simcudaTimedKernel";
	Dl_info info;
	if (func && dladdr(func, &info) && info.dli_sname && info.dli_saddr == func)
		return info.dli_sname;
	return "simcudaKernel";
}

static cudaError_t launch(const void *func, void **args, cudaStream_t stream)
{
	ensure_init();
	int si = stream_index(stream);
	if (si < 0)
		return ret(cudaErrorInvalidResourceHandle);
	uint64_t dur = kernel_ns;
	if (next_kernel_ns) {
		dur = next_kernel_ns;
		next_kernel_ns = 0;
	}
	if (func == (const void *)simcudaTimedKernel && args && args[0])
		dur = (uint64_t)(*(const uint32_t *)args[0]) * NS_PER_US;
	spin_for(launch_ns);
	struct simcuda_device_op what = {.kind = SIMCUDA_OP_KERNEL, .name = hooks ? kernel_name(func) : NULL};
	enqueue(ENGINE_COMPUTE, si, dur, &what);
	return cudaSuccess;
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
				    size_t sharedMem, cudaStream_t stream)
{
	(void)gridDim, (void)blockDim, (void)sharedMem;
	API("cudaLaunchKernel", 0, launch(func, args, stream));
}

EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args,
					 size_t sharedMem, cudaStream_t stream)
{
	(void)gridDim, (void)blockDim, (void)sharedMem;
	API("cudaLaunchKernel", 1, launch(func, args, stream));
}

static cudaError_t launch_exc(const cudaLaunchConfig_t *config, const void *func, void **args)
{
	if (!config)
		return ret(cudaErrorInvalidValue);
	return launch(func, args, config->stream);
}

EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
	API("cudaLaunchKernelExC", 0, launch_exc(config, func, args));
}

EXPORT cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func, void **args)
{
	API("cudaLaunchKernelExC", 1, launch_exc(config, func, args));
}

/* A graph is opaque here: launching one runs one kernel of the default (or
 * next) duration after one launch overhead - the point of graphs. */
static cudaError_t graph_launch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	if (!graphExec)
		return ret(cudaErrorInvalidValue);
	return launch(NULL, NULL, stream);
}

EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	API("cudaGraphLaunch", 0, graph_launch(graphExec, stream));
}

EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	API("cudaGraphLaunch", 1, graph_launch(graphExec, stream));
}

/* ---- copies --------------------------------------------------------------- */

/* Resolve cudaMemcpyDefault from the pointers. */
static int resolve_kind(const void *dst, const void *src, int kind)
{
	if (kind != cudaMemcpyDefault)
		return kind;
	int d = is_device(dst), s = is_device(src);
	if (d && s)
		return cudaMemcpyDeviceToDevice;
	if (d)
		return cudaMemcpyHostToDevice;
	if (s)
		return cudaMemcpyDeviceToHost;
	return cudaMemcpyHostToHost;
}

/* Pageable host memory: stage through a bounce buffer on the calling
 * thread, chunk by chunk, each chunk's DMA waited for.  Ordered after all
 * prior work (legacy stream semantics of a synchronous copy). */
static void staged_copy(void *dst, const void *src, size_t count, int kind, int si)
{
	static __thread unsigned char *bounce;
	if (!bounce)
		bounce = malloc(STAGE_CHUNK);
	wait_until(tail_of(si));
	/* SIMCUDA_TIMELINE: one memcpy from the first chunk's start to the last one's end,
	 * staging included, as a GPU's timeline shows a pageable copy */
	uint64_t first = now_ns(), end = first;
	/* the CUPTI stand-in: one memcpy from the first chunk's DMA to the last one's, as a GPU
	 * timeline shows a pageable copy (one record per copy call) */
	uint64_t dma_first = 0, dma_last = 0;
	timeline_held = 1;
	for (size_t off = 0; off < count; off += STAGE_CHUNK) {
		size_t n = count - off < STAGE_CHUNK ? count - off : STAGE_CHUNK;
		if (kind == cudaMemcpyHostToDevice) {
			memcpy(bounce, (const unsigned char *)src + off, n);
			wait_until(end = dma_last = enqueue(ENGINE_COPY, si, dma_ns(n), NULL));
		} else {
			wait_until(dma_last = enqueue(ENGINE_COPY, si, dma_ns(n), NULL));
			memcpy((unsigned char *)dst + off, bounce, n);
			end = now_ns();
		}
		if (!off)
			dma_first = dma_last - dma_ns(n);
	}
	timeline_held = 0;
	const struct simcuda_activity_hooks *h = hooks;
	if (h) {
		struct simcuda_device_op op = {.kind = SIMCUDA_OP_MEMCPY, .copy_kind = kind, .stream = si,
					       .correlation = api_corr, .start_ns = dma_first, .end_ns = dma_last,
					       .bytes = count};
		h->device_op(&op);
	}
	if (timeline) {
		pthread_mutex_lock(&mu);
		if (timeline)
			timeline_write(ENGINE_COPY, first, end);
		pthread_mutex_unlock(&mu);
	}
}

static cudaError_t copy(void *dst, const void *src, size_t count, int kind, cudaStream_t stream, int async)
{
	ensure_init();
	if (kind < 0 || kind > cudaMemcpyDefault || (count && (!dst || !src)))
		return ret(cudaErrorInvalidValue);
	int si = stream_index(stream);
	if (si < 0)
		return ret(cudaErrorInvalidResourceHandle);
	kind = resolve_kind(dst, src, kind);
	if (count == 0)
		return cudaSuccess;
	switch (kind) {
	case cudaMemcpyHostToHost:
		wait_until(tail_of(si));
		memmove(dst, src, count);
		return cudaSuccess;
	case cudaMemcpyDeviceToDevice: {
		/* on-device copy: runs on the compute engine at ~10x PCIe bandwidth */
		struct simcuda_device_op what = {.kind = SIMCUDA_OP_MEMCPY, .copy_kind = kind, .bytes = count};
		uint64_t end = enqueue(ENGINE_COMPUTE, si, dma_ns(count) / 10, &what);
		if (!async)
			wait_until(end);
		return cudaSuccess;
	}
	default: {
		const void *host = kind == cudaMemcpyHostToDevice ? src : dst;
		if (!is_pinned(host, count)) {
			staged_copy(dst, src, count, kind, si);
			return cudaSuccess;
		}
		struct simcuda_device_op what = {.kind = SIMCUDA_OP_MEMCPY, .copy_kind = kind, .host_pinned = 1,
						 .bytes = count};
		uint64_t end = enqueue(ENGINE_COPY, si, dma_ns(count), &what);
		if (!async)
			wait_until(end);
		return cudaSuccess;
	}
	}
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	API("cudaMemcpy", 0, copy(dst, src, count, (int)kind, NULL, 0));
}

EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	API("cudaMemcpy", 1, copy(dst, src, count, (int)kind, NULL, 0));
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
				   cudaStream_t stream)
{
	API("cudaMemcpyAsync", 0, copy(dst, src, count, (int)kind, stream, 1));
}

EXPORT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
					cudaStream_t stream)
{
	API("cudaMemcpyAsync", 1, copy(dst, src, count, (int)kind, stream, 1));
}

/* memset runs on the device at ~10x PCIe bandwidth; the synchronous form waits */
static cudaError_t memset_impl(void *devPtr, size_t count, cudaStream_t stream, int async)
{
	ensure_init();
	int si = stream_index(stream);
	if (!is_device(devPtr) || si < 0)
		return ret(cudaErrorInvalidValue);
	struct simcuda_device_op what = {.kind = SIMCUDA_OP_MEMSET, .bytes = count};
	uint64_t end = enqueue(ENGINE_COMPUTE, si, dma_ns(count) / 10, &what);
	if (!async)
		wait_until(end);
	return cudaSuccess;
}

EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	(void)value;
	API("cudaMemset", 0, memset_impl(devPtr, count, NULL, 0));
}

EXPORT cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
	(void)value;
	API("cudaMemset", 1, memset_impl(devPtr, count, NULL, 0));
}

EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	(void)value;
	API("cudaMemsetAsync", 0, memset_impl(devPtr, count, stream, 1));
}

EXPORT cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	(void)value;
	API("cudaMemsetAsync", 1, memset_impl(devPtr, count, stream, 1));
}

/* ---- synchronisation ------------------------------------------------------ */

static cudaError_t device_sync(void)
{
	ensure_init();
	uint64_t t0 = now_ns();
	wait_until(tail_of(0));
	report_sync(SIMCUDA_SYNC_CONTEXT, 0, t0);
	return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
	API("cudaDeviceSynchronize", 0, device_sync());
}

EXPORT cudaError_t cudaThreadSynchronize(void)
{
	API("cudaThreadSynchronize", 0, device_sync());
}

static cudaError_t stream_sync(cudaStream_t stream)
{
	ensure_init();
	int si = stream_index(stream);
	if (si < 0)
		return ret(cudaErrorInvalidResourceHandle);
	/* a stream is done when its own tail has passed; the legacy stream waits for all */
	uint64_t t0 = now_ns();
	wait_until(tail_of(si));
	report_sync(SIMCUDA_SYNC_STREAM, si, t0);
	return cudaSuccess;
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	API("cudaStreamSynchronize", 0, stream_sync(stream));
}

EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
	API("cudaStreamSynchronize", 1, stream_sync(stream));
}

static cudaError_t stream_query(cudaStream_t stream)
{
	ensure_init();
	int si = stream_index(stream);
	if (si < 0)
		return ret(cudaErrorInvalidResourceHandle);
	/* a query never waits: a gate not yet open means not ready */
	pthread_mutex_lock(&mu);
	int pending = 0;
	for (int i = 0; i < MAX_STREAMS && !pending; i++)
		if ((si == 0 || i == si || i == 0) && n_gates[i] && !gate_open(&gates[i][0]))
			pending = 1;
	pthread_mutex_unlock(&mu);
	if (pending)
		return cudaErrorNotReady;
	return now_ns() >= tail_of(si) ? cudaSuccess : cudaErrorNotReady;
}

EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream)
{
	return stream_query(stream);
}

EXPORT cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream)
{
	return stream_query(stream);
}

static cudaError_t stream_create(cudaStream_t *pStream)
{
	ensure_init();
	if (!pStream)
		return ret(cudaErrorInvalidValue);
	pthread_mutex_lock(&mu);
	int found = -1;
	for (int i = 3; i < MAX_STREAMS; i++) /* 1, 2 are CUDA's legacy / per-thread handles */
		if (!stream_used[i]) {
			stream_used[i] = 1;
			stream_tail[i] = 0;
			found = i;
			break;
		}
	pthread_mutex_unlock(&mu);
	if (found < 0)
		return ret(cudaErrorMemoryAllocation);
	*pStream = (cudaStream_t)(uintptr_t)found;
	return cudaSuccess;
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
	(void)flags;
	return stream_create(pStream);
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
	return stream_create(pStream);
}

EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority)
{
	(void)priority;
	(void)flags;
	return stream_create(pStream);
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	ensure_init();
	int si = stream_index(stream);
	if (si <= 0)
		return ret(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&mu);
	stream_used[si] = 0;
	pthread_mutex_unlock(&mu);
	return cudaSuccess;
}

/* ---- events --------------------------------------------------------------- */

static struct sim_event *event_of(cudaEvent_t e)
{
	struct sim_event *ev = e;
	return ev && ev->magic == EVENT_MAGIC ? ev : NULL;
}

static cudaError_t event_create(cudaEvent_t *event)
{
	ensure_init();
	if (!event)
		return ret(cudaErrorInvalidValue);
	struct sim_event *ev = calloc(1, sizeof(*ev));
	if (!ev)
		return ret(cudaErrorMemoryAllocation);
	ev->magic = EVENT_MAGIC;
	*event = ev;
	return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	(void)flags;
	return event_create(event);
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event)
{
	return event_create(event);
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	struct sim_event *ev = event_of(event);
	if (!ev)
		return ret(cudaErrorInvalidResourceHandle);
	ev->magic = 0;
	free(ev);
	return cudaSuccess;
}

static cudaError_t event_record(cudaEvent_t event, cudaStream_t stream)
{
	ensure_init();
	struct sim_event *ev = event_of(event);
	int si = stream_index(stream);
	if (!ev || si < 0)
		return ret(cudaErrorInvalidResourceHandle);
	uint64_t t = tail_of(si), n = now_ns();
	ev->done_ns = t > n ? t : n;
	return cudaSuccess;
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	return event_record(event, stream);
}

EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
	return event_record(event, stream);
}

EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
	(void)flags;
	return event_record(event, stream);
}

EXPORT cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
	(void)flags;
	return event_record(event, stream);
}

static cudaError_t event_sync(cudaEvent_t event)
{
	struct sim_event *ev = event_of(event);
	if (!ev)
		return ret(cudaErrorInvalidResourceHandle);
	uint64_t t0 = now_ns();
	wait_until(ev->done_ns);
	report_sync(SIMCUDA_SYNC_EVENT, 0, t0);
	return cudaSuccess;
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	API("cudaEventSynchronize", 0, event_sync(event));
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t event)
{
	struct sim_event *ev = event_of(event);
	if (!ev)
		return ret(cudaErrorInvalidResourceHandle);
	return now_ns() >= ev->done_ns ? cudaSuccess : cudaErrorNotReady;
}

EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	struct sim_event *a = event_of(start), *b = event_of(end);
	if (!ms || !a || !b)
		return ret(cudaErrorInvalidResourceHandle);
	if (!a->done_ns || !b->done_ns || now_ns() < b->done_ns || now_ns() < a->done_ns)
		return ret(cudaErrorNotReady);
	*ms = (float)((double)((int64_t)(b->done_ns - a->done_ns)) / 1e6);
	return cudaSuccess;
}

/* ---- memory --------------------------------------------------------------- */

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	ensure_init();
	if (!devPtr)
		return ret(cudaErrorInvalidValue);
	/* 512-byte alignment, as cudaMalloc guarantees at least 256 */
	uint64_t rounded = (size + 511) & ~511ull;
	pthread_mutex_lock(&mu);
	if (device_used + rounded > device_mem) {
		pthread_mutex_unlock(&mu);
		*devPtr = NULL;
		return ret(cudaErrorMemoryAllocation);
	}
	if (n_allocs >= MAX_ALLOCS) {
		pthread_mutex_unlock(&mu);
		*devPtr = NULL;
		return ret(cudaErrorMemoryAllocation);
	}
	/* device memory has no backing: addresses only, sizes in a side table */
	*devPtr = (void *)(uintptr_t)device_next;
	allocs[n_allocs++] = (struct pinned){device_next, device_next + rounded};
	device_next += rounded ? rounded : 512;
	device_used += rounded;
	pthread_mutex_unlock(&mu);
	return cudaSuccess;
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
	ensure_init();
	if (devPtr && !is_device(devPtr))
		return ret(cudaErrorInvalidValue);
	/* cudaFree synchronises the device, as the real one does */
	wait_until(tail_of(0));
	if (!devPtr)
		return cudaSuccess;
	int found = 0;
	pthread_mutex_lock(&mu);
	for (unsigned i = 0; i < n_allocs; i++)
		if (allocs[i].lo == (uintptr_t)devPtr) {
			device_used -= allocs[i].hi - allocs[i].lo;
			allocs[i] = allocs[--n_allocs];
			found = 1;
			break;
		}
	pthread_mutex_unlock(&mu);
	return found ? cudaSuccess : ret(cudaErrorInvalidValue);
}

static cudaError_t host_alloc(void **ptr, size_t size)
{
	ensure_init();
	if (!ptr)
		return ret(cudaErrorInvalidValue);
	size_t len = size ? size : 1;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (p == MAP_FAILED) {
		*ptr = NULL;
		return ret(cudaErrorMemoryAllocation);
	}
	/* page-locked like CUDA's pinned memory; best effort (RLIMIT_MEMLOCK) */
	(void)mlock(p, len);
	pthread_mutex_lock(&mu);
	if (n_pinned >= MAX_PINNED) {
		pthread_mutex_unlock(&mu);
		munmap(p, len);
		return ret(cudaErrorMemoryAllocation);
	}
	pinned[n_pinned++] = (struct pinned){(uintptr_t)p, (uintptr_t)p + len};
	pthread_mutex_unlock(&mu);
	*ptr = p;
	return cudaSuccess;
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	return host_alloc(ptr, size);
}

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	(void)flags;
	return host_alloc(pHost, size);
}

/* Remove a pinned range starting at p; returns its length or 0. */
static size_t unpin(void *p)
{
	size_t len = 0;
	pthread_mutex_lock(&mu);
	for (unsigned i = 0; i < n_pinned; i++)
		if (pinned[i].lo == (uintptr_t)p) {
			len = pinned[i].hi - pinned[i].lo;
			pinned[i] = pinned[--n_pinned];
			break;
		}
	pthread_mutex_unlock(&mu);
	return len;
}

EXPORT cudaError_t cudaFreeHost(void *ptr)
{
	ensure_init();
	if (!ptr)
		return cudaSuccess;
	size_t len = unpin(ptr);
	if (!len)
		return ret(cudaErrorInvalidValue);
	munmap(ptr, len);
	return cudaSuccess;
}

EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	(void)flags;
	ensure_init();
	if (!ptr || !size)
		return ret(cudaErrorInvalidValue);
	(void)mlock(ptr, size);
	pthread_mutex_lock(&mu);
	if (n_pinned >= MAX_PINNED) {
		pthread_mutex_unlock(&mu);
		return ret(cudaErrorMemoryAllocation);
	}
	pinned[n_pinned++] = (struct pinned){(uintptr_t)ptr, (uintptr_t)ptr + size};
	pthread_mutex_unlock(&mu);
	return cudaSuccess;
}

EXPORT cudaError_t cudaHostUnregister(void *ptr)
{
	ensure_init();
	size_t len = unpin(ptr);
	if (!len)
		return ret(cudaErrorInvalidValue);
	(void)munlock(ptr, len);
	return cudaSuccess;
}

/* ---- device management ---------------------------------------------------- */

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
	ensure_init();
	if (!count)
		return ret(cudaErrorInvalidValue);
	*count = 1;
	return cudaSuccess;
}

EXPORT cudaError_t cudaSetDevice(int device)
{
	ensure_init();
	return device == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice);
}

EXPORT cudaError_t cudaGetDevice(int *device)
{
	if (!device)
		return ret(cudaErrorInvalidValue);
	*device = 0;
	return cudaSuccess;
}

EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
	ensure_init();
	int s = (int)(flags & cudaDeviceScheduleMask);
	if (s != cudaDeviceScheduleAuto && s != cudaDeviceScheduleSpin && s != cudaDeviceScheduleYield && s != cudaDeviceScheduleBlockingSync)
		return ret(cudaErrorInvalidValue);
	schedule = s;
	return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceReset(void)
{
	ensure_init();
	wait_until(tail_of(0));
	return cudaSuccess;
}

EXPORT cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;
	last_error = cudaSuccess;
	return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void)
{
	return last_error;
}

EXPORT const char *cudaGetErrorString(cudaError_t error)
{
	switch (error) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorNotReady: return "device not ready";
	default: return "unrecognized error code";
	}
}

EXPORT cudaError_t cudaRuntimeGetVersion(int *v)
{
	if (!v)
		return ret(cudaErrorInvalidValue);
	*v = 12040;
	return cudaSuccess;
}

EXPORT cudaError_t cudaDriverGetVersion(int *v)
{
	if (!v)
		return ret(cudaErrorInvalidValue);
	*v = 12040;
	return cudaSuccess;
}

/* ---- gated device work (the simulated NCCL's collectives) ------------------ */

static int gate_open(const struct gate *g)
{
	return (int32_t)(*g->word - g->value) >= 0;
}

/* Wait, by the wait policy, until gate g opens (another process sets its word:
 * the last rank entering a collective).  Blocking sync sleeps on the word as a
 * futex (shared memory: the setter wakes it with FUTEX_WAKE). */
static void wait_gate(const struct gate *g)
{
	uint64_t t0 = now_ns();
	switch (effective_schedule()) {
	case cudaDeviceScheduleSpin:
		while (!gate_open(g))
			;
		break;
	case cudaDeviceScheduleYield:
		while (!gate_open(g))
			sched_yield();
		break;
	default:
		for (;;) {
			uint32_t seen = *g->word;
			if ((int32_t)(seen - g->value) >= 0)
				break;
			struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
			syscall(SYS_futex, (uint32_t *)g->word, FUTEX_WAIT, seen, &ts, NULL, 0);
		}
	}
	gate_wait_ns += now_ns() - t0;
}

/* Place the pending gated work of stream si (all streams for the legacy
 * stream, and the legacy stream's for any other) on the timeline, waiting for
 * each gate to open.  Called without mu. */
static void resolve_stream_gates(int si)
{
	for (;;) {
		pthread_mutex_lock(&mu);
		if (!n_gates[si]) {
			pthread_mutex_unlock(&mu);
			return;
		}
		struct gate g = gates[si][0];
		pthread_mutex_unlock(&mu);
		if (!gate_open(&g))
			wait_gate(&g);
		pthread_mutex_lock(&mu);
		/* another thread of this process may have placed it meanwhile */
		if (n_gates[si] && gates[si][0].word == g.word && gates[si][0].value == g.value) {
			memmove(&gates[si][0], &gates[si][1], (n_gates[si] - 1) * sizeof(struct gate));
			n_gates[si]--;
			/* a collective's kernel: its call (simcudaEnqueueGated) has no API record */
			struct simcuda_device_op what = {.kind = SIMCUDA_OP_KERNEL, .name = "simncclKernel"};
			uint32_t corr = api_corr;
			api_corr = 0;
			enqueue_locked_at(ENGINE_COMPUTE, si, g.dur_ns, *g.start_ns, g.queued_ns, &what);
			api_corr = corr;
		}
		pthread_mutex_unlock(&mu);
	}
}

static void resolve_gates(int si)
{
	if (si == 0) {
		for (int i = 0; i < MAX_STREAMS; i++)
			if (n_gates[i])
				resolve_stream_gates(i);
		return;
	}
	resolve_stream_gates(0);
	resolve_stream_gates(si);
}

/* Queue device work on `stream` that starts once the 32-bit word at `word`
 * reaches `value` (wrap-around compare), no earlier than the CLOCK_MONOTONIC
 * time at `start_ns` (read once the gate is open) nor than the stream's
 * earlier work, and runs dur_ns on the compute engine.  The call itself does
 * not wait: a sync, a later launch or copy on the stream, or an event on it
 * waits for the gate (by the wait policy) and then for the work.  This is how
 * demos/simnccl queues a collective whose start is the last rank's entry. */
EXPORT cudaError_t simcudaEnqueueGated(cudaStream_t stream, const volatile uint32_t *word, uint32_t value,
				       const volatile uint64_t *start_ns, uint64_t dur_ns)
{
	ensure_init();
	int si = stream_index(stream);
	if (si < 0)
		return ret(cudaErrorInvalidResourceHandle);
	if (!word || !start_ns)
		return ret(cudaErrorInvalidValue);
	for (;;) {
		pthread_mutex_lock(&mu);
		if (n_gates[si] < MAX_GATES) {
			gates[si][n_gates[si]++] = (struct gate){word, value, start_ns, dur_ns, now_ns()};
			pthread_cond_signal(&queued_cv);
			pthread_mutex_unlock(&mu);
			return cudaSuccess;
		}
		pthread_mutex_unlock(&mu);
		resolve_stream_gates(si); /* too many pending: place the oldest first */
	}
}

/* End of the work already placed on the stream's timeline (pending gates not
 * included; never waits): when this process' part of a collective could start. */
EXPORT uint64_t simcudaStreamTailNs(cudaStream_t stream)
{
	ensure_init();
	int si = stream_index(stream);
	if (si < 0)
		return 0;
	pthread_mutex_lock(&mu);
	uint64_t t = si == 0 ? all_tail : (stream_tail[si] > stream_tail[0] ? stream_tail[si] : stream_tail[0]);
	pthread_mutex_unlock(&mu);
	return t;
}

/* Time waits spent waiting for gates to open (peers not there yet), summed. */
EXPORT uint64_t simcudaGateWaitNs(void)
{
	return gate_wait_ns;
}

/* ---- the CUPTI stand-in's hooks --------------------------------------------- */

/* Called by demos/simcupti (from inside InitializeInjection, so never
 * ensure_init here); NULL stops the reports.  Another version: ignored. */
EXPORT void simcudaSetActivityHooks(const struct simcuda_activity_hooks *h)
{
	if (h && h->version != SIMCUDA_ACTIVITY_VERSION)
		return;
	hooks = h;
}

/* ---- simulator knobs and queries (not in NVIDIA's library) ----------------- */

/* Busy ns of engine e up to now: retired work plus the elapsed part of
 * pending work. */
static uint64_t busy_ns(int e)
{
	ensure_init();
	pthread_mutex_lock(&mu);
	uint64_t t = now_ns(), b = retired_busy[e];
	for (unsigned i = 0; i < q_len; i++) {
		struct op *o = &queue[(q_head + i) % queue_depth];
		if (o->engine == e && t > o->start_ns)
			b += (t < o->end_ns ? t : o->end_ns) - o->start_ns;
	}
	pthread_mutex_unlock(&mu);
	return b;
}

EXPORT uint64_t simcudaDeviceBusyNs(void)
{
	return busy_ns(ENGINE_COMPUTE);
}

EXPORT uint64_t simcudaCopyBusyNs(void)
{
	return busy_ns(ENGINE_COPY);
}

/* How late waits returned past the moment the device was done, summed over
 * every wait that had to wait (0 for one entered after the device was done). */
EXPORT uint64_t simcudaWaitLateNs(void)
{
	return waits_late_ns;
}

/* The wait policy in force, Auto resolved: 1 spin, 2 yield, 4 blocking sync. */
EXPORT int simcudaSchedule(void)
{
	ensure_init();
	return effective_schedule();
}

/* ns since the library initialised: busy / uptime = utilisation */
EXPORT uint64_t simcudaUptimeNs(void)
{
	ensure_init();
	return now_ns() - start_ns;
}

EXPORT uint64_t simcudaKernelsQueued(void)
{
	ensure_init();
	pthread_mutex_lock(&mu);
	uint64_t n = ops_total[ENGINE_COMPUTE];
	pthread_mutex_unlock(&mu);
	return n;
}

EXPORT void simcudaSetKernelUs(uint32_t us)
{
	ensure_init();
	kernel_ns = (uint64_t)us * NS_PER_US;
}

EXPORT void simcudaSetNextKernelUs(uint32_t us)
{
	next_kernel_ns = (uint64_t)us * NS_PER_US;
}

EXPORT void simcudaSetLaunchUs(uint32_t us)
{
	ensure_init();
	launch_ns = (uint64_t)us * NS_PER_US;
}

EXPORT void simcudaSetBandwidthGBps(double gbps)
{
	ensure_init();
	if (gbps > 0)
		dma_bytes_per_ns = gbps;
}
