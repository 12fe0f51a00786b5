// rmsnorm, a first version in CUDA C: out = x / sqrt(mean(x^2) + eps) * weight over the last dimension
// of a float32 (rows, cols) matrix, one block of 256 threads per row, the sum of squares reduced through
// shared memory.
#include <cuda_runtime.h>

#define THREADS 256

__global__ void rmsnorm_kernel(const float* x, const float* weight, float* out, int rows, int cols, float eps) {
    __shared__ float partial[THREADS];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* dst = out + (size_t)blockIdx.x * cols;

    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        sum += row[j] * row[j];
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) {
            partial[threadIdx.x] += partial[threadIdx.x + s];
        }
        __syncthreads();
    }
    float rstd = rsqrtf(partial[0] / cols + eps);

    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        dst[j] = row[j] * rstd * weight[j];
    }
}

extern "C" void solve(const float* x, const float* weight, float* out, int rows, int cols, float eps) {
    rmsnorm_kernel<<<rows, THREADS>>>(x, weight, out, rows, cols, eps);
    cudaDeviceSynchronize();
}
