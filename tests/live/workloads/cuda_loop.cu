// A CUDA program as nvcc builds it, for the static-runtime tests
// (tests/live/test_static_runtime.py): cudaMalloc, then N times
// {cudaMemcpy H2D of 1024 bytes, a kernel launch, cudaStreamSynchronize(0)}.
// Without a driver every call returns 35 (cudaErrorInsufficientDriver).
//
// usage: cuda_loop N [GO]   with GO: wait until that file exists before the
// first CUDA call (so a trace can attach first); prints "ok PID RET".
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    if (argc > 2)
        while (access(argv[2], F_OK) != 0)
            usleep(10000);
    static float host[256];
    float *dev = NULL;
    cudaError_t ret = cudaMalloc((void **)&dev, sizeof host);
    for (int i = 0; i < n; i++) {
        cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice);
        scale<<<1, 256>>>(dev, 2.0f);
        cudaStreamSynchronize(0);
    }
    printf("ok %d %d\n", (int)getpid(), (int)ret);
    return 0;
}
