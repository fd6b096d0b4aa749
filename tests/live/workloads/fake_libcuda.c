/* fake_libcuda: a stand-in libcuda.so.1 exporting driver API symbols.
 *
 * No driver exists on these machines, so the driver-API probes are checked
 * against this library: each function only returns a recognisable code
 * (CUDA_ERROR_NO_DEVICE = 100), so a test can compare every row's return
 * code, byte count and stream with what the caller passed.
 */
#include <stddef.h>

#define RET 100
#define API __attribute__((visibility("default"), noinline))

API int cuInit(unsigned flags) { (void)flags; return RET; }
API int cuDriverGetVersion(int *v) { if (v) *v = 12040; return RET; }
API int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		       unsigned shared, void *stream, void **params, void **extra)
{
	(void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)stream;
	(void)params; (void)extra;
	return RET;
}
API int cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			    unsigned shared, void *stream, void **params, void **extra)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}
API int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n) { (void)dst; (void)src; (void)n; return RET; }
API int cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t n, void *stream)
{
	(void)dst; (void)src; (void)n; (void)stream;
	return RET;
}
API int cuStreamSynchronize(void *stream) { (void)stream; return RET; }
API int cuCtxSynchronize(void) { return RET; }
API int cuMemAlloc_v2(unsigned long long *p, size_t n) { (void)p; (void)n; return RET; }
API int cuMemFree_v2(unsigned long long p) { (void)p; return RET; }
