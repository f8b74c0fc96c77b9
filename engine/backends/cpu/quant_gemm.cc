#include "engine/backends/cpu/quant_gemm.h"

#include <algorithm>
#include <cstring>

#include "ggml-cpu.h"
#include "ggml.h"

namespace inferd {

#if defined(__x86_64__)
// quant_gemm_avx2.cc, quant_gemm_avx512.cc.
void QuantGemmRowsAvx2(uint32_t ggml_type, const uint8_t* const* rows, int64_t count, const QuantizedView& x, float* y,
                       int64_t ldy, float* scratch);
void QuantGemmRowsAvx512Vnni(uint32_t ggml_type, const uint8_t* const* rows, int64_t count, const QuantizedView& x,
                             float* y, int64_t ldy, float* scratch);
#endif

namespace {

enum class Isa { kNone, kAvx2, kAvx512Vnni };

Isa Detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) {
    return Isa::kNone;
  }
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw")) {
    return Isa::kAvx512Vnni;
  }
  return Isa::kAvx2;
#else
  return Isa::kNone;
#endif
}

Isa Available() {
  static const Isa isa = Detect();
  return isa;
}

// Multiply-adds a thread's share holds at least (as stored_matmul.cc's).
constexpr int64_t kSplitWork = int64_t{1} << 15;
constexpr int64_t kTile = 4;  // weight rows a kernel tile takes (quant_gemm_kernel.h)
constexpr int64_t kQ8Bytes = 34;

}  // namespace

bool QuantGemmTakes(uint32_t ggml_type) {
  return Available() != Isa::kNone &&
         (ggml_type == GGML_TYPE_Q4_1 || ggml_type == GGML_TYPE_Q5_0 || ggml_type == GGML_TYPE_Q8_0);
}

void QuantizeRows(const float* x, int64_t m, int64_t k, QuantizedRows* out) {
  const int64_t blocks = k / 32;
  out->rows = m;
  out->blocks = blocks;
  out->values.resize(m * blocks * 32);
  out->scale.resize(m * blocks);
  out->scaled_sum.resize(m * blocks);
  static const bool ready = (ggml_cpu_init(), true);  // ggml's CPU tables, before its first kernel
  (void)ready;
  const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
  thread_local std::vector<uint8_t> row;  // one row in Q8_0 blocks: ggml's quantization, as its dot kernels take
  row.resize(blocks * kQ8Bytes);
  for (int64_t i = 0; i < m; ++i) {
    quantize(x + i * k, row.data(), k);
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = row.data() + b * kQ8Bytes;
      uint16_t half;
      std::memcpy(&half, block, 2);
      const float scale = ggml_fp16_to_fp32(half);
      int8_t* values = out->values.data() + (i * blocks + b) * 32;
      std::memcpy(values, block + 2, 32);
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) sum += values[j];
      out->scale[i * blocks + b] = scale;
      out->scaled_sum[i * blocks + b] = scale * static_cast<float>(sum);
    }
  }
}

void QuantGemm(uint32_t ggml_type, const uint8_t* const* rows, int64_t count, const QuantizedRows& x, float* y,
               int64_t ldy, SpinPool& pool, QuantIsa isa) {
#if defined(__x86_64__)
  const auto kernel =
      Available() == Isa::kAvx512Vnni && isa == QuantIsa::kBest ? QuantGemmRowsAvx512Vnni : QuantGemmRowsAvx2;
  const int64_t tiles = (count + kTile - 1) / kTile;
  const int64_t grain = std::max<int64_t>(1, kSplitWork / (kTile * x.rows * x.blocks * 32));
  const QuantizedView view{x.values.data(), x.scale.data(), x.scaled_sum.data(), x.rows, x.blocks};
  pool.For(tiles, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;  // the thread's own, kept between calls
    scratch.resize(2 * kTile * x.blocks);
    const int64_t r0 = begin * kTile, r1 = std::min(end * kTile, count);
    kernel(ggml_type, rows + r0, r1 - r0, view, y + r0, ldy, scratch.data());
  });
#endif
}

}  // namespace inferd
