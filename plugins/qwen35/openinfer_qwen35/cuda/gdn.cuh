// Helpers shared by the Qwen3.5 Gated DeltaNet kernels (included after common.cuh).
#pragma once

constexpr int DK_MAX = 128;  // dk of every Qwen3.5 / Qwen3-Next checkpoint; the launchers check it
constexpr int BV = 32;       // state columns per block (the delta rule's kernels): one per lane

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// The sequence has tokens before this run, so its state row is live; a run starting at position 0
// starts from a zero state (its row may hold an earlier request's state). Read from device arrays
// only, so a captured CUDA graph stays right as the batch changes.
__device__ __forceinline__ bool has_state(const int* query_start, const int* context_lens, int b) {
    return context_lens[b] > query_start[b + 1] - query_start[b];
}

// The GDN gating of one (token, value head): (g, beta) = (-exp(A_log) * softplus(a + dt_bias), sigmoid(b)).
// One definition for gdn_gating (gates.cu) and the decode step that computes its own (delta_rule.cu): the same bits.
__device__ __forceinline__ float2 gdn_gate(float a, float b, float A_log, float dt_bias) {
    const float x = a + dt_bias;
    const float softplus = fmaxf(x, 0.f) + log1pf(expf(-fabsf(x)));   // = log(1 + e^x), no overflow
    return make_float2(-expf(A_log) * softplus, 1.f / (1.f + expf(-b)));
}
