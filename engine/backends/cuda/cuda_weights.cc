#include "engine/backends/cuda/cuda_weights.h"

#include <cuda_fp16.h>

#include <cstring>
#include <initializer_list>

#include "engine/status_macros.h"

namespace inferd::cuda {
namespace {

constexpr size_t kStagingBytes = size_t{64} << 20;

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                      // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

uint16_t FloatToF16(float f) {
  const __half h = __float2half_rn(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

class Uploader {
 public:
  absl::Status Init(cudaDataType_t dtype) {
    dtype_ = dtype;
    for (int i = 0; i < 2; ++i) {
      INFERD_RETURN_IF_ERROR(staging_[i].Allocate(kStagingBytes));
      INFERD_CUDA(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
    INFERD_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }
  ~Uploader() {
    if (stream_) cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : done_)
      if (e) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Allocates dst for the parts stacked row-wise and copies them in, converted to the device dtype.
  absl::Status Stack(std::initializer_list<const TensorDesc*> parts, DeviceBuffer* dst, int64_t* bytes) {
    int64_t numel = 0;
    for (const TensorDesc* p : parts) numel += p->numel();
    INFERD_RETURN_IF_ERROR(dst->Allocate(numel * 2, bytes));
    char* at = dst->get<char>();
    for (const TensorDesc* p : parts) {
      INFERD_RETURN_IF_ERROR(Copy(*p, at));
      at += p->numel() * 2;
    }
    return absl::OkStatus();
  }

  absl::Status Finish() {
    INFERD_CUDA(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  bool SameDtype(const TensorDesc& t) const {
    return !t.ggml && t.rotary_heads == 0 &&
           ((t.dtype == DType::kBF16 && dtype_ == CUDA_R_16BF) || (t.dtype == DType::kF16 && dtype_ == CUDA_R_16F));
  }

  // Next staging buffer, once the copy that last used it has finished.
  absl::StatusOr<char*> NextStaging() {
    cur_ ^= 1;
    INFERD_CUDA(cudaEventSynchronize(done_[cur_]));
    return staging_[cur_].get<char>();
  }

  absl::Status Send(const char* src, char* dst, size_t n) {
    INFERD_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_));
    INFERD_CUDA(cudaEventRecord(done_[cur_], stream_));
    return absl::OkStatus();
  }

  absl::Status Copy(const TensorDesc& t, char* dst) {
    if (SameDtype(t)) {
      for (size_t off = 0; off < t.bytes.size(); off += kStagingBytes) {
        const size_t n = std::min(kStagingBytes, t.bytes.size() - off);
        INFERD_ASSIGN_OR_RETURN(char* stage, NextStaging());
        std::memcpy(stage, t.bytes.data() + off, n);
        INFERD_RETURN_IF_ERROR(Send(stage, dst + off, n));
      }
      return absl::OkStatus();
    }
    const int64_t rows_per_chunk = std::max<int64_t>(1, kStagingBytes / 2 / t.cols);
    decoded_.resize(rows_per_chunk * t.cols);
    for (int64_t r = 0; r < t.rows; r += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, t.rows - r);
      INFERD_RETURN_IF_ERROR(DecodeRows(t, r, n, decoded_.data()));
      INFERD_ASSIGN_OR_RETURN(char* stage, NextStaging());
      uint16_t* out = reinterpret_cast<uint16_t*>(stage);
      for (int64_t i = 0; i < n * t.cols; ++i) {
        out[i] = dtype_ == CUDA_R_16BF ? FloatToBf16(decoded_[i]) : FloatToF16(decoded_[i]);
      }
      INFERD_RETURN_IF_ERROR(Send(stage, dst + r * t.cols * 2, n * t.cols * 2));
    }
    return absl::OkStatus();
  }

  cudaDataType_t dtype_ = CUDA_R_16BF;
  PinnedBuffer staging_[2];
  cudaEvent_t done_[2] = {nullptr, nullptr};
  cudaStream_t stream_ = nullptr;
  int cur_ = 0;
  std::vector<float> decoded_;
};

}  // namespace

absl::StatusOr<CudaWeights> UploadWeights(const ModelTensors& t, cudaDataType_t dtype) {
  Uploader up;
  INFERD_RETURN_IF_ERROR(up.Init(dtype));
  CudaWeights w;
  int64_t* b = &w.bytes;
  INFERD_RETURN_IF_ERROR(up.Stack({&t.embed}, &w.embed, b));
  INFERD_RETURN_IF_ERROR(up.Stack({&t.final_norm}, &w.final_norm, b));
  if (t.lm_head.present()) INFERD_RETURN_IF_ERROR(up.Stack({&t.lm_head}, &w.lm_head_own, b));
  for (const LayerTensors& L : t.layers) {
    CudaLayerWeights& l = w.layers.emplace_back();
    INFERD_RETURN_IF_ERROR(up.Stack({&L.input_norm}, &l.input_norm, b));
    INFERD_RETURN_IF_ERROR(up.Stack({&L.q_proj, &L.k_proj, &L.v_proj}, &l.qkv, b));
    if (L.q_bias.present()) INFERD_RETURN_IF_ERROR(up.Stack({&L.q_bias, &L.k_bias, &L.v_bias}, &l.qkv_bias, b));
    INFERD_RETURN_IF_ERROR(up.Stack({&L.o_proj}, &l.o, b));
    INFERD_RETURN_IF_ERROR(up.Stack({&L.post_norm}, &l.post_norm, b));
    INFERD_RETURN_IF_ERROR(up.Stack({&L.gate_proj, &L.up_proj}, &l.gate_up, b));
    INFERD_RETURN_IF_ERROR(up.Stack({&L.down_proj}, &l.down, b));
  }
  INFERD_RETURN_IF_ERROR(up.Finish());
  return w;
}

}  // namespace inferd::cuda
