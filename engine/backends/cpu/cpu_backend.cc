#include "engine/backends/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backends/cpu/cpu_weights.h"
#include "engine/check.h"
#include "engine/runtime/sampler.h"
#include "engine/status_macros.h"

namespace inferd {

namespace {

// C[m, n] = A[m, k] · W[n, k]ᵀ + beta · C
void MatMulT(const float* a, const Matrix& w, float* c, int64_t m, float beta) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, w.rows, w.cols, 1.0f, a, w.cols, w.data.data(), w.cols, beta,
              c, w.rows);
}

void RmsNorm(const float* x, const Matrix& weight, float eps, float* out, int64_t rows) {
  const int64_t n = weight.cols;
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = weight.data[i] * (xr[i] * inv);
  }
}

// Per-step scratch, sized once for the largest step so that the hot path does not allocate.
struct Workspace {
  std::vector<float> x, xn, qkv, attn, gate_up, act;  // [tokens, ...]
  std::vector<float> last, last_n, logits;            // [logits rows, ...]
  int64_t bytes() const {
    return static_cast<int64_t>(sizeof(float)) * (x.size() + xn.size() + qkv.size() + attn.size() + gate_up.size() +
                                                  act.size() + last.size() + last_n.size() + logits.size());
  }
};

class CpuBackend : public Backend {
 public:
  CpuBackend(const Model& model, const EngineSection& engine, CpuWeights weights)
      : cfg_(model.config), weights_(std::move(weights)) {
    if (engine.num_threads > 0) {
      openblas_set_num_threads(engine.num_threads);
      omp_set_num_threads(engine.num_threads);
    }
    inv_freq_ = RopeInverseFrequencies(cfg_);
  }

  std::string name() const override { return "cpu"; }
  absl::StatusOr<MemoryPlan> MeasureMemory(const StepLimits& limits) override;
  absl::Status AllocateKvCache(const MemoryPlan& plan) override;
  absl::Status AllocateHostBlocks(int32_t num_blocks) override;
  // The host pool is a second pool in the same memory: the copies are memcpys, done on return.
  absl::Status StartCopies(const CopyBatch& batch) override;
  uint64_t CompletedCopies() override { return completed_copies_; }
  absl::Status WaitForCopies(uint64_t) override { return absl::OkStatus(); }
  absl::Status Step(const StepInput& input, StepOutput* output) override;
  StepCounters counters() const override { return counters_; }
  absl::StatusOr<DeviceCeilings> MeasureCeilings() override;

 private:
  void Forward(const StepInput& in);  // fills ws_.logits[num_logits, vocab]
  void Attention(const StepInput& in, int layer, const float* qkv, float* out);

  const ModelConfig& cfg_;
  CpuWeights weights_;
  StepLimits limits_;
  int32_t block_size_ = 0;
  int64_t num_slots_ = 0;
  Workspace ws_;
  std::vector<float> inv_freq_;                    // [head_dim / 2]
  std::vector<std::unique_ptr<float[]>> k_cache_;  // [layers][num_blocks, block_size, num_kv_heads, head_dim]
  std::vector<std::unique_ptr<float[]>> v_cache_;  // same layout as k_cache_
  std::unique_ptr<float[]> host_;                  // [host blocks][layers][K, V][block_size, num_kv_heads, head_dim]
  int32_t num_host_blocks_ = 0;
  uint64_t completed_copies_ = 0;
  StepCounters counters_;  // the device is the CPU: a step's device time is its whole Step()
};

// Median seconds of `reps` runs of fn after `warmup` runs.
template <typename F>
double MedianSeconds(F fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

absl::StatusOr<DeviceCeilings> CpuBackend::MeasureCeilings() {
  DeviceCeilings c;
  {  // A read-only sum over 128 MiB (past any cache) on the backend's threads.
    const int64_t n = int64_t{32} << 20;
    std::vector<float> data(n);
    uint32_t state = 12345;
    for (float& x : data) x = static_cast<float>((state = state * 1664525u + 1013904223u) >> 8) * 0x1p-24f - 0.5f;
    volatile float sink = 0;
    const double s = MedianSeconds(
        [&] {
          float sum = 0;
#pragma omp parallel for reduction(+ : sum)
          for (int64_t i = 0; i < n; ++i) sum += data[i];
          sink = sink + sum;
        },
        2, 5);
    c.read_bytes_per_s = n * 4.0 / s;
    c.read_test = "a read-only sum over 128 MiB";
  }
  {  // The products' own fp32 GEMM (OpenBLAS) at 512^3.
    const int64_t n = 512;
    std::vector<float> a(n * n), b(n * n), out(n * n);
    for (int64_t i = 0; i < n * n; ++i) {
      a[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
      b[i] = static_cast<float>((i * 104729) % 997) * 1e-3f - 0.5f;
    }
    const double s = MedianSeconds(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                      out.data(), n);
        },
        2, 5);
    c.gemm_flops_per_s = 2.0 * n * n * n / s;
    c.gemm_test = "OpenBLAS fp32 GEMM at 512^3";
  }
  return c;
}

absl::StatusOr<MemoryPlan> CpuBackend::MeasureMemory(const StepLimits& limits) {
  limits_ = limits;
  block_size_ = limits.block_size;
  const int64_t T = limits.max_num_batched_tokens, R = limits.max_logits_rows();
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t q_dim = cfg_.q_width(), qkv_dim = cfg_.qkv_width();
  ws_.x.resize(T * H);
  ws_.xn.resize(T * H);
  ws_.qkv.resize(T * qkv_dim);
  ws_.attn.resize(T * q_dim);
  ws_.gate_up.resize(T * 2 * I);
  ws_.act.resize(T * I);
  ws_.last.resize(R * H);
  ws_.last_n.resize(R * H);
  ws_.logits.resize(R * cfg_.vocab_size);
  MemoryPlan plan;
  plan.device = "cpu";
  plan.weight_bytes = weights_.bytes();
  plan.activation_bytes = ws_.bytes();
  plan.kv_bytes_per_block = 2 * int64_t{cfg_.num_layers} * block_size_ * cfg_.kv_width() * 4;
  plan.kv_dtype = "float32";
  return plan;
}

absl::Status CpuBackend::AllocateKvCache(const MemoryPlan& plan) {
  num_slots_ = int64_t{plan.num_blocks} * block_size_;
  const size_t per_layer = size_t(num_slots_) * cfg_.kv_width();
  // Not zeroed: every slot is written before it is read, and untouched pages cost nothing.
  for (int l = 0; l < cfg_.num_layers; ++l) {
    k_cache_.emplace_back(new (std::nothrow) float[per_layer]);
    v_cache_.emplace_back(new (std::nothrow) float[per_layer]);
    if (!k_cache_.back() || !v_cache_.back()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the KV cache of ", plan.num_blocks, " blocks does not fit in host memory"));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::AllocateHostBlocks(int32_t num_blocks) {
  const size_t block = size_t(block_size_) * cfg_.kv_width();
  host_.reset(new (std::nothrow) float[size_t(num_blocks) * cfg_.num_layers * 2 * block]);
  if (!host_) {
    return absl::ResourceExhaustedError(absl::StrCat("a host KV pool of ", num_blocks, " blocks does not fit"));
  }
  num_host_blocks_ = num_blocks;
  return absl::OkStatus();
}

absl::Status CpuBackend::StartCopies(const CopyBatch& batch) {
  const size_t block = size_t(block_size_) * cfg_.kv_width();
  const int64_t num_blocks = num_slots_ / block_size_;
  auto host = [&](int32_t h, int layer, int kv) {
    return host_.get() + ((size_t(h) * cfg_.num_layers + layer) * 2 + kv) * block;
  };
  for (const auto* copies : {&batch.out, &batch.in}) {
    for (const BlockCopy& c : *copies) {
      INFERD_CHECK(
          c.device_block >= 0 && c.device_block < num_blocks && c.host_block >= 0 && c.host_block < num_host_blocks_,
          "block copies name blocks of the pool and the host pool");
      for (int layer = 0; layer < cfg_.num_layers; ++layer) {
        float* k = k_cache_[layer].get() + size_t(c.device_block) * block;
        float* v = v_cache_[layer].get() + size_t(c.device_block) * block;
        if (copies == &batch.out) {
          std::copy_n(k, block, host(c.host_block, layer, 0));
          std::copy_n(v, block, host(c.host_block, layer, 1));
        } else {
          std::copy_n(host(c.host_block, layer, 0), block, k);
          std::copy_n(host(c.host_block, layer, 1), block, v);
        }
      }
    }
  }
  completed_copies_ = batch.ticket;
  return absl::OkStatus();
}

absl::Status CpuBackend::Step(const StepInput& in, StepOutput* out) {
  INFERD_CHECK(!k_cache_.empty(), "the KV cache is allocated before the first step");
  INFERD_CHECK(in.num_tokens() <= limits_.max_num_batched_tokens && in.num_logits() <= limits_.max_logits_rows(),
               "a step fits the limits the workspace was sized for");
  INFERD_CHECK(in.sampling.size() == in.logits_indices.size(), "every logits row has its sampling parameters");
  const auto start = std::chrono::steady_clock::now();
  Forward(in);
  const int64_t V = cfg_.vocab_size;
  out->tokens.resize(in.num_logits());
  out->logprobs.resize(in.num_logits());
  for (int32_t r = 0; r < in.num_logits(); ++r) {
    SampleResult res = Sample(std::span<float>(ws_.logits.data() + r * V, V), in.sampling[r]);
    out->tokens[r] = res.token;
    out->logprobs[r] = res.has_logprob ? std::move(res.logprob) : TokenLogprob{};
  }
  ++counters_.steps;
  counters_.last_device_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  counters_.device_busy_s += counters_.last_device_s;
  return absl::OkStatus();
}

void CpuBackend::Forward(const StepInput& in) {
  const int64_t T = in.num_tokens();
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t q_dim = cfg_.q_width(), kv_dim = cfg_.kv_width(), qkv_dim = cfg_.qkv_width();
  for (int64_t t = 0; t < T; ++t) {
    INFERD_CHECK(in.token_ids[t] >= 0 && in.token_ids[t] < cfg_.vocab_size, "step token ids are in the vocabulary");
    INFERD_CHECK(in.slot_mapping[t] >= 0 && in.slot_mapping[t] < num_slots_, "slot mapping points into the pool");
  }
  const float eps = static_cast<float>(cfg_.rms_norm_eps);

  std::vector<float>&x = ws_.x, &xn = ws_.xn, &qkv = ws_.qkv, &attn = ws_.attn, &gate_up = ws_.gate_up, &act = ws_.act;
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(weights_.embed.data.data() + int64_t{in.token_ids[t]} * H, H, x.data() + t * H);
  }
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    const CpuLayerWeights& L = weights_.layers[layer];
    RmsNorm(x.data(), L.input_norm, eps, xn.data(), T);
    MatMulT(xn.data(), L.qkv, qkv.data(), T, 0.0f);
    if (!L.qkv_bias.data.empty()) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < qkv_dim; ++i) qkv[t * qkv_dim + i] += L.qkv_bias.data[i];
    }
    // Rotary embedding on q and k (rotate-half convention), then K/V into their slots.
    const int64_t half = D / 2;
#pragma omp parallel for
    for (int64_t t = 0; t < T; ++t) {
      float* row = qkv.data() + t * qkv_dim;
      const float pos = static_cast<float>(in.positions[t]);
      for (int64_t h = 0; h < cfg_.num_heads + cfg_.num_kv_heads; ++h) {
        float* v = row + h * D;
        for (int64_t i = 0; i < half; ++i) {
          const float angle = pos * inv_freq_[i];
          const float c = std::cos(angle), s = std::sin(angle);
          const float a = v[i], b = v[i + half];
          v[i] = a * c - b * s;
          v[i + half] = b * c + a * s;
        }
      }
      const int64_t slot = in.slot_mapping[t];
      std::copy_n(row + q_dim, kv_dim, k_cache_[layer].get() + slot * kv_dim);
      std::copy_n(row + q_dim + kv_dim, kv_dim, v_cache_[layer].get() + slot * kv_dim);
    }
    Attention(in, layer, qkv.data(), attn.data());
    MatMulT(attn.data(), L.o, x.data(), T, 1.0f);  // x += attn · Woᵀ
    RmsNorm(x.data(), L.post_norm, eps, xn.data(), T);
    MatMulT(xn.data(), L.gate_up, gate_up.data(), T, 0.0f);
#pragma omp parallel for
    for (int64_t t = 0; t < T; ++t) {
      const float* g = gate_up.data() + t * 2 * I;
      for (int64_t i = 0; i < I; ++i) act[t * I + i] = g[i] / (1.0f + std::exp(-g[i])) * g[I + i];
    }
    MatMulT(act.data(), L.down, x.data(), T, 1.0f);  // x += act · Wdownᵀ
  }
  const int64_t R = static_cast<int64_t>(in.logits_indices.size());
  std::vector<float>&last = ws_.last, &last_n = ws_.last_n;
  for (int64_t r = 0; r < R; ++r) std::copy_n(x.data() + int64_t{in.logits_indices[r]} * H, H, last.data() + r * H);
  RmsNorm(last.data(), weights_.final_norm, eps, last_n.data(), R);
  if (R > 0) MatMulT(last_n.data(), weights_.lm_head(), ws_.logits.data(), R, 0.0f);
}

void CpuBackend::Attention(const StepInput& in, int layer, const float* qkv, float* out) {
  const int64_t D = cfg_.head_dim, q_dim = cfg_.q_width(), kv_dim = cfg_.kv_width(), qkv_dim = cfg_.qkv_width();
  const int64_t group = cfg_.num_heads / cfg_.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* kc = k_cache_[layer].get();
  const float* vc = v_cache_[layer].get();
  for (int32_t s = 0; s < in.num_seqs(); ++s) {
    const int32_t begin = in.query_start[s], end = in.query_start[s + 1];
    const int32_t* table = in.kv_indices.data() + in.kv_indptr[s];
#pragma omp parallel for collapse(2)
    for (int32_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < cfg_.num_heads; ++h) {
        thread_local std::vector<float> scores;
        const int32_t n_ctx = in.positions[t] + 1;  // causal: this token sees positions [0, pos]
        scores.resize(n_ctx);
        const float* q = qkv + int64_t{t} * qkv_dim + h * D;
        const int64_t kvh = h / group;
        float mx = -INFINITY;
        for (int32_t j = 0; j < n_ctx; ++j) {
          const int64_t slot = int64_t{table[j / block_size_]} * block_size_ + j % block_size_;
          const float* k = kc + slot * kv_dim + kvh * D;
          float dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          scores[j] = dot * scale;
          mx = std::max(mx, scores[j]);
        }
        float sum = 0;
        for (int32_t j = 0; j < n_ctx; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
        float* o = out + int64_t{t} * q_dim + h * D;
        std::fill_n(o, D, 0.0f);
        for (int32_t j = 0; j < n_ctx; ++j) {
          const int64_t slot = int64_t{table[j / block_size_]} * block_size_ + j % block_size_;
          const float* v = vc + slot * kv_dim + kvh * D;
          const float p = scores[j] / sum;
          for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const Model& model, const EngineSection& engine) {
  if (engine.quantization != "none") {
    return absl::FailedPreconditionError(absl::StrCat("engine.quantization = '", engine.quantization,
                                                      "' needs the cuda backend; the cpu backend allows: none"));
  }
  if (engine.kv_cache_dtype != "auto") {
    return absl::FailedPreconditionError(absl::StrCat("engine.kv_cache_dtype = '", engine.kv_cache_dtype,
                                                      "' needs the cuda backend; the cpu backend allows: auto"));
  }
  INFERD_ASSIGN_OR_RETURN(CpuWeights weights, BuildCpuWeights(model.tensors));
  return std::make_unique<CpuBackend>(model, engine, std::move(weights));
}

}  // namespace inferd
