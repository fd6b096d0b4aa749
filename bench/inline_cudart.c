/* inline_cudart.c - a CUDA runtime without a device thread, for bench/bench_budget_whole.py.
 *
 * The loop of the same shape as on the simulated runtime (demos/simcuda), but
 * every kernel is a spin in the calling thread for its modelled duration
 * (simcudaTimedKernel's first argument, in microseconds) and nothing is
 * queued: syncs return at once, copies cost a fixed spin.  So the traced
 * process has one thread switching, the loop's own: what the tracer costs a
 * host-bound loop whose runtime makes no helper thread work.
 *
 *   cc -O2 -shared -fPIC -o libcudart-inline.so inline_cudart.c
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { unsigned x, y, z; } dim3;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void spin_ns(uint64_t ns)
{
	uint64_t end = now_ns() + ns;
	while (now_ns() < end)
		;
}

void simcudaTimedKernel(void) {}

int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream)
{
	(void)grid; (void)block; (void)shmem; (void)stream;
	if (func == (const void *)simcudaTimedKernel && args && args[0])
		spin_ns((uint64_t)*(uint32_t *)args[0] * 1000);
	return 0;
}

#define COPY_NS 2000 /* a small copy's latency */
int cudaMemcpy(void *dst, const void *src, size_t n, int kind) { (void)dst; (void)src; (void)n; (void)kind; spin_ns(COPY_NS); return 0; }
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s) { (void)dst; (void)src; (void)n; (void)kind; (void)s; spin_ns(COPY_NS); return 0; }
int cudaStreamSynchronize(void *s) { (void)s; return 0; }
int cudaDeviceSynchronize(void) { return 0; }
int cudaSetDevice(int d) { (void)d; return 0; }
int cudaMalloc(void **p, size_t n) { *p = malloc(n ? n : 1); return *p ? 0 : 2; }
int cudaMallocHost(void **p, size_t n) { *p = malloc(n ? n : 1); return *p ? 0 : 2; }
int cudaFree(void *p) { free(p); return 0; }
int cudaFreeHost(void *p) { free(p); return 0; }
int cudaStreamCreate(void **s) { *s = (void *)1; return 0; }
int cudaEventCreate(void **e) { *e = (void *)1; return 0; }
int cudaEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
int cudaEventSynchronize(void *e) { (void)e; return 0; }
