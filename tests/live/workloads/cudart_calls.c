/* cudart_calls: call NVIDIA's libcudart functions a known number of times.
 *
 *   cudart_calls LIBCUDART N BYTES [wait_fd]
 *
 * dlopen()s the library (so the test controls which copy), then calls each
 * probed runtime function N times with BYTES as the size argument.  Without
 * a driver every call fails fast with cudaErrorInsufficientDriver (35), but
 * the uprobes fire, so a tracer must store exactly N rows per op.  Prints
 * "ok <pid> <tid>" when done.  With `thread` as 5th arg the calls are made
 * from a second thread (checks tid attribution).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_t)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*memcpy_t)(void *, const void *, size_t, int);
typedef int (*memcpy_async_t)(void *, const void *, size_t, int, void *);
typedef int (*stream_sync_t)(void *);
typedef int (*void_t)(void);
typedef int (*malloc_t)(void **, size_t);
typedef int (*free_t)(void *);
typedef int (*host_alloc_t)(void **, size_t, unsigned);

static void *lib;
static long n;
static size_t bytes;
static int last_ret;

static void *need(const char *sym)
{
	void *p = dlsym(lib, sym);
	if (!p) {
		fprintf(stderr, "missing %s\n", sym);
		exit(3);
	}
	return p;
}

static void *run(void *arg)
{
	(void)arg;
	launch_t launch = need("cudaLaunchKernel");
	memcpy_t cpy = need("cudaMemcpy");
	memcpy_async_t cpy_async = need("cudaMemcpyAsync");
	stream_sync_t ssync = need("cudaStreamSynchronize");
	void_t dsync = need("cudaDeviceSynchronize");
	malloc_t mal = need("cudaMalloc");
	free_t fr = need("cudaFree");
	malloc_t mal_host = need("cudaMallocHost");
	host_alloc_t host_alloc = need("cudaHostAlloc");
	static char host[64];
	dim3 grid = {1, 1, 1}, block = {32, 1, 1};
	void *stream = (void *)0x5150;
	for (long i = 0; i < n; i++) {
		last_ret = launch((const void *)run, grid, block, NULL, 0, stream);
		last_ret = cpy(host, host, bytes, 1);            /* H2D */
		last_ret = cpy_async(host, host, bytes, 2, stream); /* D2H */
		last_ret = ssync(stream);
		last_ret = dsync();
		void *p = NULL;
		last_ret = mal(&p, bytes);
		last_ret = fr(p);
		last_ret = mal_host(&p, bytes);
		last_ret = host_alloc(&p, bytes, 0);
	}
	printf("ok %d %ld ret %d\n", getpid(), (long)syscall(SYS_gettid), last_ret);
	fflush(stdout);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s LIBCUDART N BYTES [thread]\n", argv[0]);
		return 2;
	}
	lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 3;
	}
	n = atol(argv[2]);
	bytes = strtoul(argv[3], NULL, 10);
	if (argc > 4 && strcmp(argv[4], "thread") == 0) {
		pthread_t t;
		pthread_create(&t, NULL, run, NULL);
		pthread_join(t, NULL);
	} else {
		run(NULL);
	}
	return 0;
}
