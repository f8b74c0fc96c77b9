// The byte layout of an interleaved record (quant_gemm.h): block b of eight rows of one format. Shared by the
// interleaving (quant_gemm.cc) and the kernels (quant_gemm_kernel.h).
//   kScales: the eight rows' fp16 scales d. Q4_1: then kMinima, their fp16 minima m.
//   Q5_0: kFifthBits, eight 32-bit masks, two a vector v of values: bit 4j + k of mask 2v + h is the fifth bit of
//     row j's value 16h + 4v + k (one bit a byte of the vector it completes).
//   Q4_K: one of a super-block's eight 32-value sub-blocks, each value d·q − m with d and m the super-block's fp16
//     scales times the sub-block's 6-bit ones: kScales holds the eight rows' d and kMinima their −m, as fp32 (the
//     products ggml's dequantization forms, exactly), and the values as Q4_1's.
//   kValues: 32-byte vectors whose lane j (4 bytes) holds row j's values. Q4_1, Q5_0, Q4_K: vector v (of 4) holds
//     row j's nibble bytes 4v..4v+3 (low nibbles: values 4v + k, high: 16 + 4v + k; Q4_K's repacked so). Q8_0:
//     vector v (of 8) holds row j's values 4v..4v+3.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace inferd {

template <uint32_t kType>
struct RecordLayout {
  static constexpr bool kFp32Scales = kType == GGML_TYPE_Q4_K;
  static constexpr bool kMinimum = kType == GGML_TYPE_Q4_1 || kType == GGML_TYPE_Q4_K;  // d·q + c, c stored
  static constexpr int64_t kScales = 0;
  static constexpr int64_t kMinima = kFp32Scales ? 32 : 16;           // Q4_1, Q4_K
  static constexpr int64_t kFifthBits = 16;                           // Q5_0
  static constexpr int64_t kValues = kType == GGML_TYPE_Q4_1   ? 32   // after the minima
                                     : kType == GGML_TYPE_Q5_0 ? 48   // after the masks
                                     : kType == GGML_TYPE_Q4_K ? 64   // after the fp32 minima
                                                               : 16;  // Q8_0
  static constexpr int64_t kBytes = kValues + (kType == GGML_TYPE_Q8_0 ? 256 : 128);
  // Where the stored block (ggml's block_q4_1, block_q5_0, block_q8_0; block_q4_K of 256 values) keeps them.
  static constexpr int64_t kStoredBytes = kType == GGML_TYPE_Q4_1   ? 20
                                          : kType == GGML_TYPE_Q5_0 ? 22
                                          : kType == GGML_TYPE_Q4_K ? 144
                                                                    : 34;
  static constexpr int64_t kStoredValues = kType == GGML_TYPE_Q4_1 ? 4 : kType == GGML_TYPE_Q5_0 ? 6 : 2;
};

}  // namespace inferd
