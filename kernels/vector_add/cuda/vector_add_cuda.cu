// vector_add, a first version in CUDA C: out = x + y over a flat float32 vector, one thread per element.
#include <cuda_runtime.h>

__global__ void vector_add_kernel(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = x[i] + y[i];
    }
}

extern "C" void solve(const float* x, const float* y, float* out, int n) {
    int threads = 256;
    int blocks = (n + threads - 1) / threads;
    vector_add_kernel<<<blocks, threads>>>(x, y, out, n);
    cudaDeviceSynchronize();
}
