/* Calls cudaStreamSynchronize once through a longjmp escape, then N times
 * normally.  Waits for argv[2] (a file the test creates once the tracer is
 * attached) before calling anything. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	int (*sync)(void *) = (int (*)(void *))dlsym(lib, "cudaStreamSynchronize");
	void (*set_escape)(jmp_buf *) = (void (*)(jmp_buf *))dlsym(lib, "stale_set_escape");
	int n = atoi(argv[3]);
	while (access(argv[2], F_OK) != 0)
		usleep(10000);
	static jmp_buf jb;
	set_escape(&jb);
	if (setjmp(jb) == 0)
		sync((void *)1);
	for (int i = 0; i < n; i++)
		sync(NULL);
	printf("done\n");
	return 0;
}
