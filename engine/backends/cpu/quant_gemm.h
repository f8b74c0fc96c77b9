// The cpu backend's products against GGUF weights in Q4_1, Q5_0, Q8_0 or Q4_K blocks, at every step (one stream's
// decode, many streams', a prompt's hundreds of rows). ggml's dot kernels (stored_matmul.h) take one weight row against
// one input row at a time: every weight block is unpacked again for each input row and every output pays a horizontal
// sum. Here the weights are interleaved once, at load, eight rows to a record per 32-value block (as ggml's repacked
// formats do for others): lane j of each 32-byte vector holds four values of row j, so one u8 × s8 dot-product
// instruction (AVX-512 VNNI's vpdpbusd where the CPU has it, else AVX2's maddubs + madd) advances eight outputs by four
// values of one input row, a block's int32 sums are scaled by the eight rows' scales at once, and the outputs come out
// as eight contiguous floats without a horizontal sum. The same bytes as stored, rearranged: the record holds the eight
// rows' fp16 scales (and Q4_1's minima), then their values (Q5_0's fifth bits as one 32-bit mask per vector); Q4_K's
// 256-value super-blocks as their eight 32-value sub-blocks, each row's scale and minimum the fp32 products ggml's
// dequantization forms (a record of 6 bits a value where the stored block takes 4.5).
// Inputs are quantized as ggml's dot kernels quantize them (Q8_0 blocks), so a product equals ggml's up to the order
// of its fp32 sums (ggml's Q4_1 kernel rounds each input block's sum to fp16; here it stays exact). x86 only;
// elsewhere CanInterleave is false.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backends/cpu/spin_pool.h"

namespace inferd {

// Rows of X quantized for InterleavedGemm: 32-value blocks, each int8 values, its scale and its scale × the values'
// sum.
// On CPUs with AVX-512 VNNI, the first wide_rows (a multiple of kWideRows) again in runs of kWideRows rows, as its
// kernel reads them: run R's block b holds, for each four values v of the block, the kWideRows rows' four (one
// 64-byte vector), then the rows' scales and scaled sums.
inline constexpr int64_t kWideRows = 16;
struct QuantizedRows {
  std::vector<int8_t> values;  // [rows, blocks * 32]
  std::vector<float> scale;    // [rows, blocks]
  std::vector<float> scaled_sum;
  int64_t rows = 0, blocks = 0;
  std::vector<int8_t> wide_values;  // [wide_rows / kWideRows, blocks, 8, kWideRows, 4]
  std::vector<float> wide_scale;    // [wide_rows / kWideRows, blocks, kWideRows]
  std::vector<float> wide_scaled_sum;
  int64_t wide_rows = 0;
};

// A matrix's rows interleaved eight to a record: record (g, b) holds block b of rows 8g..8g+7.
struct InterleavedRows {
  uint32_t ggml_type = 0;
  int64_t rows = 0, blocks = 0;  // rows a multiple of 8
  std::vector<uint8_t> records;  // groups × blocks records, a group's blocks in order
};

// What the kernels read (plain pointers: the kernels' translation units, compiled for other instruction sets,
// instantiate no library template, whose out-of-line copies the linker could pick for the rest of the binary).
struct QuantizedView {
  const int8_t* values;
  const float* scale;
  const float* scaled_sum;
  int64_t rows, blocks;
  const int8_t* wide_values;
  const float* wide_scale;
  const float* wide_scaled_sum;
  int64_t wide_rows;
};

// Whether `count` rows of `cols` values in this ggml type (GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0,
// GGML_TYPE_Q4_K) can be interleaved and multiplied on this CPU: count a multiple of 8, cols of 32 (Q4_K: 256).
bool CanInterleave(uint32_t ggml_type, int64_t count, int64_t cols);

// The rows (each `cols` values of ggml_type, as stored) interleaved; CanInterleave must hold.
InterleavedRows Interleave(uint32_t ggml_type, const uint8_t* const* rows, int64_t count, int64_t cols);

// Row `row` of w decoded to fp32 from its records, as ggml decodes the stored row (a tied embedding's lookup).
void InterleavedRowToFloat(const InterleavedRows& w, int64_t row, float* out);

// x [m, k] fp32 into *out; k a multiple of 32.
void QuantizeRows(const float* x, int64_t m, int64_t k, QuantizedRows* out);

// Which kernels InterleavedGemm runs: the best this CPU has, or the AVX2 ones wherever they run (tests check both).
enum class QuantIsa { kBest, kAvx2 };

// y[i * ldy + r] = x_i · w_r for every row i of x and every row r of w, the groups of eight rows split over the
// pool's threads.
void InterleavedGemm(const InterleavedRows& w, const QuantizedRows& x, float* y, int64_t ldy, SpinPool& pool,
                     QuantIsa isa = QuantIsa::kBest);

}  // namespace inferd
