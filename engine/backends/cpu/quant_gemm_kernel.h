// InterleavedGemm's kernel (quant_gemm.h), included by one translation unit per instruction set
// (quant_gemm_avx2.cc, quant_gemm_avx512.cc), each compiled for its own: everything here has internal linkage, so
// each unit keeps its own copy, and nothing here instantiates a library template (the linker may keep any unit's
// out-of-line copy of one for the whole binary, which must run on CPUs without these instructions). The unit defines
// QUANT_GEMM_VNNI (1: AVX-512 VNNI's u8 × s8 dot products into int32, 0: AVX2's maddubs + madd) before including it.
//
// A weight block's product with an input block x = d_x · q_x, per format:
//   Q4_1, Q4_K: w = d · q + m, q in [0, 15]:  Σ w x = d_w d_x Σ q_w q_x + m_w · (d_x Σ q_x)
//   Q5_0: w = d · (q − 16), q in [0, 31]:  Σ w x = d_w d_x Σ q_w q_x − 16 d_w · (d_x Σ q_x)
//   Q8_0 (VNNI: q + 128 as unsigned): Σ w x = d_w d_x Σ (q_w + 128) q_x − 128 d_w · (d_x Σ q_x)
//   Q8_0 (AVX2: |q_w| times q_x with q_w's sign, as ggml does):  Σ w x = d_w d_x Σ |q_w| sign(q_x, q_w)
// so every format is Σ_blocks (d_w d_x · an int32 dot + c_w · (d_x Σ q_x)), eight rows' at once in a vector.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/backends/cpu/quant_gemm.h"
#include "engine/backends/cpu/quant_gemm_layout.h"
#include "ggml.h"

namespace inferd {
namespace {

constexpr int kTileX = 4;  // input rows a pass over a group's records takes

// 0x10 in byte n where bit n of the 32 bits at p is set.
__attribute__((always_inline)) inline __m256i FifthBits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  // Byte n takes the bits' byte n / 8, then keeps bit n % 8 of it.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// sum + the eight lanes' dot products of four u8 weights (w) and four s8 inputs (x), Q8_0's weights signed.
template <uint32_t kType>
__m256i Dp(__m256i sum, __m256i w, __m256i x) {
#if QUANT_GEMM_VNNI
  return _mm256_dpbusd_epi32(sum, w, x);
#else
  __m256i u = w, s = x;
  if constexpr (kType == GGML_TYPE_Q8_0) u = _mm256_sign_epi8(w, w), s = _mm256_sign_epi8(x, w);
  return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// The record's eight rows' scales d, and the constants c of the formats that store them (Q4_1's minima, Q4_K's −m).
template <uint32_t kType>
__m256 Scales(const uint8_t* rec) {
  if constexpr (RecordLayout<kType>::kFp32Scales) return _mm256_loadu_ps(reinterpret_cast<const float*>(rec));
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec)));
}
template <uint32_t kType>
__m256 Minima(const uint8_t* rec) {
  const uint8_t* p = rec + RecordLayout<kType>::kMinima;
  if constexpr (RecordLayout<kType>::kFp32Scales) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The constants c of the eight rows' w = d · q + c: Q4_1's minima and Q4_K's −m as stored, Q5_0's −16 d, Q8_0's −128 d
// where VNNI reads its values as unsigned (q + 128), else none (AVX2 takes them signed).
template <uint32_t kType>
__attribute__((always_inline)) inline __m256 Constants(const uint8_t* rec, __m256 d) {
  if constexpr (RecordLayout<kType>::kMinimum) return Minima<kType>(rec);
  if constexpr (kType == GGML_TYPE_Q5_0) return _mm256_mul_ps(d, _mm256_set1_ps(-16.0f));
  return _mm256_mul_ps(d, _mm256_set1_ps(QUANT_GEMM_VNNI ? -128.0f : 0.0f));
}

// Vector v (of 4) of a nibble format's record as two vectors of values: lo (values 4v..4v+3 of each row) and hi
// (16 + 4v..), Q5_0's fifth bits added.
template <uint32_t kType>
__attribute__((always_inline)) inline void Nibbles(const uint8_t* rec, int v, __m256i* lo, __m256i* hi) {
  using L = RecordLayout<kType>;
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + L::kValues + 32 * v));
  *lo = _mm256_and_si256(packed, low);
  *hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
  if constexpr (kType == GGML_TYPE_Q5_0) {
    *lo = _mm256_or_si256(*lo, FifthBits(rec + L::kFifthBits + 8 * v));
    *hi = _mm256_or_si256(*hi, FifthBits(rec + L::kFifthBits + 8 * v + 4));
  }
}

__m256i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Rows 8g..8g+7 (the group's records) against input rows x0..x0+N-1: y[(x0 + i) * ldy + 0..7].
template <uint32_t kType, int N>
void GroupTile(const uint8_t* records, const QuantizedView& x, int64_t x0, float* y, int64_t ldy) {
  using L = RecordLayout<kType>;
  const int64_t blocks = x.blocks;
  __m256 acc[N];
#pragma GCC unroll 4
  for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* rec = records + b * L::kBytes;
    const __m256 d = Scales<kType>(rec);
    const __m256 c = Constants<kType>(rec, d);
    const int8_t* xb[N];
    __m256i sum[N];
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) xb[i] = x.values + ((x0 + i) * blocks + b) * 32, sum[i] = _mm256_setzero_si256();
    const uint8_t* q = rec + L::kValues;
    if constexpr (kType == GGML_TYPE_Q8_0) {
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) {
        __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * v));
        if (QUANT_GEMM_VNNI) w = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) sum[i] = Dp<kType>(sum[i], w, Broadcast4(xb[i] + 4 * v));
      }
    } else {
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        __m256i lo, hi;
        Nibbles<kType>(rec, v, &lo, &hi);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          sum[i] = Dp<kType>(sum[i], lo, Broadcast4(xb[i] + 4 * v));
          sum[i] = Dp<kType>(sum[i], hi, Broadcast4(xb[i] + 16 + 4 * v));
        }
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) {
      const int64_t at = (x0 + i) * blocks + b;
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i]), _mm256_mul_ps(d, _mm256_set1_ps(x.scale[at])), acc[i]);
      acc[i] = _mm256_fmadd_ps(c, _mm256_set1_ps(x.scaled_sum[at]), acc[i]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < N; ++i) _mm256_storeu_ps(y + (x0 + i) * ldy, acc[i]);
}

#if QUANT_GEMM_VNNI
// Rows 8g..8g+7 against input rows 16·run..16·run+15 (QuantizedRows' wide runs), the roles turned round: a 64-byte
// vector holds four values of each of the sixteen input rows, and one weight row's four values, broadcast, advance its
// sixteen outputs at once. A block costs 8 vector loads of the inputs and 64 four-byte broadcasts of the weights for
// 4,096 multiply-adds, where four passes of GroupTile<4> load 160 times (8 vectors and 32 broadcasts each): on the
// Gemma 3 LM head at 16 streams the tiles waited on their broadcasts. Each output's fp32 arithmetic is GroupTile's, in
// the same order, so a row's result does not depend on which kernel took it.
template <uint32_t kType>
void GroupWide(const uint8_t* records, const QuantizedView& x, int64_t run, float* y, int64_t ldy) {
  using L = RecordLayout<kType>;
  const int64_t blocks = x.blocks;
  __m512 acc[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) acc[j] = _mm512_setzero_ps();
  alignas(64) uint8_t quads[8][32];  // the block's values as u8: vector v, lane j = row j's values 4v..4v+3
  alignas(32) float dw[8], cw[8];
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* rec = records + b * L::kBytes;
    const __m256 d = Scales<kType>(rec);
    const __m256 c = Constants<kType>(rec, d);
    _mm256_store_ps(dw, d);
    _mm256_store_ps(cw, c);
    const uint8_t* q = rec + L::kValues;
    if constexpr (kType == GGML_TYPE_Q8_0) {
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * v));
        _mm256_store_si256(reinterpret_cast<__m256i*>(quads[v]),
                           _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))));
      }
    } else {
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        __m256i lo, hi;
        Nibbles<kType>(rec, v, &lo, &hi);
        _mm256_store_si256(reinterpret_cast<__m256i*>(quads[v]), lo);      // values 4v..4v+3
        _mm256_store_si256(reinterpret_cast<__m256i*>(quads[4 + v]), hi);  // values 16 + 4v..
      }
    }
    // Read back from memory below: a broadcast from memory is a load alone, where the compiler would otherwise keep
    // the vectors in registers and pull each lane out with shuffles.
    asm volatile("" : : "r"(quads), "r"(dw), "r"(cw) : "memory");
    const int64_t at = run * blocks + b;
    const int8_t* xq = x.wide_values + at * 8 * 64;
    __m512i xv[8];
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) xv[v] = _mm512_loadu_si512(xq + 64 * v);
    const __m512 dx = _mm512_loadu_ps(x.wide_scale + at * 16);
    const __m512 sx = _mm512_loadu_ps(x.wide_scaled_sum + at * 16);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) {
        int32_t w4;
        std::memcpy(&w4, quads[v] + 4 * j, 4);
        sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi32(w4), xv[v]);
      }
      // (maskz: GCC 12's plain form reads an undefined vector and warns.)
      acc[j] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, sum), _mm512_mul_ps(_mm512_set1_ps(dw[j]), dx), acc[j]);
      acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(cw[j]), sx, acc[j]);
    }
  }
  alignas(64) float out[8][16];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) _mm512_store_ps(out[j], acc[j]);
  for (int r = 0; r < 16; ++r) {
    float* row = y + (run * 16 + r) * ldy;
    for (int j = 0; j < 8; ++j) row[j] = out[j][r];
  }
}
#endif

// Groups [g0, g1) of w's records against every row of x.
template <uint32_t kType>
void Groups(const uint8_t* records, int64_t g0, int64_t g1, const QuantizedView& x, float* y, int64_t ldy) {
  const int64_t group_bytes = x.blocks * RecordLayout<kType>::kBytes;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* rec = records + g * group_bytes;
    float* out = y + g * 8;
    int64_t i = 0;
#if QUANT_GEMM_VNNI
    for (; i < x.wide_rows; i += 16) GroupWide<kType>(rec, x, i / 16, out, ldy);
#endif
    for (; i + kTileX <= x.rows; i += kTileX) GroupTile<kType, kTileX>(rec, x, i, out, ldy);
    switch (x.rows - i) {
      case 3:
        GroupTile<kType, 3>(rec, x, i, out, ldy);
        break;
      case 2:
        GroupTile<kType, 2>(rec, x, i, out, ldy);
        break;
      case 1:
        GroupTile<kType, 1>(rec, x, i, out, ldy);
        break;
    }
  }
}

}  // namespace
}  // namespace inferd
