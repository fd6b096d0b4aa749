/* NVTX's C API as NVIDIA's headers compile it (NVTX3, header-only, -ldl),
 * as PyTorch's torch.cuda.nvtx.range_push reaches it (nvtxRangePushA):
 *
 *     nvtx_calls N
 *
 * N times on the main thread: nvtxRangePushA("outer"), then
 * nvtxRangePushEx with an ASCII message "inner_ex", nvtxRangePop twice;
 * nvtxRangeStartA("started") ended by nvtxRangeEnd.  A second thread makes
 * N pushes of "worker" and their pops, interleaved with the main thread's
 * ranges (the stacks are per thread).  Then a pop with nothing pushed
 * (NVTX returns -1; no span).  Last, one push of a message ("far_away") in
 * a file mapping nothing has read: its page is not mapped until read, as a
 * literal of a big program's .rodata may not be, and a probe cannot fault it
 * in.  Prints "ok <pid>" on stderr.
 */
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int n;

static void *worker(void *arg)
{
	(void)arg;
	for (int i = 0; i < n; i++) {
		nvtxRangePushA("worker");
		nvtxRangePop();
	}
	return NULL;
}

int main(int argc, char **argv)
{
	n = argc > 1 ? atoi(argv[1]) : 10;
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	nvtxEventAttributes_t a;
	memset(&a, 0, sizeof(a));
	a.version = NVTX_VERSION;
	a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
	a.messageType = NVTX_MESSAGE_TYPE_ASCII;
	a.message.ascii = "inner_ex";
	for (int i = 0; i < n; i++) {
		if (nvtxRangePushA("outer") != 0)
			return 1;
		if (nvtxRangePushEx(&a) != 1)
			return 1;
		nvtxRangePop();
		nvtxRangePop();
		nvtxRangeEnd(nvtxRangeStartA("started"));
	}
	pthread_join(t, NULL);
	if (nvtxRangePop() != -1)
		return 1;
	char path[] = "/tmp/nvtx_calls_XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0 || write(fd, "far_away", 9) != 9)
		return 1;
	unlink(path);
	const char *far_away = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0); /* not read here */
	if (far_away == MAP_FAILED)
		return 1;
	nvtxRangePushA(far_away);
	nvtxRangePop();
	fprintf(stderr, "ok %d\n", (int)getpid());
	return 0;
}
