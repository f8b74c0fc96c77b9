#include "engine/backends/cpu/quant_gemm.h"

#include <algorithm>
#include <cstring>

#include "engine/backends/cpu/quant_gemm_layout.h"
#include "engine/backends/cpu/stored_matmul.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace inferd {

#if defined(__x86_64__)
// quant_gemm_avx2.cc, quant_gemm_avx512.cc.
void InterleavedGroupsAvx2(uint32_t ggml_type, const uint8_t* records, int64_t g0, int64_t g1, const QuantizedView& x,
                           float* y, int64_t ldy);
void InterleavedGroupsAvx512Vnni(uint32_t ggml_type, const uint8_t* records, int64_t g0, int64_t g1,
                                 const QuantizedView& x, float* y, int64_t ldy);
#endif

namespace {

enum class Isa { kNone, kAvx2, kAvx512Vnni };

Isa Detect() {
#if defined(__x86_64__)
  if (!StoredKernelsAvailable()) return Isa::kNone;  // AVX2, FMA, F16C (and BMI2, which every such CPU has)
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
constexpr int64_t kQ8Bytes = 34;

int64_t RecordBytes(uint32_t type) {
  switch (type) {
    case GGML_TYPE_Q4_1:
      return RecordLayout<GGML_TYPE_Q4_1>::kBytes;
    case GGML_TYPE_Q5_0:
      return RecordLayout<GGML_TYPE_Q5_0>::kBytes;
    case GGML_TYPE_Q4_K:
      return RecordLayout<GGML_TYPE_Q4_K>::kBytes;
    default:
      return RecordLayout<GGML_TYPE_Q8_0>::kBytes;
  }
}

// ggml's get_scale_min_k4: sub-block s's 6-bit scale and minimum from a Q4_K super-block's 12 packed bytes.
void ScaleMinK4(int s, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (s < 4) {
    *d = q[s] & 63;
    *m = q[s + 4] & 63;
  } else {
    *d = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
    *m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
}

// Record (g, b) of Q4_K rows: block b is sub-block b % 8 of super-block b / 8 (block_q4_K: fp16 d and dmin, 12 bytes
// of 6-bit scales and minima, then 128 bytes whose low nibbles hold sub-block 2c's values and high nibbles 2c + 1's,
// c = 0..3, 32 bytes each).
void FillQ4K(const uint8_t* const* rows, int64_t b, uint8_t* rec) {
  using L = RecordLayout<GGML_TYPE_Q4_K>;
  const int s = static_cast<int>(b % 8);
  for (int j = 0; j < 8; ++j) {
    const uint8_t* block = rows[j] + b / 8 * L::kStoredBytes;
    uint16_t h[2];
    std::memcpy(h, block, 4);
    uint8_t sc, mn;
    ScaleMinK4(s, block + 4, &sc, &mn);
    const float d = ggml_fp16_to_fp32(h[0]) * sc, minus_m = -(ggml_fp16_to_fp32(h[1]) * mn);  // as ggml rounds
    std::memcpy(rec + L::kScales + 4 * j, &d, 4);
    std::memcpy(rec + L::kMinima + 4 * j, &minus_m, 4);
    const uint8_t* q = block + 16 + 32 * (s / 2);
    uint8_t v[32], packed[16];
    for (int l = 0; l < 32; ++l) v[l] = s % 2 == 0 ? q[l] & 0xF : q[l] >> 4;
    for (int l = 0; l < 16; ++l) packed[l] = static_cast<uint8_t>(v[l] | v[l + 16] << 4);  // as Q4_1 packs
    for (int k = 0; k < 4; ++k) std::memcpy(rec + L::kValues + 32 * k + 4 * j, packed + 4 * k, 4);
  }
}

// Record (g, b) of rows[8g..8g+7] (RecordLayout).
template <uint32_t kType>
void Fill(const uint8_t* const* rows, int64_t b, uint8_t* rec) {
  using L = RecordLayout<kType>;
  for (int j = 0; j < 8; ++j) {
    const uint8_t* block = rows[j] + b * L::kStoredBytes;
    std::memcpy(rec + L::kScales + 2 * j, block, 2);
    const uint8_t* q = block + L::kStoredValues;
    if constexpr (kType == GGML_TYPE_Q8_0) {
      for (int v = 0; v < 8; ++v) std::memcpy(rec + L::kValues + 32 * v + 4 * j, q + 4 * v, 4);
    } else {
      if constexpr (kType == GGML_TYPE_Q4_1) std::memcpy(rec + L::kMinima + 2 * j, block + 2, 2);
      for (int v = 0; v < 4; ++v) std::memcpy(rec + L::kValues + 32 * v + 4 * j, q + 4 * v, 4);
    }
  }
  if constexpr (kType == GGML_TYPE_Q5_0) {
    uint32_t masks[8] = {};
    for (int j = 0; j < 8; ++j) {
      uint32_t qh;
      std::memcpy(&qh, rows[j] + b * L::kStoredBytes + 2, 4);
      for (int v = 0; v < 4; ++v) {
        for (int h = 0; h < 2; ++h) {
          for (int k = 0; k < 4; ++k) masks[2 * v + h] |= ((qh >> (16 * h + 4 * v + k)) & 1u) << (4 * j + k);
        }
      }
    }
    std::memcpy(rec + L::kFifthBits, masks, sizeof(masks));
  }
}

}  // namespace

bool CanInterleave(uint32_t ggml_type, int64_t count, int64_t cols) {
  return Available() != Isa::kNone && count > 0 && count % 8 == 0 && cols > 0 &&
         cols % (ggml_type == GGML_TYPE_Q4_K ? 256 : 32) == 0 &&
         (ggml_type == GGML_TYPE_Q4_1 || ggml_type == GGML_TYPE_Q5_0 || ggml_type == GGML_TYPE_Q8_0 ||
          ggml_type == GGML_TYPE_Q4_K);
}

InterleavedRows Interleave(uint32_t ggml_type, const uint8_t* const* rows, int64_t count, int64_t cols) {
  InterleavedRows w;
  w.ggml_type = ggml_type;
  w.rows = count;
  w.blocks = cols / 32;
  const int64_t record = RecordBytes(ggml_type);
  w.records.resize(count / 8 * w.blocks * record);
  for (int64_t g = 0; g < count / 8; ++g) {
    for (int64_t b = 0; b < w.blocks; ++b) {
      uint8_t* rec = w.records.data() + (g * w.blocks + b) * record;
      switch (ggml_type) {
        case GGML_TYPE_Q4_1:
          Fill<GGML_TYPE_Q4_1>(rows + 8 * g, b, rec);
          break;
        case GGML_TYPE_Q5_0:
          Fill<GGML_TYPE_Q5_0>(rows + 8 * g, b, rec);
          break;
        case GGML_TYPE_Q4_K:
          FillQ4K(rows + 8 * g, b, rec);
          break;
        default:
          Fill<GGML_TYPE_Q8_0>(rows + 8 * g, b, rec);
      }
    }
  }
  return w;
}

void InterleavedRowToFloat(const InterleavedRows& w, int64_t row, float* out) {
  const int64_t record = RecordBytes(w.ggml_type), j = row % 8;
  const uint8_t* group = w.records.data() + row / 8 * w.blocks * record;
  auto half = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return ggml_fp16_to_fp32(h);
  };
  auto single = [](const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  };
  for (int64_t b = 0; b < w.blocks; ++b) {
    const uint8_t* rec = group + b * record;
    float* y = out + b * 32;
    switch (w.ggml_type) {
      case GGML_TYPE_Q8_0: {
        using L = RecordLayout<GGML_TYPE_Q8_0>;
        const float d = half(rec + L::kScales + 2 * j);
        for (int i = 0; i < 32; ++i) y[i] = static_cast<int8_t>(rec[L::kValues + 32 * (i / 4) + 4 * j + i % 4]) * d;
        break;
      }
      case GGML_TYPE_Q5_0: {
        using L = RecordLayout<GGML_TYPE_Q5_0>;
        const float d = half(rec + L::kScales + 2 * j);
        uint32_t masks[8];
        std::memcpy(masks, rec + L::kFifthBits, sizeof(masks));
        for (int i = 0; i < 32; ++i) {  // value i = 16h + 4v + k
          const int h = i / 16, v = i % 16 / 4, k = i % 4;
          const uint8_t byte = rec[L::kValues + 32 * v + 4 * j + k];
          const int q = (h ? byte >> 4 : byte & 0xF) | ((masks[2 * v + h] >> (4 * j + k)) & 1u) << 4;
          y[i] = static_cast<float>(q - 16) * d;
        }
        break;
      }
      default: {  // Q4_1, Q4_K: d · q + c
        const bool k4 = w.ggml_type == GGML_TYPE_Q4_K;
        using L1 = RecordLayout<GGML_TYPE_Q4_1>;
        using LK = RecordLayout<GGML_TYPE_Q4_K>;
        const float d = k4 ? single(rec + LK::kScales + 4 * j) : half(rec + L1::kScales + 2 * j);
        const float c = k4 ? single(rec + LK::kMinima + 4 * j) : half(rec + L1::kMinima + 2 * j);
        const int64_t values = k4 ? LK::kValues : L1::kValues;
        for (int i = 0; i < 32; ++i) {
          const uint8_t byte = rec[values + 32 * (i % 16 / 4) + 4 * j + i % 4];
          y[i] = static_cast<float>(i < 16 ? byte & 0xF : byte >> 4) * d + c;
        }
      }
    }
  }
}

void QuantizeRows(const float* x, int64_t m, int64_t k, QuantizedRows* out) {
  static const bool ready = (ggml_cpu_init(), true);  // ggml's CPU tables, before its first kernel
  (void)ready;
  const int64_t blocks = k / 32;
  out->rows = m;
  out->blocks = blocks;
  out->values.resize(m * blocks * 32);
  out->scale.resize(m * blocks);
  out->scaled_sum.resize(m * blocks);
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
  // The runs of 16 only where their kernel runs (AVX-512 VNNI); the AVX2 kernels read the rows as above.
  out->wide_rows = Available() == Isa::kAvx512Vnni ? m / kWideRows * kWideRows : 0;
  out->wide_values.resize(out->wide_rows * blocks * 32);
  out->wide_scale.resize(out->wide_rows * blocks);
  out->wide_scaled_sum.resize(out->wide_rows * blocks);
  for (int64_t run = 0; run < out->wide_rows / kWideRows; ++run) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = run * blocks + b;  // the run's block b
      for (int64_t r = 0; r < kWideRows; ++r) {
        const int64_t i = run * kWideRows + r;
        for (int v = 0; v < 8; ++v) {
          std::memcpy(out->wide_values.data() + ((at * 8 + v) * kWideRows + r) * 4,
                      out->values.data() + (i * blocks + b) * 32 + 4 * v, 4);
        }
        out->wide_scale[at * kWideRows + r] = out->scale[i * blocks + b];
        out->wide_scaled_sum[at * kWideRows + r] = out->scaled_sum[i * blocks + b];
      }
    }
  }
}

void InterleavedGemm(const InterleavedRows& w, const QuantizedRows& x, float* y, int64_t ldy, SpinPool& pool,
                     QuantIsa isa) {
#if defined(__x86_64__)
  const auto kernel =
      Available() == Isa::kAvx512Vnni && isa == QuantIsa::kBest ? InterleavedGroupsAvx512Vnni : InterleavedGroupsAvx2;
  const QuantizedView view{x.values.data(),      x.scale.data(),      x.scaled_sum.data(),      x.rows,     x.blocks,
                           x.wide_values.data(), x.wide_scale.data(), x.wide_scaled_sum.data(), x.wide_rows};
  const int64_t groups = w.rows / 8;
  const int64_t grain = std::max<int64_t>(1, kSplitWork / (8 * x.rows * x.blocks * 32));
  pool.For(groups, grain,
           [&](int64_t begin, int64_t end) { kernel(w.ggml_type, w.records.data(), begin, end, view, y, ldy); });
#endif
}

}  // namespace inferd
