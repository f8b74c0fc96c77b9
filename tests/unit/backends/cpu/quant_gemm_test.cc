// InterleavedGemm (engine/backends/cpu/quant_gemm.h), the cpu backend's products of a few input rows against Q4_1,
// Q5_0, Q8_0 and Q4_K weights interleaved eight rows to a record, against the fp64 product of the same numbers: the
// weights decoded and the inputs as QuantizeRows made them (so only the kernels' fp32 sums differ: 1e-6 of Σ|x||w|),
// for 1 to 48 input rows (runs of 16 with AVX-512, passes of 4 and every remainder), one group of rows to many, one
// block to many, each instruction set this CPU runs; a row's outputs the same bits alone as beside others; which shapes
// interleave; and QuantizeRows against the inputs within a Q8_0 step (of the fp16-rounded scale).
#include "engine/backends/cpu/quant_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/backends/cpu/stored_matmul.h"
#include "engine/model/model_tensors.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace inferd {
namespace {

struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<const uint8_t*> rows;
  std::vector<float> decoded;
};

Weights Make(ggml_type type, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> values(rows * cols);
  for (float& v : values) v = d(rng);
  Weights w;
  const size_t row_bytes = ggml_row_size(type, cols);
  w.bytes.assign(row_bytes * rows, 0);
  ggml_quantize_chunk(type, values.data(), w.bytes.data(), 0, rows, cols, nullptr);
  w.decoded.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    w.rows.push_back(w.bytes.data() + r * row_bytes);
    ggml_get_type_traits(type)->to_float(w.rows.back(), w.decoded.data() + r * cols, cols);
  }
  return w;
}

// The worst |y - want| / Σ|x||w| over every output.
double WorstShare(ggml_type type, int64_t rows, int64_t cols, int64_t m, QuantIsa isa, std::mt19937& rng) {
  const Weights w = Make(type, rows, cols, rng);
  const InterleavedRows interleaved = Interleave(type, w.rows.data(), rows, cols);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(m * cols);
  for (float& v : x) v = d(rng);
  QuantizedRows q;
  QuantizeRows(x.data(), m, cols, &q);
  const int64_t ldy = rows + 3;  // outputs strided as a part of a wider matrix's
  std::vector<float> y(m * ldy, -1.f);
  static SpinPool pool(3);
  InterleavedGemm(interleaved, q, y.data(), ldy, pool, isa);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0, size = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double xq = double(q.values[i * cols + c]) * q.scale[i * (cols / 32) + c / 32];
        want += xq * w.decoded[r * cols + c];
        size += std::abs(xq * w.decoded[r * cols + c]);
      }
      worst = std::max(worst, std::abs(y[i * ldy + r] - want) / size);
    }
    for (int64_t r = rows; r < ldy; ++r) EXPECT_EQ(y[i * ldy + r], -1.f) << "wrote past its rows";
  }
  return worst;
}

TEST(InterleavedGemm, EqualsTheProductOfTheQuantizedNumbers) {
  if (!CanInterleave(GGML_TYPE_Q4_1, 8, 32)) GTEST_SKIP() << "this CPU lacks the kernels' instructions";
  std::mt19937 rng(11);
  for (const QuantIsa isa : {QuantIsa::kBest, QuantIsa::kAvx2}) {
    for (const ggml_type type : {GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K}) {
      // Q4_K: whole super-blocks of 256, one to several
      const std::vector<std::pair<int64_t, int64_t>> shapes =
          type == GGML_TYPE_Q4_K ? std::vector<std::pair<int64_t, int64_t>>{{8, 256}, {24, 768}, {64, 1536}}
                                 : std::vector<std::pair<int64_t, int64_t>>{{8, 32}, {16, 96}, {24, 576}, {64, 1536}};
      for (const int64_t m : {1, 2, 3, 4, 5, 7, 16, 31, 48}) {  // 16 on: runs of 16 rows (AVX-512), then tiles
        for (const auto& [rows, cols] : shapes) {
          const double worst = WorstShare(type, rows, cols, m, isa, rng);
          EXPECT_LT(worst, 1e-6) << ggml_type_name(type) << " " << rows << "x" << cols << ", " << m << " rows"
                                 << (isa == QuantIsa::kAvx2 ? ", AVX2" : "");
        }
      }
    }
  }
}

// A row's outputs are the same bits whichever kernel took it (a run of 16 rows, a tile of 4, a remainder) and
// whatever rows came with it: a request's tokens do not depend on the batch it ran in.
TEST(InterleavedGemm, ARowsOutputsDoNotDependOnTheRowsBesideIt) {
  if (!CanInterleave(GGML_TYPE_Q4_1, 8, 32)) GTEST_SKIP() << "this CPU lacks the kernels' instructions";
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 1.f);
  static SpinPool pool(2);
  for (const ggml_type type : {GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K}) {
    const int64_t rows = 24, cols = type == GGML_TYPE_Q4_K ? 512 : 320, m = 37;
    const Weights w = Make(type, rows, cols, rng);
    const InterleavedRows interleaved = Interleave(type, w.rows.data(), rows, cols);
    std::vector<float> x(m * cols);
    for (float& v : x) v = d(rng);
    QuantizedRows all;
    QuantizeRows(x.data(), m, cols, &all);
    std::vector<float> y(m * rows);
    InterleavedGemm(interleaved, all, y.data(), rows, pool);
    for (int64_t i = 0; i < m; ++i) {
      QuantizedRows one;
      QuantizeRows(x.data() + i * cols, 1, cols, &one);
      std::vector<float> alone(rows);
      InterleavedGemm(interleaved, one, alone.data(), rows, pool);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(y[i * rows + r], alone[r]) << ggml_type_name(type) << " row " << i << " output " << r;
      }
    }
  }
}

// A row decoded from the records (a tied embedding's lookup, once the stored pages are given back) is ggml's decoding
// of the stored row, to the last place that one rounding of its products may move.
TEST(InterleavedRowToFloat, DecodesEachRowAsGgmlDecodesTheStoredRow) {
  if (!CanInterleave(GGML_TYPE_Q4_1, 8, 32)) GTEST_SKIP() << "this CPU lacks the kernels' instructions";
  std::mt19937 rng(17);
  for (const ggml_type type : {GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K}) {
    const int64_t rows = 16, cols = 512;
    const Weights w = Make(type, rows, cols, rng);
    const InterleavedRows interleaved = Interleave(type, w.rows.data(), rows, cols);
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      InterleavedRowToFloat(interleaved, r, row.data());
      for (int64_t c = 0; c < cols; ++c) {
        const float want = w.decoded[r * cols + c];
        EXPECT_NEAR(row[c], want, 2e-7f * std::abs(want) + 1e-30f)
            << ggml_type_name(type) << " row " << r << " col " << c;
      }
    }
  }
}

TEST(InterleavedGemm, TakesGroupsOfEightRowsOfWholeBlocksInItsFormats) {
  if (!CanInterleave(GGML_TYPE_Q4_1, 8, 32)) GTEST_SKIP() << "this CPU lacks the kernels' instructions";
  EXPECT_TRUE(CanInterleave(GGML_TYPE_Q5_0, 576, 1536));
  EXPECT_TRUE(CanInterleave(GGML_TYPE_Q8_0, 49152, 576));
  EXPECT_FALSE(CanInterleave(GGML_TYPE_Q8_0, 12, 576));  // rows not a multiple of 8
  EXPECT_FALSE(CanInterleave(GGML_TYPE_Q8_0, 16, 48));   // columns not of 32
  EXPECT_TRUE(CanInterleave(GGML_TYPE_Q4_K, 16, 256));
  EXPECT_FALSE(CanInterleave(GGML_TYPE_Q4_K, 16, 96));   // not whole super-blocks
  EXPECT_FALSE(CanInterleave(GGML_TYPE_Q6_K, 16, 256));  // a format the kernels do not read
  EXPECT_FALSE(CanInterleave(GGML_TYPE_F16, 16, 256));
}

TEST(QuantizeRows, QuantizesEachBlockByItsLargestValue) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 4.f);
  const int64_t m = 3, cols = 96;
  std::vector<float> x(m * cols);
  for (float& v : x) v = d(rng);
  x[40] = 0;  // a block with zeros in it, and one all zero
  for (int c = 64; c < 96; ++c) x[cols + c] = 0;
  QuantizedRows q;
  QuantizeRows(x.data(), m, cols, &q);
  ASSERT_EQ(q.blocks, 3);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < q.blocks; ++b) {
      const float scale = q.scale[i * 3 + b];
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) {
        const int64_t c = b * 32 + j;
        // Half a step, plus the scale's rounding to fp16 (2^-11 of it) over up to 127 steps.
        EXPECT_LE(std::abs(q.values[i * cols + c] * scale - x[i * cols + c]), (0.5f + 127.f / 2048) * scale)
            << "row " << i << " column " << c;
        sum += q.values[i * cols + c];
      }
      EXPECT_FLOAT_EQ(q.scaled_sum[i * 3 + b], scale * sum);
    }
  }
  EXPECT_EQ(q.scale[1 * 3 + 2], 0.f);
}

}  // namespace
}  // namespace inferd
