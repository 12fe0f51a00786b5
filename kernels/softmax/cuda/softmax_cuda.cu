// softmax, a first version in CUDA C: row-wise softmax of a float32 (rows, cols) matrix, one block of
// 256 threads per row; the row's max and sum reduced through shared memory, three passes over the row.
#include <cuda_runtime.h>

#define THREADS 256

__global__ void softmax_kernel(const float* x, float* out, int rows, int cols) {
    __shared__ float partial[THREADS];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* dst = out + (size_t)blockIdx.x * cols;

    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        m = fmaxf(m, row[j]);
    }
    partial[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) {
            partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + s]);
        }
        __syncthreads();
    }
    float row_max = partial[0];
    __syncthreads();

    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        sum += expf(row[j] - row_max);
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) {
            partial[threadIdx.x] += partial[threadIdx.x + s];
        }
        __syncthreads();
    }
    float row_sum = partial[0];

    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        dst[j] = expf(row[j] - row_max) / row_sum;
    }
}

extern "C" void solve(const float* x, float* out, int rows, int cols) {
    softmax_kernel<<<rows, THREADS>>>(x, out, rows, cols);
    cudaDeviceSynchronize();
}
