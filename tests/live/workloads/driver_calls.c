/* driver_calls: call driver API functions of a libcuda N times each.
 *
 *   driver_calls LIBCUDA N BYTES
 *
 * cuLaunchKernel is called directly and through cuLaunchKernel_ptsz, which
 * calls it again inside: a nested probed call that must give one row.
 * Prints "ready <pid>", waits for a line on stdin (so a tracer can be
 * pointed at an already running pid), calls, prints "ok".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
			void **, void **);
typedef int (*htod_t)(unsigned long long, const void *, size_t);
typedef int (*dtoh_async_t)(void *, unsigned long long, size_t, void *);
typedef int (*one_ptr_t)(void *);
typedef int (*none_t)(void);
typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*free_t)(unsigned long long);

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 3;
	}
	long n = atol(argv[2]);
	size_t bytes = strtoul(argv[3], NULL, 10);
	launch_t launch = dlsym(lib, "cuLaunchKernel");
	launch_t launch_ptsz = dlsym(lib, "cuLaunchKernel_ptsz"); /* calls cuLaunchKernel inside */
	htod_t htod = dlsym(lib, "cuMemcpyHtoD_v2");
	dtoh_async_t dtoh = dlsym(lib, "cuMemcpyDtoHAsync_v2");
	one_ptr_t ssync = dlsym(lib, "cuStreamSynchronize");
	none_t csync = dlsym(lib, "cuCtxSynchronize");
	alloc_t alloc = dlsym(lib, "cuMemAlloc_v2");
	free_t fr = dlsym(lib, "cuMemFree_v2");
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	char line[8];
	if (!fgets(line, sizeof(line), stdin))
		return 4;
	void *stream = (void *)0x7e57;
	static char host[16];
	for (long i = 0; i < n; i++) {
		launch(NULL, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
		launch_ptsz(NULL, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
		htod(0x1000, host, bytes);
		dtoh(host, 0x1000, bytes, stream);
		ssync(stream);
		csync();
		unsigned long long p;
		alloc(&p, bytes);
		fr(p);
	}
	printf("ok\n");
	fflush(stdout);
	return 0;
}
