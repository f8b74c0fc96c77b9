// The byte layout of an interleaved record (quant_gemm.h): block b of eight rows of one format. Shared by the
// interleaving (quant_gemm.cc) and the kernels (quant_gemm_kernel.h).
//   kScales: the eight rows' fp16 scales d. Q4_1: then kMinima, their fp16 minima m.
//   Q5_0: kFifthBits, eight 32-bit masks, two a vector v of values: bit 4j + k of mask 2v + h is the fifth bit of
//     row j's value 16h + 4v + k (one bit a byte of the vector it completes).
//   kValues: 32-byte vectors whose lane j (4 bytes) holds row j's values. Q4_1, Q5_0: vector v (of 4) holds row j's
//     stored nibble bytes 4v..4v+3 (low nibbles: values 4v + k, high: 16 + 4v + k). Q8_0: vector v (of 8) holds
//     row j's values 4v..4v+3.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace inferd {

template <uint32_t kType>
struct RecordLayout {
  static constexpr int64_t kScales = 0;
  static constexpr int64_t kMinima = 16;                              // Q4_1
  static constexpr int64_t kFifthBits = 16;                           // Q5_0
  static constexpr int64_t kValues = kType == GGML_TYPE_Q4_1   ? 32   // after the minima
                                     : kType == GGML_TYPE_Q5_0 ? 48   // after the masks
                                                               : 16;  // Q8_0
  static constexpr int64_t kBytes = kValues + (kType == GGML_TYPE_Q8_0 ? 256 : 128);
  // Where the stored block (ggml's block_q4_1, block_q5_0, block_q8_0) keeps them.
  static constexpr int64_t kStoredBytes = kType == GGML_TYPE_Q4_1 ? 20 : kType == GGML_TYPE_Q5_0 ? 22 : 34;
  static constexpr int64_t kStoredValues = kType == GGML_TYPE_Q4_1 ? 4 : kType == GGML_TYPE_Q5_0 ? 6 : 2;
};

}  // namespace inferd
