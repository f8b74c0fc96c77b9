#include "engine/backends/cuda/cuda_weights.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <initializer_list>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backends/cuda/cuda_check.h"
#include "engine/status_macros.h"
#include "kernels/fill_random.h"
#include "kernels/fp8.h"

namespace inferd::cuda {
namespace {

constexpr size_t kStagingBytes = size_t{16} << 20;  // per staging buffer; each worker has two
constexpr unsigned kMaxWorkers = 6;

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

uint16_t FloatToF16(float f) {
  const __half h = __float2half_rn(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

// Rows [first, first + count) of one source tensor, columns [col_begin, col_begin + cols) of each (a tensor
// parallel rank's slice; all of them otherwise), bound for dst (the device address of row `first`, rows `cols`
// wide); where scale is set, quantized to fp8 on the way, row r's scale landing in scale[r - first].
struct Piece {
  const TensorDesc* src;
  int64_t first, count;
  char* dst;
  float* scale = nullptr;
  int64_t col_begin = 0, cols = 0;
};

// Copies rows of `row_bytes` source bytes into `out` keeping bytes [begin, begin + n) of each.
void CopyColumns(const uint8_t* src, int64_t rows, int64_t row_bytes, int64_t begin, int64_t n, char* out) {
  if (begin == 0 && n == row_bytes) {
    std::memcpy(out, src, static_cast<size_t>(rows * row_bytes));
    return;
  }
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * n, src + r * row_bytes + begin, static_cast<size_t>(n));
}

// Copies pieces to the device through its own two pinned staging buffers on its own stream: decoding or
// copying the next piece on the host overlaps the transfer of the last.
class Worker {
 public:
  absl::Status Init(cudaDataType_t dtype) {
    dtype_ = dtype;
    for (int i = 0; i < 2; ++i) {
      INFERD_RETURN_IF_ERROR(staging_[i].Allocate(kStagingBytes));
      INFERD_CUDA(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
    INFERD_RETURN_IF_ERROR(device_staging_.Allocate(kStagingBytes));
    INFERD_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }
  ~Worker() {
    if (stream_) cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : done_)
      if (e) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status Copy(const Piece& p) {
    const TensorDesc& t = *p.src;
    if (t.random() && !t.padded()) return FillRandom(p);
    const size_t bytes = static_cast<size_t>(p.count * p.cols * 2);
    INFERD_ASSIGN_OR_RETURN(char* stage, NextStaging());
    if (p.scale && t.dtype == DType::kF8E4M3 && !t.ggml && !t.padded()) return CopyFp8(p, stage);
    if (SameDtype(t)) {
      if (t.bytes.size() != static_cast<size_t>(t.numel() * 2)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " holds ", t.bytes.size(),
                                                       " bytes; allowed: rows x cols x 2 = ", t.numel() * 2));
      }
      CopyColumns(t.bytes.data() + p.first * t.cols * 2, p.count, t.cols * 2, p.col_begin * 2, p.cols * 2, stage);
    } else {
      decoded_.resize(p.count * t.cols);
      INFERD_RETURN_IF_ERROR(DecodeRows(t, p.first, p.count, decoded_.data()));
      uint16_t* out = reinterpret_cast<uint16_t*>(stage);
      for (int64_t r = 0; r < p.count; ++r) {
        const float* row = decoded_.data() + r * t.cols + p.col_begin;
        for (int64_t i = 0; i < p.cols; ++i) {
          out[r * p.cols + i] = dtype_ == CUDA_R_16BF ? FloatToBf16(row[i]) : FloatToF16(row[i]);
        }
      }
    }
    if (p.scale) {  // through the device staging (in stream order with the last piece's use of it), quantized
      INFERD_CUDA(cudaMemcpyAsync(device_staging_.get(), stage, bytes, cudaMemcpyHostToDevice, stream_));
      INFERD_RETURN_IF_ERROR(Quantize(p));
    } else {
      INFERD_CUDA(cudaMemcpyAsync(p.dst, stage, bytes, cudaMemcpyHostToDevice, stream_));
    }
    INFERD_CUDA(cudaEventRecord(done_[cur_], stream_));
    return absl::OkStatus();
  }

  // model.load_format dummy: the piece made on the device where it lies (quantized after, as uploaded rows are).
  absl::Status FillRandom(const Piece& p) {
    const TensorDesc& t = *p.src;
    void* target = p.scale ? device_staging_.get() : p.dst;
    const cudaError_t e =
        dtype_ == CUDA_R_16BF
            ? kernels::FillRandomRows(static_cast<__nv_bfloat16*>(target), p.count, p.cols, p.first, p.col_begin,
                                      t.random_seed, t.random_mean, t.random_std, stream_)
            : kernels::FillRandomRows(static_cast<__half*>(target), p.count, p.cols, p.first, p.col_begin,
                                      t.random_seed, t.random_mean, t.random_std, stream_);
    INFERD_RETURN_IF_ERROR(FromCuda(e, "kernels::FillRandomRows"));
    if (p.scale) return Quantize(p);
    return absl::OkStatus();
  }

  // The piece's rows in the device staging, quantized to e4m3 into their place with one scale per row.
  absl::Status Quantize(const Piece& p) {
    const cudaError_t e = dtype_ == CUDA_R_16BF
                              ? kernels::QuantizeRowsFp8(device_staging_.get<__nv_bfloat16>(), p.count, p.cols,
                                                         reinterpret_cast<kernels::Fp8*>(p.dst), p.scale, stream_)
                              : kernels::QuantizeRowsFp8(device_staging_.get<__half>(), p.count, p.cols,
                                                         reinterpret_cast<kernels::Fp8*>(p.dst), p.scale, stream_);
    return FromCuda(e, "kernels::QuantizeRowsFp8");
  }

  // An FP8 checkpoint's rows as stored, and their scales (one per row, or the tensor's for every row).
  absl::Status CopyFp8(const Piece& p, char* stage) {
    const TensorDesc& t = *p.src;
    const size_t bytes = static_cast<size_t>(p.count * p.cols);
    if (t.bytes.size() != static_cast<size_t>(t.numel()) || t.scales.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " holds ", t.bytes.size(),
                                                     " bytes; allowed: rows x cols = ", t.numel(), ", with scales"));
    }
    CopyColumns(t.bytes.data() + p.first * t.cols, p.count, t.cols, p.col_begin, p.cols, stage);
    float* scales = reinterpret_cast<float*>(stage + (bytes + 15) / 16 * 16);  // after the rows: the piece's half
    for (int64_t r = 0; r < p.count; ++r) scales[r] = t.scales[t.scales.size() == 1 ? 0 : p.first + r];
    INFERD_CUDA(cudaMemcpyAsync(p.dst, stage, bytes, cudaMemcpyHostToDevice, stream_));
    INFERD_CUDA(cudaMemcpyAsync(p.scale, scales, p.count * sizeof(float), cudaMemcpyHostToDevice, stream_));
    INFERD_CUDA(cudaEventRecord(done_[cur_], stream_));
    return absl::OkStatus();
  }

  absl::Status Finish() {
    INFERD_CUDA(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  bool SameDtype(const TensorDesc& t) const {
    return !t.ggml && t.rotary_heads == 0 && t.add == 0 && !t.padded() && !t.random() &&
           ((t.dtype == DType::kBF16 && dtype_ == CUDA_R_16BF) || (t.dtype == DType::kF16 && dtype_ == CUDA_R_16F));
  }

  // Next staging buffer, once the copy that last used it has finished.
  absl::StatusOr<char*> NextStaging() {
    cur_ ^= 1;
    INFERD_CUDA(cudaEventSynchronize(done_[cur_]));
    return staging_[cur_].get<char>();
  }

  cudaDataType_t dtype_ = CUDA_R_16BF;
  PinnedBuffer staging_[2];
  DeviceBuffer device_staging_;  // fp8 pieces: the rows before quantization
  cudaEvent_t done_[2] = {nullptr, nullptr};
  cudaStream_t stream_ = nullptr;
  int cur_ = 0;
  std::vector<float> decoded_;
};

// Runs the pieces on up to kMaxWorkers threads, each pulling the next piece in order: reading the mapped files,
// converting and the transfers over PCIe proceed in parallel. Returns the first failure.
absl::Status RunPieces(const std::vector<Piece>& pieces, cudaDataType_t dtype, int32_t num_ranks) {
  // The ranks of a tensor-parallel model upload at once: they share the host's threads.
  const unsigned workers = std::clamp<unsigned>(std::thread::hardware_concurrency() / num_ranks, 1, kMaxWorkers);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<absl::Status> status(std::min<size_t>(workers, std::max<size_t>(pieces.size(), 1)));
  int device = 0;
  INFERD_CUDA(cudaGetDevice(&device));
  std::vector<std::thread> threads;
  for (absl::Status& st : status) {
    threads.emplace_back([&, device] {
      st = FromCuda(cudaSetDevice(device), "cudaSetDevice");
      Worker w;
      if (st.ok()) st = w.Init(dtype);
      for (size_t i; st.ok() && !failed && (i = next++) < pieces.size();) st = w.Copy(pieces[i]);
      if (st.ok()) st = w.Finish();
      if (!st.ok()) failed = true;
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& st : status) INFERD_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

// A slice of one tensor: its rows [rows.begin, rows.end) and columns [cols.begin, cols.end); the whole tensor by
// default.
struct Part {
  Part(const TensorDesc* t) : tensor(t), rows{0, t->rows}, cols{0, t->cols} {}  // NOLINT: a whole tensor
  Part(const TensorDesc* t, IndexRange r, IndexRange c) : tensor(t), rows(r), cols(c) {}
  const TensorDesc* tensor;
  IndexRange rows, cols;
};

// Allocates dst for the parts stacked row-wise and cuts them into pieces of at most one staging buffer. With
// scale, dst holds fp8 rows and scale one fp32 per row.
absl::Status Stack(const std::vector<Part>& parts, DeviceBuffer* dst, int64_t* bytes, std::vector<Piece>* pieces,
                   DeviceBuffer* scale = nullptr) {
  const int64_t e = scale ? 1 : 2;  // bytes per element on the device
  int64_t numel = 0, rows = 0;
  for (const Part& p : parts) {
    numel += p.rows.size() * p.cols.size();
    rows += p.rows.size();
  }
  INFERD_RETURN_IF_ERROR(dst->Allocate(numel * e, bytes));
  if (scale) INFERD_RETURN_IF_ERROR(scale->Allocate(rows * 4, bytes));
  char* at = dst->get<char>();
  float* scale_at = scale ? scale->get<float>() : nullptr;
  for (const Part& p : parts) {
    const TensorDesc* t = p.tensor;
    if (t->cols * 2 > static_cast<int64_t>(kStagingBytes)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t->name, ": a row of ", t->cols,
                                                     " elements is not allowed; allowed: at most ", kStagingBytes / 2,
                                                     " (the upload staging buffer)"));
    }
    const int64_t cols = p.cols.size();
    const int64_t rows_per_piece = static_cast<int64_t>(kStagingBytes) / (t->cols * 2);
    for (int64_t r = 0; r < p.rows.size(); r += rows_per_piece) {
      pieces->push_back({t, p.rows.begin + r, std::min(rows_per_piece, p.rows.size() - r), at + r * cols * e,
                         scale_at ? scale_at + r : nullptr, p.cols.begin, cols});
    }
    at += p.rows.size() * cols * e;
    if (scale_at) scale_at += p.rows.size();
  }
  return absl::OkStatus();
}

absl::Status StackLinear(const std::vector<Part>& parts, bool fp8, LinearWeight* dst, int64_t* bytes,
                         std::vector<Piece>* pieces) {
  return Stack(parts, &dst->data, bytes, pieces, fp8 ? &dst->scale : nullptr);
}

}  // namespace

absl::StatusOr<CudaWeights> UploadWeights(const ModelTensors& t, cudaDataType_t dtype, bool fp8,
                                          const TensorParallelShard& shard, const ModelConfig& c) {
  CudaWeights w;
  w.fp8 = fp8;
  std::vector<Piece> pieces;
  int64_t* b = &w.bytes;
  INFERD_RETURN_IF_ERROR(Stack({&t.embed}, &w.embed, b, &pieces));
  INFERD_RETURN_IF_ERROR(Stack({&t.final_norm}, &w.final_norm, b, &pieces));
  // Rank 0 holds the whole LM head (it computes every logit where the GPUs cannot write each other's memory);
  // the others their vocabulary runs.
  w.vocab = shard.vocab;
  if (t.lm_head.present() && shard.rank == 0) {
    INFERD_RETURN_IF_ERROR(Stack({&t.lm_head}, &w.lm_head_own, b, &pieces));
  } else if (t.lm_head.present() && shard.vocab.size() > 0) {
    INFERD_RETURN_IF_ERROR(Stack({{&t.lm_head, shard.vocab, {0, c.hidden_size}}}, &w.lm_head_own, b, &pieces));
  }
  // The rank's rows of the column-parallel products, its columns of the row-parallel ones.
  const int64_t D = c.head_dim;
  const IndexRange q{shard.q_heads.begin * D, shard.q_heads.end * D};
  const IndexRange kv{shard.kv_heads.begin * D, shard.kv_heads.end * D};
  const IndexRange& mlp = shard.intermediate;
  const IndexRange all_hidden{0, c.hidden_size};
  const IndexRange one{0, 1};
  for (const LayerTensors& L : t.layers) {
    CudaLayerWeights& l = w.layers.emplace_back();
    INFERD_RETURN_IF_ERROR(Stack({&L.input_norm}, &l.input_norm, b, &pieces));
    INFERD_RETURN_IF_ERROR(
        StackLinear({{&L.q_proj, q, all_hidden}, {&L.k_proj, kv, all_hidden}, {&L.v_proj, kv, all_hidden}}, fp8, &l.qkv,
                    b, &pieces));
    if (L.q_bias.present()) {  // [1, width] vectors: the rank's columns
      INFERD_RETURN_IF_ERROR(
          Stack({{&L.q_bias, one, q}, {&L.k_bias, one, kv}, {&L.v_bias, one, kv}}, &l.qkv_bias, b, &pieces));
    }
    for (auto [tensor, buffer] :
         {std::pair{&L.q_norm, &l.q_norm}, std::pair{&L.k_norm, &l.k_norm},
          std::pair{&L.attn_out_norm, &l.attn_out_norm}, std::pair{&L.mlp_out_norm, &l.mlp_out_norm}}) {
      if (tensor->present()) INFERD_RETURN_IF_ERROR(Stack({tensor}, buffer, b, &pieces));
    }
    INFERD_RETURN_IF_ERROR(StackLinear({{&L.o_proj, all_hidden, q}}, fp8, &l.o, b, &pieces));
    INFERD_RETURN_IF_ERROR(Stack({&L.post_norm}, &l.post_norm, b, &pieces));
    if (L.gate_proj.present()) {
      INFERD_RETURN_IF_ERROR(
          StackLinear({{&L.gate_proj, mlp, all_hidden}, {&L.up_proj, mlp, all_hidden}}, fp8, &l.gate_up, b, &pieces));
      INFERD_RETURN_IF_ERROR(StackLinear({{&L.down_proj, all_hidden, mlp}}, fp8, &l.down, b, &pieces));
    }
    if (L.router.present()) {  // the router whole on every rank; each expert's intermediate columns split
      INFERD_RETURN_IF_ERROR(StackLinear({&L.router}, /*fp8=*/false, &l.router, b, &pieces));
      const IndexRange& cols = shard.expert_intermediate;
      std::vector<Part> gate_up, down;
      for (const LayerTensors::Expert& e : L.experts) {
        gate_up.push_back({&e.gate, cols, all_hidden});
        gate_up.push_back({&e.up, cols, all_hidden});
        down.push_back({&e.down, all_hidden, cols});
      }
      INFERD_RETURN_IF_ERROR(StackLinear(gate_up, fp8, &l.experts_gate_up, b, &pieces));
      INFERD_RETURN_IF_ERROR(StackLinear(down, fp8, &l.experts_down, b, &pieces));
    }
    l.k_cache_scale = L.k_cache_scale;
    l.v_cache_scale = L.v_cache_scale;
  }
  INFERD_RETURN_IF_ERROR(RunPieces(pieces, dtype, shard.size));
  return w;
}

}  // namespace inferd::cuda
