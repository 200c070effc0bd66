// What one dependent phase of a decode step costs on a GPU, apart from its work (measured by
// benches/cuda_phases.rs; nothing in the forward pass launches these). A small model's decode
// is a chain of short phases (a llama layer: q/k/v, attention, output projection, gated FFN,
// down projection), each of which must see all of the one before it: here a phase is a kernel
// boundary (graph-replayed, programmatic or not) or a grid-wide barrier inside one kernel.

// A kernel boundary alone.
extern "C" __global__ void probe_empty() { pdl_begin(); }

// One phase over x and y of `n` floats: every block reads all of x (the phase before's output)
// and writes its slice of y, so that each phase depends on every block of the one before.
__device__ __forceinline__ void probe_phase(const float* x, float* y, int n) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    s = block_sum(s);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * 0.5f + s * 1e-9f;
}

extern "C" __global__ void probe_step(const float* x, float* y, int n) {
    pdl_begin();
    probe_phase(x, y, n);
}

// `steps` phases in one launch, x and y swapping, a grid-wide barrier between them: every
// block counts itself in (`count`, zero at launch: it ends at steps · gridDim.x) and waits
// for the others. The blocks must all be resident at once (one per SM, as the bench launches
// it); the software GPU, which runs blocks one at a time, cannot run it.
extern "C" __global__ void probe_persistent(float* a, float* b, int n, int steps, int* count) {
    pdl_begin();
    for (int s = 0; s < steps; ++s) {
        probe_phase(s & 1 ? b : a, s & 1 ? a : b, n);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(count, 1);
            int target = (s + 1) * (int)gridDim.x;
            while (*(volatile int*)count < target) {
            }
            __threadfence();
        }
        __syncthreads();
    }
}
