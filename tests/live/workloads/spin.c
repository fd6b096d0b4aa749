/* spin: burn CPU for SECONDS (a traced "training loop" or a competing hog).
 *
 *   spin SECONDS [NAME]
 *
 * NAME (<= 15 chars) becomes the process's comm, so a test can look for it
 * among the processes that ran instead of a traced thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 1.0;
	if (argc > 2)
		prctl(PR_SET_NAME, argv[2], 0, 0, 0);
	volatile unsigned long x = 0;
	double end = now() + secs;
	while (now() < end)
		for (int i = 0; i < 100000; i++)
			x += i;
	printf("done %lu\n", (unsigned long)x);
	return 0;
}
