/* getppid_gen: call getppid() at a steady rate, for the ingest benchmark.
 *
 *   getppid_gen CALLS_PER_S SECONDS
 *
 * Waits for one byte on stdin before starting (the tracer compiles its
 * filter with this pid first), then paces itself in 1 ms slices and prints
 * the number of calls made.  Each call makes bench.bpf.c emit a burst of
 * records.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double rate = argc > 1 ? atof(argv[1]) : 10000;
	double secs = argc > 2 ? atof(argv[2]) : 3;
	char c;
	if (read(0, &c, 1) != 1)
		return 2;
	double start = now(), end = start + secs;
	long calls = 0;
	for (;;) {
		double t = now();
		if (t >= end)
			break;
		long due = (long)((t - start) * rate);
		while (calls < due) {
			syscall(SYS_getppid);
			calls++;
		}
		struct timespec slice = {0, 1000000};
		nanosleep(&slice, NULL);
	}
	printf("%ld\n", calls);
	return 0;
}
