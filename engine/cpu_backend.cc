#include "engine/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/check.h"

namespace inferd {

std::string MemoryPlan::ToString() const {
  return absl::StrFormat(
      "budget %.1f MiB = weights %.1f MiB + activations %.1f MiB + KV %d blocks x %.1f KiB (%.1f MiB)",
      budget_bytes / 1048576.0, weight_bytes / 1048576.0, activation_bytes / 1048576.0, num_blocks,
      kv_bytes_per_block / 1024.0, num_blocks * static_cast<double>(kv_bytes_per_block) / 1048576.0);
}

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

class CpuBackend : public Backend {
 public:
  CpuBackend(const Model& model, const EngineSection& engine, const MemoryPlan& plan)
      : model_(model), cfg_(model.config), plan_(plan), block_size_(engine.block_size) {
    if (engine.num_threads > 0) {
      openblas_set_num_threads(engine.num_threads);
      omp_set_num_threads(engine.num_threads);
    }
    inv_freq_ = RopeInverseFrequencies(cfg_);
    const size_t per_layer = size_t(plan.num_blocks) * block_size_ * cfg_.num_kv_heads * cfg_.head_dim;
    // Not zeroed: every slot is written before it is read, and untouched pages cost nothing.
    for (int l = 0; l < cfg_.num_layers; ++l) {
      k_cache_.emplace_back(new float[per_layer]);
      v_cache_.emplace_back(new float[per_layer]);
    }
  }

  std::string name() const override { return "cpu"; }
  const MemoryPlan& memory_plan() const override { return plan_; }

  absl::Status Forward(const StepInput& in, std::vector<float>* logits) override;

 private:
  void Attention(const StepInput& in, int layer, const float* qkv, float* out);

  const Model& model_;
  const ModelConfig& cfg_;
  MemoryPlan plan_;
  int32_t block_size_;
  std::vector<float> inv_freq_;                    // [head_dim / 2]
  std::vector<std::unique_ptr<float[]>> k_cache_;  // [layers][num_blocks, block_size, num_kv_heads, head_dim]
  std::vector<std::unique_ptr<float[]>> v_cache_;  // same layout as k_cache_
};

absl::Status CpuBackend::Forward(const StepInput& in, std::vector<float>* logits) {
  const int64_t T = in.num_tokens();
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t q_dim = int64_t{cfg_.num_heads} * D, kv_dim = int64_t{cfg_.num_kv_heads} * D;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int64_t num_slots = int64_t{plan_.num_blocks} * block_size_;
  for (int64_t t = 0; t < T; ++t) {
    INFERD_CHECK(in.token_ids[t] >= 0 && in.token_ids[t] < cfg_.vocab_size, "step token ids are in the vocabulary");
    INFERD_CHECK(in.slot_mapping[t] >= 0 && in.slot_mapping[t] < num_slots, "slot mapping points into the pool");
  }
  const float eps = static_cast<float>(cfg_.rms_norm_eps);

  std::vector<float> x(T * H), xn(T * H), qkv(T * qkv_dim), attn(T * q_dim), gate_up(T * 2 * I), act(T * I);
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(model_.weights.embed.data.data() + int64_t{in.token_ids[t]} * H, H, x.data() + t * H);
  }
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    const LayerWeights& L = model_.weights.layers[layer];
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
  std::vector<float> last(R * H), last_n(R * H);
  for (int64_t r = 0; r < R; ++r) std::copy_n(x.data() + int64_t{in.logits_indices[r]} * H, H, last.data() + r * H);
  RmsNorm(last.data(), model_.weights.final_norm, eps, last_n.data(), R);
  logits->resize(R * cfg_.vocab_size);
  if (R > 0) MatMulT(last_n.data(), model_.weights.lm_head, logits->data(), R, 0.0f);
  return absl::OkStatus();
}

void CpuBackend::Attention(const StepInput& in, int layer, const float* qkv, float* out) {
  const int64_t D = cfg_.head_dim, q_dim = int64_t{cfg_.num_heads} * D, kv_dim = int64_t{cfg_.num_kv_heads} * D;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int64_t group = cfg_.num_heads / cfg_.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* kc = k_cache_[layer].get();
  const float* vc = v_cache_[layer].get();
  for (int32_t s = 0; s < in.num_seqs(); ++s) {
    const int32_t begin = in.query_start[s], end = in.query_start[s + 1];
    const int32_t* table = in.block_tables.data() + int64_t{s} * in.max_blocks_per_seq;
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

int64_t WeightBytes(const ModelWeights& w) {
  int64_t n = w.embed.data.size() + w.final_norm.data.size() + w.lm_head.data.size();
  for (const LayerWeights& l : w.layers) {
    n += l.input_norm.data.size() + l.qkv.data.size() + l.qkv_bias.data.size() + l.o.data.size() +
         l.post_norm.data.size() + l.gate_up.data.size() + l.down.data.size();
  }
  return n * 4;
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanCpuMemory(const Model& model, const EngineSection& engine,
                                         const SchedulerSection& scheduler) {
  const ModelConfig& c = model.config;
  MemoryPlan plan;
  plan.weight_bytes = WeightBytes(model.weights);
  const int64_t T = scheduler.max_num_batched_tokens;
  const int64_t qkv_dim = int64_t{c.num_heads + 2 * c.num_kv_heads} * c.head_dim;
  plan.activation_bytes = 4 * (T * (2 * int64_t{c.hidden_size} + qkv_dim + int64_t{c.num_heads} * c.head_dim +
                                    3 * int64_t{c.intermediate_size}) +
                               int64_t{scheduler.max_num_seqs} * (2 * c.hidden_size + c.vocab_size));
  plan.kv_bytes_per_block = 2 * int64_t{c.num_layers} * engine.block_size * c.num_kv_heads * c.head_dim * 4;
  const int64_t kv_budget = static_cast<int64_t>(engine.cpu_kv_cache_gib * (1ll << 30));
  plan.num_blocks = engine.num_blocks > 0
                        ? engine.num_blocks
                        : static_cast<int32_t>(std::min<int64_t>(kv_budget / plan.kv_bytes_per_block, 1 << 24));
  if (plan.num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("engine.cpu_kv_cache_gib = ", engine.cpu_kv_cache_gib,
                                                   " holds no KV block of ", plan.kv_bytes_per_block, " bytes"));
  }
  plan.budget_bytes = plan.weight_bytes + plan.activation_bytes + plan.num_blocks * plan.kv_bytes_per_block;
  return plan;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const Model& model, const EngineSection& engine,
                                                          const MemoryPlan& plan) {
  return std::make_unique<CpuBackend>(model, engine, plan);
}

}  // namespace inferd
