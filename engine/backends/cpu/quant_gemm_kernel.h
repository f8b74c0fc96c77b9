// QuantGemm's tile kernel (quant_gemm.h), included by one translation unit per instruction set
// (quant_gemm_avx2.cc, quant_gemm_avx512.cc), each compiled for its own: everything here has internal linkage, so
// each unit keeps its own copy, and nothing here instantiates a library template (the linker may keep any unit's
// out-of-line copy of one for the whole binary, which must run on CPUs without these instructions). The unit defines
// QUANT_GEMM_VNNI (1: AVX-512 VNNI's u8 × s8 dot products into int32, 0: AVX2's maddubs + madd) before including it.
//
// A weight block's product with an input block x = d_x · q_x, per format:
//   Q4_1: w = d · q + m, q in [0, 15]:  Σ w x = d_w d_x Σ q_w q_x + m_w · (d_x Σ q_x)
//   Q5_0: w = d · (q − 16), q in [0, 31]:  Σ w x = d_w d_x Σ q_w q_x − 16 d_w · (d_x Σ q_x)
//   Q8_0 (VNNI: q + 128 as unsigned): Σ w x = d_w d_x Σ (q_w + 128) q_x − 128 d_w · (d_x Σ q_x)
//   Q8_0 (AVX2: |q_w| times q_x with q_w's sign, as ggml does):  Σ w x = d_w d_x Σ |q_w| sign(q_x, q_w)
// so every format is Σ_blocks d_w d_x · (an int32 dot) + Σ_blocks c_w · (d_x Σ q_x), the second a short dot over the
// blocks of per-row constants (QuantizedRows::scaled_sum).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/backends/cpu/quant_gemm.h"
#include "ggml.h"

namespace inferd {
namespace {

constexpr int kTileW = 4, kTileX = 4;  // weight rows × input rows a tile
// Bytes a block of 32 weights takes.
template <uint32_t kType>
constexpr int64_t kBlockBytes = kType == GGML_TYPE_Q4_1   ? 20
                                : kType == GGML_TYPE_Q5_0 ? 22
                                                          : 34;

float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A weight block's 32 values as unsigned bytes for Dp, and its scale and constant.
// 16 bytes of nibbles as 32 bytes: the low nibbles (values 0-15), then the high ones (16-31).
__m256i Nibbles(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i low = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
}

// 0x10 in byte j where bit j of the 32 bits at p is set.
__m256i FifthBits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  // Byte j takes the bits' byte j / 8, then keeps bit j % 8 of it.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

template <uint32_t kType>
__m256i LoadWeights(const uint8_t* block) {
  if constexpr (kType == GGML_TYPE_Q4_1) {
    return Nibbles(block + 4);
  } else if constexpr (kType == GGML_TYPE_Q5_0) {
    return _mm256_or_si256(Nibbles(block + 6), FifthBits(block + 2));
  } else {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
#if QUANT_GEMM_VNNI
    return _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80)));
#else
    return q;  // signed: Dp takes |q| and moves its sign onto x
#endif
  }
}

template <uint32_t kType>
void BlockConstants(const uint8_t* block, float* scale, float* constant) {
  *scale = HalfToFloat(block);
  if constexpr (kType == GGML_TYPE_Q4_1) {
    *constant = HalfToFloat(block + 2);
  } else if constexpr (kType == GGML_TYPE_Q5_0) {
    *constant = -16.0f * *scale;
  } else {
    *constant = QUANT_GEMM_VNNI ? -128.0f * *scale : 0.0f;
  }
}

// Eight int32 lanes summing the 32 products of a weight block (LoadWeights') and an input block.
template <uint32_t kType>
__m256i Dp(__m256i w, __m256i x) {
#if QUANT_GEMM_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
  __m256i u = w, s = x;
  if constexpr (kType == GGML_TYPE_Q8_0) u = _mm256_sign_epi8(w, w), s = _mm256_sign_epi8(x, w);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

float HorizontalSum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// y[i * ldy + r] for R weight rows and N input rows (rows x0 ..): the main sums block by block in registers.
// scale / constant: the R rows' per-block scales and constants ([R][blocks]).
template <uint32_t kType, int R, int N>
void Tile(const uint8_t* const* w, const float* scale, const float* constant, const QuantizedView& x, int64_t x0,
          float* y, int64_t ldy) {
  constexpr int64_t kBytes = kBlockBytes<kType>;
  const int64_t blocks = x.blocks;
  __m256 acc[R][N];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) acc[r][i] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i xv[N];
    __m256 xd[N];
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) {
      xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.values + ((x0 + i) * blocks + b) * 32));
      xd[i] = _mm256_set1_ps(x.scale[(x0 + i) * blocks + b]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i wv = LoadWeights<kType>(w[r] + b * kBytes);
      const __m256 wd = _mm256_set1_ps(scale[r * blocks + b]);
#pragma GCC unroll 4
      for (int i = 0; i < N; ++i) {
        const __m256 p = _mm256_cvtepi32_ps(Dp<kType>(wv, xv[i]));
        acc[r][i] = _mm256_fmadd_ps(p, _mm256_mul_ps(wd, xd[i]), acc[r][i]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) {
      const float* c = constant + r * blocks;
      const float* s = x.scaled_sum + (x0 + i) * blocks;
      float extra = 0;
      for (int64_t b = 0; b < blocks; ++b) extra += c[b] * s[b];
      y[(x0 + i) * ldy + r] = HorizontalSum(acc[r][i]) + extra;
    }
  }
}

template <uint32_t kType, int R>
void TileRows(const uint8_t* const* w, const float* scale, const float* constant, const QuantizedView& x, float* y,
              int64_t ldy) {
  int64_t i = 0;
  for (; i + kTileX <= x.rows; i += kTileX) Tile<kType, R, kTileX>(w, scale, constant, x, i, y, ldy);
  switch (x.rows - i) {
    case 3:
      return Tile<kType, R, 3>(w, scale, constant, x, i, y, ldy);
    case 2:
      return Tile<kType, R, 2>(w, scale, constant, x, i, y, ldy);
    case 1:
      return Tile<kType, R, 1>(w, scale, constant, x, i, y, ldy);
  }
}

// Weight rows [0, count) of `rows` against every row of x; scratch holds 2 · kTileW · x.blocks floats.
template <uint32_t kType>
void Rows(const uint8_t* const* rows, int64_t count, const QuantizedView& x, float* y, int64_t ldy, float* scratch) {
  constexpr int64_t kBytes = kBlockBytes<kType>;
  const int64_t blocks = x.blocks;
  float* scale = scratch;
  float* constant = scratch + kTileW * blocks;
  for (int64_t r0 = 0; r0 < count; r0 += kTileW) {
    const int n = count - r0 < kTileW ? static_cast<int>(count - r0) : kTileW;
    for (int r = 0; r < n; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        BlockConstants<kType>(rows[r0 + r] + b * kBytes, &scale[r * blocks + b], &constant[r * blocks + b]);
      }
    }
    switch (n) {
      case 4:
        TileRows<kType, 4>(rows + r0, scale, constant, x, y + r0, ldy);
        break;
      case 3:
        TileRows<kType, 3>(rows + r0, scale, constant, x, y + r0, ldy);
        break;
      case 2:
        TileRows<kType, 2>(rows + r0, scale, constant, x, y + r0, ldy);
        break;
      default:
        TileRows<kType, 1>(rows + r0, scale, constant, x, y + r0, ldy);
    }
  }
}

}  // namespace
}  // namespace inferd
