/* call_state: sleeps inside and outside CUDA calls, with and without device
 * work queued, for tests/live/test_call_state_live.py (events.in_call,
 * events.queued).
 *
 *   call_state LIBCUDART GO_FILE N M K L PAGES
 *
 * LIBCUDART is the simulated runtime (demos/build/libcudart.so.12), whose
 * cudaStreamSynchronize waits for the device in one clock_nanosleep.  Waits
 * for GO_FILE (created once the tracer is attached), then:
 *   0. a helper thread that never calls CUDA sleeps L times (joined before
 *      the main thread's first CUDA call);
 *   1. N times: launch a 20*SLEEP_MS kernel, cudaStreamSynchronize: one sleep
 *      inside the sync with the kernel queued (in_call sync, queued TRUE);
 *   2. M times: sleep SLEEP_MS right after that sync (in_call NULL, queued
 *      FALSE), touching PAGES fresh pages before each sleep;
 *   3. K times: launch a 10 us kernel, touch PAGES fresh pages, sleep
 *      SLEEP_MS without syncing (in_call NULL, queued TRUE);
 *   4. one last cudaStreamSynchronize (the 10 us kernels are long done: no
 *      sleep).
 * Prints "main TID" and "helper TID", and "done" at the end.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SLEEP_MS 5
#define PAGE 4096

typedef struct { unsigned x, y, z; } dim3;

static int (*launch)(const void *, dim3, dim3, void **, size_t, void *);
static int (*stream_sync)(void *);
static void (*set_kernel_us)(unsigned);

static void nap(void)
{
	struct timespec t = {0, SLEEP_MS * 1000000L};
	nanosleep(&t, NULL);
}

static int helper_sleeps;

static void *helper(void *arg)
{
	(void)arg;
	printf("helper %d\n", gettid());
	fflush(stdout);
	for (int i = 0; i < helper_sleeps; i++)
		nap();
	return NULL;
}

/* PAGES pages never touched before: one minor fault each (no huge pages). */
static char *fresh;
static void touch(int pages)
{
	for (int i = 0; i < pages; i++, fresh += PAGE)
		*(volatile char *)fresh = 1;
}

static void must(int err, const char *what)
{
	if (err) {
		fprintf(stderr, "%s returned %d\n", what, err);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc != 8) {
		fprintf(stderr, "usage: call_state LIBCUDART GO_FILE N M K L PAGES\n");
		return 2;
	}
	int n = atoi(argv[3]), m = atoi(argv[4]), k = atoi(argv[5]), pages = atoi(argv[7]);
	helper_sleeps = atoi(argv[6]);
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	launch = dlsym(lib, "cudaLaunchKernel");
	stream_sync = dlsym(lib, "cudaStreamSynchronize");
	set_kernel_us = dlsym(lib, "simcudaSetKernelUs");
	if (!launch || !stream_sync || !set_kernel_us) {
		fprintf(stderr, "not the simulated runtime\n");
		return 1;
	}
	size_t len = (size_t)(m + k) * pages * PAGE + PAGE;
	fresh = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (fresh == MAP_FAILED)
		return 1;
	madvise(fresh, len, MADV_NOHUGEPAGE);
	printf("main %d\n", gettid());
	fflush(stdout);
	while (access(argv[2], F_OK) != 0)
		usleep(1000);

	pthread_t t;
	pthread_create(&t, NULL, helper, NULL);
	pthread_join(t, NULL);

	dim3 one = {1, 1, 1};
	/* 20x the sleeps: the sync still sleeps >= SLEEP_MS when the thread waits
	 * for a CPU up to 95 ms between the launch and the sync (15 ms seen at load 9) */
	set_kernel_us(20 * SLEEP_MS * 1000);
	for (int i = 0; i < n; i++) {
		must(launch(NULL, one, one, NULL, 0, NULL), "cudaLaunchKernel");
		must(stream_sync(NULL), "cudaStreamSynchronize");
	}
	for (int i = 0; i < m; i++) {
		touch(pages);
		nap();
	}
	set_kernel_us(10);
	for (int i = 0; i < k; i++) {
		must(launch(NULL, one, one, NULL, 0, NULL), "cudaLaunchKernel");
		touch(pages);
		nap();
	}
	must(stream_sync(NULL), "cudaStreamSynchronize");
	printf("done\n");
	return 0;
}
