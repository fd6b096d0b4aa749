/* counted_calls: cudaMemcpy with the call's number as its size, until told to stop.
 *
 *   counted_calls LIBCUDART READY STOP
 *
 * dlopen()s the library, then calls cudaMemcpy(buf, buf, i, H2D) for i = 1,
 * 2, 3 ... (without a driver each fails fast with 35, but its probes fire).
 * After call 1000 it creates READY (a tracer may attach from then on); every
 * 10 calls it sleeps 1 ms and stops once STOP exists.  Prints "ok <pid> <N>",
 * N the number of its last call: the rows of a trace that attached mid-run
 * must be the calls first..N with no gap (tests/live/test_attach_live.py).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*memcpy_t)(void *, const void *, size_t, int);

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: counted_calls LIBCUDART READY STOP\n");
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 3;
	}
	memcpy_t cpy = (memcpy_t)dlsym(lib, "cudaMemcpy");
	if (!cpy)
		return 3;
	static char buf[1];
	long i = 0;
	for (;;) {
		i++;
		cpy(buf, buf, (size_t)i, 1);
		if (i == 1000)
			close(open(argv[2], O_CREAT | O_WRONLY, 0644));
		if (i % 10 == 0) {
			if (access(argv[3], F_OK) == 0)
				break;
			usleep(1000);
		}
	}
	printf("ok %d %ld\n", (int)getpid(), i);
	return 0;
}
