/* stale_calls: CUDA calls of the simulated runtime that never return, for
 * tests/live/test_stale_calls.py.
 *
 *   stale_calls LIBCUDART GO_FILE ESCAPES
 *
 * Waits for GO_FILE (created once the tracer is attached), then:
 *   1. queues one 60 s kernel, so every cudaDeviceSynchronize blocks;
 *   2. ESCAPES times, a thread blocked in cudaDeviceSynchronize is sent
 *      SIGUSR1, whose handler siglongjmps out of the call (its return probe
 *      never fires), then the thread calls cudaMalloc from the same frame
 *      (not cudaFree: it waits for the device, as the real one does);
 *   3. a second thread blocked in cudaDeviceSynchronize is killed mid-call
 *      (SIGUSR2: its handler ends that thread with the exit syscall);
 *   4. a third thread makes one cudaMalloc;
 *   5. a fourth thread is left blocked in cudaDeviceSynchronize while the
 *      process exits.
 * A signal is only sent once the thread sleeps in clock_nanosleep, which in
 * this program only the runtime's sync does (read from /proc/.../syscall):
 * so the call is certainly in progress.  Prints "done ESCAPES" at the end.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;

static int (*launch)(const void *, dim3, dim3, void **, size_t, void *);
static int (*dev_sync)(void);
static int (*cmalloc)(void **, size_t);
static void (*set_next_kernel_us)(unsigned);

static sigjmp_buf escape;
static volatile int escapes_done;
static volatile pid_t tid_of_thread;

static void on_escape(int sig) { (void)sig; siglongjmp(escape, 1); }
static void on_kill(int sig) { (void)sig; syscall(SYS_exit, 0); } /* ends this thread only, unwinds nothing */

/* Until thread `tid` sleeps in clock_nanosleep: inside cudaDeviceSynchronize. */
static void wait_in_sync(pid_t tid)
{
	char path[64], want[16], buf[64];
	snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
	snprintf(want, sizeof want, "%d ", (int)SYS_clock_nanosleep);
	for (;;) {
		int fd = open(path, O_RDONLY);
		ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
		if (fd >= 0)
			close(fd);
		if (n > 0) {
			buf[n] = 0;
			if (strncmp(buf, want, strlen(want)) == 0)
				return;
		}
		usleep(1000);
	}
}

static pid_t wait_tid(void)
{
	while (!tid_of_thread)
		usleep(1000);
	pid_t t = tid_of_thread;
	tid_of_thread = 0;
	return t;
}

static void *escaper(void *arg)
{
	int n = *(int *)arg;
	void *p;
	tid_of_thread = gettid();
	for (volatile int i = 0; i < n; i++) {
		if (sigsetjmp(escape, 1) == 0) {
			dev_sync(); /* left by SIGUSR1, never returns */
			fprintf(stderr, "cudaDeviceSynchronize returned\n");
			abort();
		}
		/* the next probed call of this thread, from the same frame: it
		 * replaces the abandoned call's state */
		cmalloc(&p, 4096);
		escapes_done = i + 1;
	}
	return NULL;
}

static void *blocked(void *arg)
{
	(void)arg;
	tid_of_thread = gettid();
	dev_sync(); /* killed (SIGUSR2) or ended by the process exit */
	return NULL;
}

static void *one_call(void *arg)
{
	(void)arg;
	void *p;
	cmalloc(&p, 4096);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: stale_calls LIBCUDART GO_FILE ESCAPES\n");
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	launch = dlsym(lib, "cudaLaunchKernel");
	dev_sync = dlsym(lib, "cudaDeviceSynchronize");
	cmalloc = dlsym(lib, "cudaMalloc");
	set_next_kernel_us = dlsym(lib, "simcudaSetNextKernelUs");
	if (!launch || !dev_sync || !cmalloc || !set_next_kernel_us) {
		fprintf(stderr, "not the simulated runtime: %s\n", argv[1]);
		return 1;
	}
	int escapes = atoi(argv[3]);
	signal(SIGUSR1, on_escape);
	signal(SIGUSR2, on_kill);
	while (access(argv[2], F_OK) != 0)
		usleep(10000);

	dim3 one = {1, 1, 1};
	set_next_kernel_us(60u * 1000 * 1000);
	launch((const void *)main, one, one, NULL, 0, NULL);

	pthread_t t;
	pthread_create(&t, NULL, escaper, &escapes);
	pid_t tid = wait_tid();
	for (int i = 0; i < escapes; i++) {
		wait_in_sync(tid);
		pthread_kill(t, SIGUSR1);
		while (escapes_done < i + 1)
			usleep(1000);
	}
	pthread_join(t, NULL);

	pthread_create(&t, NULL, blocked, NULL);
	wait_in_sync(wait_tid());
	pthread_kill(t, SIGUSR2);
	pthread_join(t, NULL);

	pthread_create(&t, NULL, one_call, NULL);
	pthread_join(t, NULL);

	pthread_create(&t, NULL, blocked, NULL);
	wait_in_sync(wait_tid());
	printf("done %d\n", escapes);
	fflush(stdout);
	return 0; /* exit_group ends the thread still inside cudaDeviceSynchronize */
}
