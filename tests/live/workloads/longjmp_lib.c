/* A stand-in CUDA runtime whose cudaStreamSynchronize can leave by longjmp,
 * so the uretprobe of that call never fires (as with a C++ exception or a
 * longjmp through a real runtime).  Built as a shared library by the test. */
#include <setjmp.h>
#include <stddef.h>

static jmp_buf *escape;

void stale_set_escape(jmp_buf *jb) { escape = jb; }

int cudaStreamSynchronize(void *stream)
{
	if (stream == (void *)1 && escape)
		longjmp(*escape, 1); /* never returns through the probed frame */
	return 0;
}

/* Present so ingero recognises the file as a CUDA runtime. */
int cudaMalloc(void **p, size_t n) { (void)n; *p = NULL; return 0; }
