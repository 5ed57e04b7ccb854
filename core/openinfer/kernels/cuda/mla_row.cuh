// MLA's latent cache row (mla.cu, mla_latent.cu): MLA_D = 576 bf16 a token, the normalised compressed KV c in
// [0, MLA_R) then the rotated k_pe in [MLA_R, MLA_D).
#pragma once

constexpr int MLA_R = 512;                          // latent width: V's columns, an output row
constexpr int MLA_P = 64, MLA_D = MLA_R + MLA_P;    // rope width, cache row
constexpr int MLA_CHUNKS = MLA_D / 8;               // 16-byte chunks of a row
