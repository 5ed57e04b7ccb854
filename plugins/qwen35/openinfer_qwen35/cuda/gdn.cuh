// Helpers shared by the Qwen3.5 Gated DeltaNet kernels (included after common.cuh).
#pragma once

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// The sequence has tokens before this run, so its state row is live; a run starting at position 0
// starts from a zero state (its row may hold an earlier request's state). Read from device arrays
// only, so a captured CUDA graph stays right as the batch changes.
__device__ __forceinline__ bool has_state(const int* query_start, const int* context_lens, int b) {
    return context_lens[b] > query_start[b + 1] - query_start[b];
}
