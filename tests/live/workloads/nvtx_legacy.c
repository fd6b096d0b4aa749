/* An application linked against NVIDIA's legacy NVTX library,
 * libnvToolsExt.so.1 (NVTX v2, as PyTorch builds before NVTX3 linked it):
 *
 *     nvtx_legacy N
 *
 * N times: nvtxRangePushA("legacy_step"), nvtxRangePushA("legacy_inner"),
 * two pops.  The library loads an injection named by NVTX_INJECTION64_PATH
 * as NVTX3's headers do, so ingero's sees these too.  Declared here: the
 * wheel that ships the library (nvidia-nvtx-cu12 12.1) has no v2 headers.
 * Prints "ok <pid>" on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int nvtxRangePushA(const char *message);
int nvtxRangePop(void);

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	for (int i = 0; i < n; i++) {
		if (nvtxRangePushA("legacy_step") != 0 || nvtxRangePushA("legacy_inner") != 1)
			return 1;
		nvtxRangePop();
		nvtxRangePop();
	}
	fprintf(stderr, "ok %d\n", (int)getpid());
	return 0;
}
