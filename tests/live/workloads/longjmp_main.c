/* Leaves one cudaStreamSynchronize of longjmp_lib.c by longjmp, then calls it
 * N times: from main's own frame, or with a DEPTH argument from frames deeper
 * than the abandoned call's (DEPTH + 1 frames down, 1 KiB of locals each) and
 * then once more from main's frame.  Waits for argv[2] (a file the test
 * creates once the tracer is attached) before calling anything.
 *
 * usage: longjmp_main LIB GO_FILE N [DEPTH] */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int (*sync_)(void *);

static __attribute__((noinline)) int deep(int depth)
{
	volatile char pad[1024];
	memset((char *)pad, 0, sizeof pad);
	if (depth == 0)
		return sync_(NULL);
	return deep(depth - 1) + pad[0];
}

int main(int argc, char **argv)
{
	if (argc != 4 && argc != 5)
		return 2;
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	sync_ = (int (*)(void *))dlsym(lib, "cudaStreamSynchronize");
	void (*set_escape)(jmp_buf *) = (void (*)(jmp_buf *))dlsym(lib, "stale_set_escape");
	int n = atoi(argv[3]);
	int depth = argc == 5 ? atoi(argv[4]) : 0;
	while (access(argv[2], F_OK) != 0)
		usleep(10000);
	static jmp_buf jb;
	set_escape(&jb);
	if (setjmp(jb) == 0)
		sync_((void *)1); /* left by longjmp */
	for (int i = 0; i < n; i++) {
		if (depth > 0)
			deep(depth - 1);
		else
			sync_(NULL);
	}
	if (depth > 0)
		sync_(NULL); /* from the abandoned call's own frame */
	printf("done %d\n", n);
	return 0;
}
