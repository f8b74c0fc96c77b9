#include "engine/backends/cpu/stored_matmul.h"

#include <cblas.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <span>

#include "absl/strings/str_cat.h"
#include "engine/backends/cpu/quant_gemm.h"
#include "engine/status_macros.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace inferd {
namespace {

ggml_type TypeOf(const TensorDesc& t) {
  if (t.ggml) return static_cast<ggml_type>(t.ggml_type);
  switch (t.dtype) {
    case DType::kF16:
      return GGML_TYPE_F16;
    case DType::kBF16:
      return GGML_TYPE_BF16;
    default:
      return GGML_TYPE_F32;
  }
}

// Multiply-adds a thread's share of a product holds at least (a hand-out costs about a microsecond: spin_pool.h).
constexpr int64_t kSplitWork = int64_t{1} << 15;
// X rows from which W is decoded to fp32 a tile of rows at a time and multiplied by OpenBLAS's sgemm instead: there
// the product is bound by arithmetic, which a blocked GEMM does better than one dot product per output. SmolLM2-135M
// Q4_1 on two cores, in process (`inferd-bench cpu`), with the products split over both threads (spin_pool.h): 16
// streams 288 tokens/s through the dot kernels against 233 decoded into sgemm, 32 streams 328 against 367, 64
// streams 329 against 445 (kernels/NOTES.md).
constexpr int64_t kGemmRows = 32;
// fp32 elements of W decoded per tile (4 MiB).
constexpr int64_t kTileElements = int64_t{1} << 20;

// ggml's CPU tables (fp16 conversion) are filled once, before the first kernel.
void InitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { ggml_cpu_init(); });
}

// The whole pages within `bytes`, paged out (MADV_PAGEOUT: clean file pages are dropped and read again on need;
// anonymous ones are swapped or kept, never lost); nothing where the kernel lacks it.
void GiveBackPages(std::span<const uint8_t> bytes) {
#if defined(MADV_PAGEOUT)
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#endif
}

}  // namespace

int64_t StoredMatrix::bytes() const {
  int64_t n = 0;
  for (const StoredPart& p : parts) n += p.row_bytes * static_cast<int64_t>(p.rows.size());
  return n;
}

bool StoredKernelsAvailable() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
         __builtin_cpu_supports("bmi2");
#else
  return true;
#endif
}

bool CanStore(const TensorDesc& t) {
  if (!t.present() || t.bytes.empty() || t.padded() || !t.scales.empty() || t.add != 0 || t.random()) return false;
  if (!t.ggml && t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) return false;
  if (t.ggml && t.ggml_type >= GGML_TYPE_COUNT) return false;
  const ggml_type_traits_cpu* traits = ggml_get_type_traits_cpu(TypeOf(t));
  return traits != nullptr && traits->vec_dot != nullptr &&
         ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float != nullptr;
}

absl::StatusOr<StoredMatrix> StoreRows(std::initializer_list<const TensorDesc*> parts, bool products) {
  StoredMatrix m;
  m.cols = (*parts.begin())->cols;
  for (const TensorDesc* t : parts) {
    if (!CanStore(*t) || t->cols != m.cols) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t->name, "' cannot be multiplied as stored"));
    }
    INFERD_ASSIGN_OR_RETURN(const int64_t row_bytes, StoredRowBytes(*t));
    StoredPart& p = m.parts.emplace_back();
    p.ggml_type = TypeOf(*t);
    p.row_bytes = row_bytes;
    p.rows.resize(t->rows);
    for (int64_t r = 0; r < t->rows; ++r) p.rows[r] = t->bytes.data() + StoredRow(*t, r) * row_bytes;
    if (products && CanInterleave(p.ggml_type, t->rows, m.cols)) {
      p.interleaved = Interleave(p.ggml_type, p.rows.data(), t->rows, m.cols);
      GiveBackPages(t->bytes);
    }
    m.rows += t->rows;
  }
  return m;
}

void StoredMatMulT(const float* x, const StoredMatrix& w, float* y, int64_t m, SpinPool& pool) {
  InitOnce();
  const bool interleaved =
      std::all_of(w.parts.begin(), w.parts.end(), [](const StoredPart& p) { return p.interleaved.rows > 0; });
  if (m >= kGemmRows && !interleaved) {  // interleaved weights take every step (kernels/NOTES.md)
    // Tiles of W decoded to fp32 and multiplied by a one-thread sgemm (OpenBLAS runs one thread under as_stored:
    // its own pool spinning beside ours took the cores from each other), split over the pool's threads: at least
    // one tile each, of at most kTileElements and at least 64 rows.
    const int64_t threads = pool.threads();
    const int64_t tile = std::max<int64_t>(64, std::min(kTileElements / w.cols, (w.rows + threads - 1) / threads));
    const int64_t tiles = (w.rows + tile - 1) / tile;
    pool.For(tiles, 1, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> decoded;  // the thread's own, sized by it, kept between calls
      for (int64_t t = begin; t < end; ++t) {
        const int64_t r0 = t * tile, n = std::min(tile, w.rows - r0);
        decoded.resize(n * w.cols);
        for (int64_t r = 0; r < n; ++r) StoredRowToFloat(w, r0 + r, decoded.data() + r * w.cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, w.cols, 1.0f, x, w.cols, decoded.data(), w.cols,
                    0.0f, y + r0, w.rows);
      }
    });
    return;
  }
  const int n = static_cast<int>(w.cols);
  int64_t first = 0;                            // the part's first output column
  thread_local std::vector<uint8_t> converted;  // kept between calls, as above
  ggml_type converted_as = GGML_TYPE_COUNT;
  thread_local QuantizedRows quantized;  // X for InterleavedGemm, once a call
  bool quantized_done = false;
  for (const StoredPart& p : w.parts) {
    if (p.interleaved.rows > 0) {
      if (!quantized_done) QuantizeRows(x, m, w.cols, &quantized), quantized_done = true;
      InterleavedGemm(p.interleaved, quantized, y + first, w.rows, pool);
      first += static_cast<int64_t>(p.rows.size());
      continue;
    }
    const ggml_type_traits_cpu* traits = ggml_get_type_traits_cpu(static_cast<ggml_type>(p.ggml_type));
    const ggml_type as = traits->vec_dot_type;
    const size_t x_row_bytes = ggml_row_size(as, w.cols);
    const uint8_t* xs = reinterpret_cast<const uint8_t*>(x);
    if (as != GGML_TYPE_F32) {  // X in the kernel's format, once per format a call meets
      if (as != converted_as) {
        converted.resize(x_row_bytes * m);
        const ggml_from_float_t from_float = ggml_get_type_traits_cpu(as)->from_float;
        for (int64_t i = 0; i < m; ++i) from_float(x + i * w.cols, converted.data() + i * x_row_bytes, w.cols);
        converted_as = as;
      }
      xs = converted.data();
    }
    const int64_t rows = static_cast<int64_t>(p.rows.size()), out_stride = w.rows;
    const ggml_vec_dot_t dot = traits->vec_dot;
    pool.For(rows, std::max<int64_t>(1, kSplitWork / (m * w.cols)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {  // a weight row against every X row while it is in cache
        for (int64_t i = 0; i < m; ++i)
          dot(n, y + i * out_stride + first + r, 0, p.rows[r], 0, xs + i * x_row_bytes, 0, 1);
      }
    });
    first += rows;
  }
}

void StoredRowToFloat(const StoredMatrix& w, int64_t row, float* out) {
  InitOnce();
  for (const StoredPart& p : w.parts) {
    const int64_t rows = static_cast<int64_t>(p.rows.size());
    if (row < rows) {
      if (p.interleaved.rows > 0) {  // from the records: the stored pages were given back
        InterleavedRowToFloat(p.interleaved, row, out);
      } else if (p.ggml_type == GGML_TYPE_F32) {  // ggml has no conversion to fp32 from fp32
        std::memcpy(out, p.rows[row], w.cols * sizeof(float));
      } else {
        ggml_get_type_traits(static_cast<ggml_type>(p.ggml_type))->to_float(p.rows[row], out, w.cols);
      }
      return;
    }
    row -= rows;
  }
}

}  // namespace inferd
