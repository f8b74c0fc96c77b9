// The cpu backend's fast products: weights kept as the checkpoint stores them (GGUF's block formats — Q8_0, Q4_0,
// Q4_1, Q5_K, Q4_K, Q6_K, … — and bf16, fp16, fp32 rows), multiplied through ggml's CPU dot kernels (llama.cpp's,
// built from its pinned source: CMakeLists.txt). Each row of X is converted once to the format the weight's kernel
// takes (8-bit blocks for the quantized formats, bf16 or fp16 for those), then each output is one dot product of
// a stored row, in fp32. No fp32 copy of a weight is kept; the rows are read where the mapped file holds them,
// except Q4_1, Q5_0 and Q8_0 rows, interleaved at load for quant_gemm.h's kernels, which take all their steps.
// Other formats' steps of many rows (32 or more) decode W a tile of rows at a time into fp32 and multiply with
// OpenBLAS's sgemm (X unrounded there), each of the backend's threads (spin_pool.h) its own tiles through a one-thread
// sgemm: the cpu backend sets OpenBLAS to one thread under as_stored, so that only one team runs (two pools spinning on
// the same cores slowed a 16-stream step by a quarter).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/cpu/quant_gemm.h"
#include "engine/backends/cpu/spin_pool.h"
#include "engine/model/model_tensors.h"

namespace inferd {

// Rows of one stored format (a matrix stacked from tensors of different formats, as llama.cpp's mixes make them,
// has one part per run).
struct StoredPart {
  uint32_t ggml_type = 0;            // ggml's type numbering (GGUF's)
  std::vector<const uint8_t*> rows;  // each row's bytes, in the forward pass's row order
  int64_t row_bytes = 0;
  // The rows interleaved for the products (quant_gemm.h), where the format allows; then nothing reads `rows` (a
  // tied embedding's lookups decode the records).
  InterleavedRows interleaved;
};

struct StoredMatrix {
  std::vector<StoredPart> parts;  // stacked in order
  int64_t rows = 0, cols = 0;
  int64_t bytes() const;  // the stored bytes the rows take
};

// True where this CPU runs the kernels ggml was built with (x86: AVX2, FMA and F16C).
bool StoredKernelsAvailable();

// Whether a tensor can be multiplied as stored: a ggml block format or bf16/fp16/fp32 rows, with its bytes at hand,
// and nothing that decoding would change (padding, per-row scales, an added constant, random weights).
bool CanStore(const TensorDesc& tensor);

// The tensors stacked row-wise (each CanStore, equal column counts), pointing into their bytes. With `products`,
// each part whose format and shape allow is interleaved too (quant_gemm.h), and the pages of its stored bytes are
// given back to the kernel (madvise MADV_PAGEOUT: a mapped file's pages are read again on need, nothing is lost), so
// the weights stay resident once; without it (an embedding table only looked up) the rows are only pointed to.
absl::StatusOr<StoredMatrix> StoreRows(std::initializer_list<const TensorDesc*> parts, bool products = true);

// y[m, w.rows] = x[m, w.cols] · wᵀ, fp32 in and out, the output columns split over the pool's threads.
void StoredMatMulT(const float* x, const StoredMatrix& w, float* y, int64_t m, SpinPool& pool);

// One row of w, decoded to fp32 (the embedding lookup).
void StoredRowToFloat(const StoredMatrix& w, int64_t row, float* out);

}  // namespace inferd
