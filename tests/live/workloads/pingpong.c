/* pingpong: N round trips of one byte between two processes over pipes.
 *
 *   pingpong N
 *
 * Every round trip blocks and wakes each side once: a context-switch-heavy
 * workload for bench_overhead.py (the sched_switch / wakeup probes).
 * Prints the elapsed seconds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 10000;
	int ab[2], ba[2];
	char c = 'x';
	struct timespec t0, t1;
	if (pipe(ab) || pipe(ba))
		return 2;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pid_t pid = fork();
	if (pid == 0) {
		for (long i = 0; i < n; i++) {
			if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1)
				_exit(3);
		}
		_exit(0);
	}
	for (long i = 0; i < n; i++) {
		if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1)
			return 3;
	}
	waitpid(pid, NULL, 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("%.6f\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
	return 0;
}
