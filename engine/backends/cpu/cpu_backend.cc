#include "engine/backends/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backends/cpu/cpu_weights.h"
#include "engine/backends/cpu/spin_pool.h"
#include "engine/backends/cpu/vec_ops.h"
#include "engine/check.h"
#include "engine/model/kv_groups.h"
#include "engine/model/moe_routing.h"
#include "engine/model/tensor_parallel.h"
#include "engine/runtime/sampler.h"
#include "engine/status_macros.h"

namespace inferd {

namespace {

// C[m, n] = A[m, k] · W[n, k]ᵀ + beta · C
void MatMulT(const float* a, const Matrix& w, float* c, int64_t m, float beta, SpinPool& pool) {
  if (w.is_stored()) {  // engine.cpu_weights: as_stored (no call accumulates into c: beta is 0)
    StoredMatMulT(a, w.stored, c, m, pool);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, w.rows, w.cols, 1.0f, a, w.cols, w.data.data(), w.cols, beta,
              c, w.rows);
}

void RmsNorm(const float* x, const Matrix& weight, float eps, float* out, int64_t rows, SpinPool& pool) {
  const int64_t n = weight.cols;
  pool.For(rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * n;
      float ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / n + eps);
      for (int64_t i = 0; i < n; ++i) out[r * n + i] = weight.data[i] * (xr[i] * inv);
    }
  });
}

// Scratch a step writes before it reads: a resized vector's new elements are left uninitialized, and a large buffer
// is mapped afresh from the kernel, so that its pages take host memory only once a step writes them (the logits
// arena of a 262,144-token vocabulary for 128 rows is 134 MB, of which a step of 16 rows touches an eighth). From
// the heap, such a buffer could land on pages that loading had already touched.
template <typename T>
struct UninitializedAllocator {
  using value_type = T;
  static constexpr size_t kMapFrom = size_t{1} << 20;  // bytes
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kMapFrom) return std::allocator<T>().allocate(n);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kMapFrom) return std::allocator<T>().deallocate(p, n);
    munmap(p, n * sizeof(T));
  }
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <typename U>
  bool operator==(const UninitializedAllocator<U>&) const noexcept {
    return true;
  }
};
using Scratch = std::vector<float, UninitializedAllocator<float>>;

// Per-step scratch, sized once for the largest step so that the hot path does not allocate; every element is
// written by a step before it is read.
struct Workspace {
  Scratch x, xn, qkv, attn, gate_up, act, tmp, sum;  // [tokens, ...]; sum: tensor-parallel only
  Scratch last, last_n, logits;                      // [logits rows, ...]
  // A mixture of experts: the router's logits [tokens, experts]; one expert's rows gathered, their gate/up, act and
  // output [tokens, ...]; and per expert the (row, weight) pairs routed to it.
  std::vector<float> router, expert_in, expert_gate_up, expert_act, expert_out;
  std::vector<std::vector<std::pair<int32_t, float>>> routed;
  std::vector<int32_t> expert_order;  // [experts]: one row's, by weight
  std::vector<int32_t> expert_ids;    // [experts per token]: one row's chosen experts
  std::vector<float> expert_weights;  // and their weights
  int64_t experts_touched = 0;        // experts with rows routed to them, summed over the step's sparse layers
  int64_t bytes() const {
    return static_cast<int64_t>(sizeof(float)) *
           (x.size() + xn.size() + qkv.size() + attn.size() + gate_up.size() + act.size() + tmp.size() + sum.size() +
            last.size() + last_n.size() + logits.size() + router.size() + expert_in.size() + expert_gate_up.size() +
            expert_act.size() + expert_out.size());
  }
};

// One rank's part of the model (engine/model/tensor_parallel.h; all of it at tensor_parallel_size 1): its slice of
// every layer, the KV of its KV heads, its own copy of the residual stream and its scratch.
struct Shard {
  TensorParallelShard tp;
  std::vector<CpuLayerWeights> layers;
  int64_t q_dim = 0, kv_dim = 0, qkv_dim = 0, inter = 0;  // its widths
  // [KV slots][num_blocks, block_size, its KV heads, head_dim] of CpuBackend::kv_ elements: a layer's K is
  // k_cache[KvGroups::slot_of[layer]], its group's blocks
  std::vector<std::unique_ptr<uint8_t[]>> k_cache;
  std::vector<std::unique_ptr<uint8_t[]>> v_cache;  // same layout as k_cache
  std::unique_ptr<uint8_t[]> host;                  // [host blocks][KV slots][K, V][block_size, its KV heads, head_dim]
  Workspace ws;                                     // x is the residual stream, equal on every rank after each sum
  std::unique_ptr<SpinPool> pool;                   // its threads: the engine's over the shards
};

class CpuBackend : public Backend {
 public:
  CpuBackend(const Model& model, const EngineSection& engine, CpuWeights weights, KvElement kv)
      : cfg_(model.config),
        kv_groups_(KvGroupsOf(model.config)),
        weights_(std::move(weights)),
        as_stored_(engine.cpu_weights == "as_stored"),
        kv_(kv),
        files_(as_stored_ ? model.tensors.files : std::vector<std::shared_ptr<const void>>{}) {
    const int threads = engine.num_threads > 0 ? engine.num_threads : omp_get_max_threads();
    // As stored, the products split over OpenMP's threads, each calling a one-thread sgemm (stored_matmul.h).
    openblas_set_num_threads(as_stored_ ? 1 : threads);
    const int32_t n = engine.tensor_parallel_size;
    threads_per_shard_ = std::max(1, threads / n);
    for (int32_t r = 0; r < n; ++r) {
      Shard& s = shards_.emplace_back();
      s.tp = ShardOf(cfg_, n, r);
      s.q_dim = s.tp.q_heads.size() * cfg_.head_dim;
      s.kv_dim = s.tp.kv_heads.size() * cfg_.head_dim;
      s.qkv_dim = s.q_dim + 2 * s.kv_dim;
      s.inter = s.tp.intermediate.size();
      s.pool = std::make_unique<SpinPool>(threads_per_shard_);
      if (n == 1) {
        s.layers = std::move(weights_.layers);
      } else {
        for (const CpuLayerWeights& l : weights_.layers) s.layers.push_back(ShardLayer(l, cfg_, s.tp));
      }
    }
    weights_.layers.clear();
    inv_freq_ = RopeInverseFrequencies(cfg_);
    inv_freq_local_ = RopeInverseFrequencies(cfg_, /*local=*/true);
    inv_freq_long_ = RopeInverseFrequencies(cfg_, /*local=*/false, /*long_positions=*/true);
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
  uint64_t Progress() const override { return work_done_.load(std::memory_order_relaxed); }
  absl::StatusOr<DeviceCeilings> MeasureCeilings() override;
  std::vector<KernelChoice> KernelChoices() const override {
    return {{"products", as_stored_ ? "the weights as stored (engine.cpu_weights): Q4_1, Q5_0, Q8_0 and Q4_K rows "
                                      "interleaved eight to a record at load through int8 kernels of our own, other "
                                      "formats (Q6_K, bf16, fp16, ...) through ggml's CPU dot kernels, each input row "
                                      "quantized to 8 bits once"
                                    : "OpenBLAS sgemm in fp32 (the reference arithmetic)"},
            {"attention", absl::StrCat("fp32 over the paged cache of ", KvElementName(kv_),
                                       " K and V, a query row at a time (a prompt's in blocks through sgemm)")},
            {"sampling", "the host sampler chain"}};
  }

 private:
  void Forward(const StepInput& in);  // fills ws_.logits[num_logits, vocab]
  // Every layer of one shard over the step's tokens, leaving the residual stream in its ws.x. With several
  // shards, each runs on its own thread and meets the others at every kResidual after a kSumRanks.
  void ShardForward(const StepInput& in, Shard& s);
  // One building block of the family's layer program (engine/model/architecture.h), in fp32.
  void RunOp(LayerOp op, const StepInput& in, Shard& s, int layer);
  void Attention(const StepInput& in, Shard& s, int layer);
  // One sequence's queries [begin, end) in blocks through OpenBLAS (a prompt's: see kBlockedQueries).
  void BlockedAttention(const StepInput& in, Shard& s, int layer, int32_t seq);
  // kMoe over a step's T rows: the router, each row's top k experts, their weighted outputs summed into tmp.
  void Moe(int64_t T, Shard& s, int layer);
  // tmp = the sum over the shards of their tmp (each holds its part of a row-parallel product), the same sum on
  // every shard.
  void SumOverShards(Shard& s, int64_t rows);

  const ModelConfig& cfg_;
  KvGroups kv_groups_;    // which blocks and KV slot each layer's K/V live in
  CpuWeights weights_;    // the embeddings, final norm and LM head; the layers are in the shards
  const bool as_stored_;  // engine.cpu_weights: as_stored
  const KvElement kv_;    // engine.kv_cache_dtype
  std::vector<std::shared_ptr<const void>> files_;  // the mapped checkpoint the stored weights point into
  std::vector<Shard> shards_;
  int32_t threads_per_shard_ = 1;
  std::unique_ptr<std::barrier<>> meet_;  // the shards' rendezvous around each sum
  StepLimits limits_;
  int32_t block_size_ = 0;
  int64_t num_slots_ = 0;
  Workspace ws_;                       // the final rows and logits
  std::vector<float> inv_freq_;        // [head_dim / 2]
  std::vector<float> inv_freq_local_;  // the sliding-window layers' (the same where the config has none)
  std::vector<float> inv_freq_long_;   // longrope's from original_max_position_embeddings on
  int32_t num_host_blocks_ = 0;
  uint64_t completed_copies_ = 0;
  StepCounters counters_;  // the device is the CPU: a step's device time is its whole Step()
  // Work begun or done inside steps, ever: each layer of a shard, each (token, head) row of attention (the part of a
  // long prefill that takes seconds per layer). Liveness reads it: a long step that moves is not a stall.
  std::atomic<uint64_t> work_done_{0};
  // A sequence's step of at least kBlockedQueries queries (a prompt) runs attention in blocks of kQueryBlock rows
  // through OpenBLAS (BlockedAttention); fewer, one (token, head) pair at a time.
  static constexpr int32_t kBlockedQueries = 16;
  static constexpr int32_t kQueryBlock = 64;
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
          SpinPool& pool = *shards_[0].pool;
          std::vector<float> sums(pool.threads(), 0.f);
          pool.For(n, 1 << 16, [&](int64_t begin, int64_t end) {
            float sum = 0;
            for (int64_t i = begin; i < end; ++i) sum += data[i];
            sums[begin * pool.threads() / n] = sum;
          });
          for (float v : sums) sink = sink + v;
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
  const int64_t H = cfg_.hidden_size;
  MemoryPlan plan;
  plan.device = "cpu";
  plan.weight_bytes = weights_.bytes();
  for (Shard& s : shards_) {
    s.ws.x.resize(T * H);
    s.ws.xn.resize(T * H);
    s.ws.qkv.resize(T * s.qkv_dim);
    s.ws.attn.resize(T * s.q_dim);
    s.ws.gate_up.resize(T * 2 * s.inter);
    s.ws.act.resize(T * s.inter);
    s.ws.tmp.resize(T * H);
    if (shards_.size() > 1) s.ws.sum.resize(T * H);
    if (cfg_.has_experts()) {
      const int64_t I = s.tp.expert_intermediate.size();
      s.ws.router.resize(T * cfg_.num_experts);
      s.ws.expert_in.resize(T * H);
      s.ws.expert_gate_up.resize(T * 2 * I);
      s.ws.expert_act.resize(T * I);
      s.ws.expert_out.resize(T * H);
      s.ws.routed.assign(cfg_.num_experts, {});
      s.ws.expert_order.resize(cfg_.num_experts);
      s.ws.expert_ids.resize(cfg_.experts_per_token);
      s.ws.expert_weights.resize(cfg_.experts_per_token);
      for (auto& rows : s.ws.routed) rows.reserve(T);
    }
    for (const CpuLayerWeights& l : s.layers) plan.weight_bytes += l.bytes();
    plan.activation_bytes += s.ws.bytes();
    plan.kv_bytes_per_block += 2 * int64_t{kv_groups_.slots} * block_size_ * s.kv_dim * KvElementBytes(kv_);
  }
  ws_.last.resize(R * H);
  ws_.last_n.resize(R * H);
  ws_.logits.resize(R * cfg_.vocab_size);
  plan.activation_bytes += ws_.bytes();
  plan.kv_dtype = KvElementName(kv_);
  return plan;
}

absl::Status CpuBackend::AllocateKvCache(const MemoryPlan& plan) {
  num_slots_ = int64_t{plan.num_blocks} * block_size_;
  // Not zeroed: every slot is written before it is read, and untouched pages cost nothing.
  for (Shard& s : shards_) {
    const size_t per_layer = size_t(num_slots_) * s.kv_dim * KvElementBytes(kv_);
    for (int l = 0; l < kv_groups_.slots; ++l) {
      s.k_cache.emplace_back(new (std::nothrow) uint8_t[per_layer]);
      s.v_cache.emplace_back(new (std::nothrow) uint8_t[per_layer]);
      if (!s.k_cache.back() || !s.v_cache.back()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the KV cache of ", plan.num_blocks, " blocks does not fit in host memory"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::AllocateHostBlocks(int32_t num_blocks) {
  for (Shard& s : shards_) {
    const size_t block = size_t(block_size_) * s.kv_dim * KvElementBytes(kv_);
    s.host.reset(new (std::nothrow) uint8_t[size_t(num_blocks) * kv_groups_.slots * 2 * block]);
    if (!s.host) {
      return absl::ResourceExhaustedError(absl::StrCat("a host KV pool of ", num_blocks, " blocks does not fit"));
    }
  }
  num_host_blocks_ = num_blocks;
  return absl::OkStatus();
}

absl::Status CpuBackend::StartCopies(const CopyBatch& batch) {
  const int64_t num_blocks = num_slots_ / block_size_;
  for (Shard& s : shards_) {
    const size_t block = size_t(block_size_) * s.kv_dim * KvElementBytes(kv_);  // bytes
    auto host = [&](int32_t h, int slot, int kv) {
      return s.host.get() + ((size_t(h) * kv_groups_.slots + slot) * 2 + kv) * block;
    };
    for (const auto* copies : {&batch.out, &batch.in}) {
      for (const BlockCopy& c : *copies) {
        INFERD_CHECK(
            c.device_block >= 0 && c.device_block < num_blocks && c.host_block >= 0 && c.host_block < num_host_blocks_,
            "block copies name blocks of the pool and the host pool");
        for (int slot = 0; slot < kv_groups_.slots; ++slot) {
          uint8_t* k = s.k_cache[slot].get() + size_t(c.device_block) * block;
          uint8_t* v = s.v_cache[slot].get() + size_t(c.device_block) * block;
          if (copies == &batch.out) {
            std::copy_n(k, block, host(c.host_block, slot, 0));
            std::copy_n(v, block, host(c.host_block, slot, 1));
          } else {
            std::copy_n(host(c.host_block, slot, 0), block, k);
            std::copy_n(host(c.host_block, slot, 1), block, v);
          }
        }
      }
    }
  }
  completed_copies_ = batch.ticket;
  return absl::OkStatus();
}

absl::Status CpuBackend::Step(const StepInput& in, StepOutput* out) {
  INFERD_CHECK(!shards_[0].k_cache.empty(), "the KV cache is allocated before the first step");
  INFERD_CHECK(in.num_tokens() <= limits_.max_num_batched_tokens && in.num_logits() <= limits_.max_logits_rows(),
               "a step fits the limits the workspace was sized for");
  INFERD_CHECK(in.sampling.size() == in.logits_indices.size(), "every logits row has its sampling parameters");
  const auto start = std::chrono::steady_clock::now();
  Forward(in);
  if (cfg_.num_experts > 0) out->experts_touched = shards_[0].ws.experts_touched;
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
  const int64_t T = in.num_tokens(), H = cfg_.hidden_size;
  INFERD_CHECK(in.num_kv_groups() == kv_groups_.num_groups(), "a step has pages for every KV group");
  for (int64_t t = 0; t < T; ++t) {
    INFERD_CHECK(in.token_ids[t] >= 0 && in.token_ids[t] < cfg_.vocab_size, "step token ids are in the vocabulary");
    for (const std::vector<int32_t>& slots : in.slot_mapping) {
      INFERD_CHECK(slots[t] >= 0 && slots[t] < num_slots_, "slot mapping points into the pool");
    }
  }
  if (shards_.size() == 1) {
    ShardForward(in, shards_[0]);
  } else {
    // One thread per shard, each with its share of the cores; they meet at every sum.
    meet_ = std::make_unique<std::barrier<>>(static_cast<std::ptrdiff_t>(shards_.size()));
    std::vector<std::thread> threads;
    for (Shard& s : shards_) {
      threads.emplace_back([&] { ShardForward(in, s); });
    }
    for (std::thread& t : threads) t.join();
  }
  // The LM head on the first shard's residual stream (every shard holds the same).
  const Scratch& x = shards_[0].ws.x;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const int64_t R = static_cast<int64_t>(in.logits_indices.size());
  Scratch &last = ws_.last, &last_n = ws_.last_n;
  for (int64_t r = 0; r < R; ++r) std::copy_n(x.data() + int64_t{in.logits_indices[r]} * H, H, last.data() + r * H);
  SpinPool& pool = *shards_[0].pool;
  RmsNorm(last.data(), weights_.final_norm, eps, last_n.data(), R, pool);
  if (R > 0) MatMulT(last_n.data(), weights_.lm_head(), ws_.logits.data(), R, 0.0f, pool);
  if (const float cap = static_cast<float>(cfg_.final_logit_softcap); cap > 0) {
    for (int64_t i = 0; i < R * cfg_.vocab_size; ++i) ws_.logits[i] = cap * std::tanh(ws_.logits[i] / cap);
  }
}

void CpuBackend::SumOverShards(Shard& s, int64_t rows) {
  if (shards_.size() == 1) return;
  const int64_t n = rows * cfg_.hidden_size;
  meet_->arrive_and_wait();  // every shard's part is written
  // The sum in rank order, so that every shard holds the same value.
  s.pool->For(n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float sum = 0;
      for (const Shard& other : shards_) sum += other.ws.tmp[i];
      s.ws.sum[i] = sum;
    }
  });
  meet_->arrive_and_wait();  // no shard changes its part while another still reads it
  std::swap(s.ws.tmp, s.ws.sum);
}

void CpuBackend::ShardForward(const StepInput& in, Shard& s) {
  const int64_t T = in.num_tokens(), H = cfg_.hidden_size;
  const float scale = static_cast<float>(cfg_.embedding_scale());
  s.ws.experts_touched = 0;
  for (int64_t t = 0; t < T; ++t) {
    float* x = s.ws.x.data() + t * H;
    if (weights_.embed.is_stored()) {
      StoredRowToFloat(weights_.embed.stored, in.token_ids[t], x);
      for (int64_t i = 0; i < H; ++i) x[i] *= scale;
      continue;
    }
    const float* e = weights_.embed.data.data() + int64_t{in.token_ids[t]} * H;
    for (int64_t i = 0; i < H; ++i) x[i] = e[i] * scale;
  }
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    work_done_.fetch_add(1, std::memory_order_relaxed);
    for (LayerOp op : cfg_.program(layer)) RunOp(op, in, s, layer);
  }
}

void CpuBackend::RunOp(LayerOp op, const StepInput& in, Shard& s, int layer) {
  const int64_t T = in.num_tokens();
  const int64_t D = cfg_.head_dim, I = s.inter;
  const int64_t q_dim = s.q_dim, kv_dim = s.kv_dim, qkv_dim = s.qkv_dim;
  const int64_t q_heads = s.tp.q_heads.size(), kv_heads = s.tp.kv_heads.size();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const CpuLayerWeights& L = s.layers[layer];
  Workspace& w = s.ws;
  SpinPool& pool = *s.pool;
  switch (op) {
    case LayerOp::kInputNorm:
      RmsNorm(w.x.data(), L.input_norm, eps, w.xn.data(), T, pool);
      return;
    case LayerOp::kPostNorm:
      RmsNorm(w.x.data(), L.post_norm, eps, w.xn.data(), T, pool);
      return;
    case LayerOp::kQkvProj:
      MatMulT(w.xn.data(), L.qkv, w.qkv.data(), T, 0.0f, pool);
      if (!L.qkv_bias.data.empty()) {
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < qkv_dim; ++i) w.qkv[t * qkv_dim + i] += L.qkv_bias.data[i];
      }
      return;
    case LayerOp::kQkNorm:  // q heads then k heads: contiguous rows of head_dim in each token's qkv row
      pool.For(T, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          float* row = w.qkv.data() + t * qkv_dim;
          for (int64_t h = 0; h < q_heads + kv_heads; ++h) {
            float* v = row + h * D;
            const std::vector<float>& weight = h < q_heads ? L.q_norm.data : L.k_norm.data;
            float ss = 0;
            for (int64_t i = 0; i < D; ++i) ss += v[i] * v[i];
            const float inv = 1.0f / std::sqrt(ss / D + eps);
            for (int64_t i = 0; i < D; ++i) v[i] = weight[i] * (v[i] * inv);
          }
        }
      });
      return;
    case LayerOp::kRope: {  // rotate-half convention over each head's leading rotary_dim, on its query and K heads
      const int64_t half = (cfg_.rotary_dim > 0 ? cfg_.rotary_dim : D) / 2;
      const bool longrope = cfg_.rope.type == "longrope";
      const float mscale = longrope ? static_cast<float>(cfg_.rope.attention_factor) : 1.0f;  // cos, sin multiplier
      pool.For(T, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          float* row = w.qkv.data() + t * qkv_dim;
          const float pos = static_cast<float>(in.positions[t]);
          const std::vector<float>& inv_freq =
              cfg_.window(layer) > 0                                                      ? inv_freq_local_
              : longrope && in.positions[t] >= cfg_.rope.original_max_position_embeddings ? inv_freq_long_
                                                                                          : inv_freq_;
          for (int64_t h = 0; h < q_heads + kv_heads; ++h) {
            float* v = row + h * D;
            for (int64_t i = 0; i < half; ++i) {
              const float angle = pos * inv_freq[i];
              const float c = std::cos(angle) * mscale, sn = std::sin(angle) * mscale;
              const float a = v[i], b = v[i + half];
              v[i] = a * c - b * sn;
              v[i + half] = b * c + a * sn;
            }
          }
        }
      });
      return;
    }
    case LayerOp::kWriteKv:
      for (int64_t t = 0; t < T; ++t) {
        const float* row = w.qkv.data() + t * qkv_dim;
        const int64_t slot = in.slot_mapping[kv_groups_.group_of[layer]][t];
        const int64_t at = slot * kv_dim * KvElementBytes(kv_);
        StoreKv(row + q_dim, s.k_cache[kv_groups_.slot_of[layer]].get() + at, kv_dim, kv_);
        StoreKv(row + q_dim + kv_dim, s.v_cache[kv_groups_.slot_of[layer]].get() + at, kv_dim, kv_);
      }
      return;
    case LayerOp::kAttention:
      Attention(in, s, layer);
      return;
    case LayerOp::kOutProj:
      MatMulT(w.attn.data(), L.o, w.tmp.data(), T, 0.0f, pool);
      return;
    case LayerOp::kSumRanks:
      SumOverShards(s, T);
      return;
    case LayerOp::kAttnOutNorm:
      RmsNorm(w.tmp.data(), L.attn_out_norm, eps, w.tmp.data(), T, pool);
      return;
    case LayerOp::kMlpOutNorm:
      RmsNorm(w.tmp.data(), L.mlp_out_norm, eps, w.tmp.data(), T, pool);
      return;
    case LayerOp::kResidual:
      pool.For(T * cfg_.hidden_size, 4096, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) w.x[i] += w.tmp[i];
      });
      return;
    case LayerOp::kGateUpProj:
      MatMulT(w.xn.data(), L.gate_up, w.gate_up.data(), T, 0.0f, pool);
      return;
    case LayerOp::kSiluMul:
    case LayerOp::kGeluTanhMul: {  // vec_ops.h
      const Gated act = op == LayerOp::kSiluMul ? Gated::kSilu : Gated::kGeluTanh;
      pool.For(T, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const float* g = w.gate_up.data() + t * 2 * I;
          GatedMul(act, g, g + I, w.act.data() + t * I, I);
        }
      });
      return;
    }
    case LayerOp::kDownProj:
      MatMulT(w.act.data(), L.down, w.tmp.data(), T, 0.0f, pool);
      return;
    case LayerOp::kMoe:
      Moe(T, s, layer);
      return;
  }
}

void CpuBackend::Moe(int64_t T, Shard& s, int layer) {
  const CpuLayerWeights& L = s.layers[layer];
  Workspace& w = s.ws;
  const int64_t H = cfg_.hidden_size, E = cfg_.num_experts, K = cfg_.experts_per_token;
  const int64_t I = s.tp.expert_intermediate.size();
  // The routing (engine/model/moe_routing.h), each row's top k appended to its experts' lists.
  MatMulT(w.xn.data(), L.router, w.router.data(), T, 0.0f, *s.pool);
  for (auto& rows : w.routed) rows.clear();
  int32_t* ids = w.expert_ids.data();
  float* weights = w.expert_weights.data();
  for (int64_t t = 0; t < T; ++t) {
    RouteRow(w.router.data() + t * E, E, K, cfg_.normalize_top_k, w.expert_order, ids, weights);
    for (int64_t j = 0; j < K; ++j) w.routed[ids[j]].push_back({static_cast<int32_t>(t), weights[j]});
  }
  // Each expert over the rows routed to it, its weighted output added into tmp, expert by expert in order.
  std::fill_n(w.tmp.data(), T * H, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = w.routed[e];
    const int64_t n = static_cast<int64_t>(rows.size());
    if (n == 0) continue;
    ++w.experts_touched;
    for (int64_t r = 0; r < n; ++r) std::copy_n(w.xn.data() + rows[r].first * H, H, w.expert_in.data() + r * H);
    MatMulT(w.expert_in.data(), L.expert_gate_up[e], w.expert_gate_up.data(), n, 0.0f, *s.pool);
    for (int64_t r = 0; r < n; ++r) {
      const float* g = w.expert_gate_up.data() + r * 2 * I;
      GatedMul(Gated::kSilu, g, g + I, w.expert_act.data() + r * I, I);
    }
    MatMulT(w.expert_act.data(), L.expert_down[e], w.expert_out.data(), n, 0.0f, *s.pool);
    for (int64_t r = 0; r < n; ++r) {
      float* out = w.tmp.data() + rows[r].first * H;
      const float* y = w.expert_out.data() + r * H;
      for (int64_t i = 0; i < H; ++i) out[i] += rows[r].second * y[i];
    }
  }
}

// A sequence's queries of one head in blocks of kQueryBlock rows: the block's scores against every position it may
// see as one sgemm (Q · Kᵀ over the head's K gathered from its pages), the causal window and softcap applied row by
// row with the softmax, then one sgemm of the probabilities and V. Each query's arithmetic is the per-pair loop's
// (below) up to the order of its sums; a prompt's scalar loops had taken most of its time (kernels/NOTES.md).
void CpuBackend::BlockedAttention(const StepInput& in, Shard& sh, int layer, int32_t seq) {
  const int64_t D = cfg_.head_dim, q_dim = sh.q_dim, kv_dim = sh.kv_dim, qkv_dim = sh.qkv_dim;
  const int64_t num_heads = sh.tp.q_heads.size();
  const float scale =
      cfg_.attention_scale > 0 ? static_cast<float>(cfg_.attention_scale) : 1.0f / std::sqrt(static_cast<float>(D));
  const float cap = static_cast<float>(cfg_.attn_logit_softcap);
  const int32_t window = cfg_.window(layer);
  const uint8_t* kc = sh.k_cache[kv_groups_.slot_of[layer]].get();
  const uint8_t* vc = sh.v_cache[kv_groups_.slot_of[layer]].get();
  const int64_t eb = KvElementBytes(kv_);
  const int32_t* table = in.kv_indices[kv_groups_.group_of[layer]].data() + in.kv_indptr[seq];
  const int32_t begin = in.query_start[seq], end = in.query_start[seq + 1];
  const int64_t blocks = (end - begin + kQueryBlock - 1) / kQueryBlock;
  // (head, block) tasks over the team, each sgemm on one thread, under as_stored (OpenBLAS runs one thread there);
  // in fp32 on this thread alone, each sgemm on OpenBLAS's threads.
  const int64_t tasks = num_heads * blocks;
  sh.pool->For(tasks, as_stored_ ? 1 : tasks, [&](int64_t first_task, int64_t last_task) {
    thread_local std::vector<float> k, v, scores;
    for (int64_t task = first_task; task < last_task; ++task) {
      const int64_t h = task / blocks, kvh = sh.tp.LocalKvHead(cfg_, h);
      const int32_t t0 = begin + static_cast<int32_t>(task % blocks) * kQueryBlock;
      const int32_t rows = std::min<int32_t>(kQueryBlock, end - t0);
      // The positions the block's queries see: [lo, hi); each query's own run is [first, pos] within it.
      const int32_t hi = in.positions[t0 + rows - 1] + 1;
      const int32_t lo = window > 0 ? std::max(0, in.positions[t0] + 1 - window) : 0;
      const int64_t n = hi - lo;
      k.resize(n * D);
      v.resize(n * D);
      scores.resize(rows * n);
      for (int32_t j = lo; j < hi; ++j) {
        const int64_t slot = int64_t{table[j / block_size_]} * block_size_ + j % block_size_;
        LoadKv(kc + (slot * kv_dim + kvh * D) * eb, k.data() + (j - lo) * D, D, kv_);
        LoadKv(vc + (slot * kv_dim + kvh * D) * eb, v.data() + (j - lo) * D, D, kv_);
      }
      const float* q = sh.ws.qkv.data() + int64_t{t0} * qkv_dim + h * D;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, D, scale, q, qkv_dim, k.data(), D, 0.0f,
                  scores.data(), n);
      for (int32_t r = 0; r < rows; ++r) {
        float* row = scores.data() + r * n;
        const int32_t n_ctx = in.positions[t0 + r] + 1;
        const int32_t first = window > 0 ? std::max(0, n_ctx - window) : 0;
        float mx = -INFINITY;
        for (int32_t j = first; j < n_ctx; ++j) {
          float& x = row[j - lo];
          if (cap > 0) x = cap * std::tanh(x / cap);
          mx = std::max(mx, x);
        }
        float sum = 0;
        for (int32_t j = first; j < n_ctx; ++j) sum += (row[j - lo] = std::exp(row[j - lo] - mx));
        for (int64_t j = 0; j < n; ++j) {
          const int32_t at = lo + static_cast<int32_t>(j);
          row[j] = at >= first && at < n_ctx ? row[j] / sum : 0.0f;
        }
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, n, 1.0f, scores.data(), n, v.data(), D, 0.0f,
                  sh.ws.attn.data() + int64_t{t0} * q_dim + h * D, q_dim);
      work_done_.fetch_add(rows, std::memory_order_relaxed);
    }
  });
}

void CpuBackend::Attention(const StepInput& in, Shard& sh, int layer) {
  const int64_t D = cfg_.head_dim, q_dim = sh.q_dim, kv_dim = sh.kv_dim, qkv_dim = sh.qkv_dim;
  const int64_t num_heads = sh.tp.q_heads.size();
  const float scale =
      cfg_.attention_scale > 0 ? static_cast<float>(cfg_.attention_scale) : 1.0f / std::sqrt(static_cast<float>(D));
  const float cap = static_cast<float>(cfg_.attn_logit_softcap);
  const int32_t window = cfg_.window(layer);
  const float* qkv = sh.ws.qkv.data();
  float* out = sh.ws.attn.data();
  const uint8_t* kc = sh.k_cache[kv_groups_.slot_of[layer]].get();
  const uint8_t* vc = sh.v_cache[kv_groups_.slot_of[layer]].get();
  const int64_t eb = KvElementBytes(kv_);
  const std::vector<int32_t>& pages = in.kv_indices[kv_groups_.group_of[layer]];
  // Sequences of many queries (a prompt) in blocks; every other sequence's (token, head) pairs over the team at once.
  // (token, its sequence); the workers read this thread's list through the reference (a lambda names a
  // thread_local variable as each thread's own).
  thread_local std::vector<std::pair<int32_t, int32_t>> this_threads_tokens;
  std::vector<std::pair<int32_t, int32_t>>& tokens = this_threads_tokens;
  tokens.clear();
  for (int32_t s = 0; s < in.num_seqs(); ++s) {
    const int32_t begin = in.query_start[s], end = in.query_start[s + 1];
    if (end - begin >= kBlockedQueries) {
      BlockedAttention(in, sh, layer, s);
      continue;
    }
    for (int32_t t = begin; t < end; ++t) tokens.push_back({t, s});
  }
  const int64_t pairs = static_cast<int64_t>(tokens.size()) * num_heads;  // (token, head), each one thread's
  sh.pool->For(pairs, 1, [&](int64_t first_pair, int64_t last_pair) {
    thread_local std::vector<float> scores;
    for (int64_t pair = first_pair; pair < last_pair; ++pair) {
      const auto [t, s] = tokens[pair / num_heads];
      const int64_t h = pair % num_heads;
      const int32_t* table = pages.data() + in.kv_indptr[s];
      // Causal: this token sees positions [first, pos], first = pos - window + 1 in a sliding-window layer.
      const int32_t n_ctx = in.positions[t] + 1;
      const int32_t first = window > 0 ? std::max(0, n_ctx - window) : 0;
      scores.resize(n_ctx);
      const float* q = qkv + int64_t{t} * qkv_dim + h * D;
      const int64_t kvh = sh.tp.LocalKvHead(cfg_, h);
      float mx = -INFINITY;
      for (int32_t j = first; j < n_ctx; ++j) {
        const int64_t slot = int64_t{table[j / block_size_]} * block_size_ + j % block_size_;
        scores[j] = DotKv(q, kc + (slot * kv_dim + kvh * D) * eb, D, kv_) * scale;
        if (cap > 0) scores[j] = cap * std::tanh(scores[j] / cap);
        mx = std::max(mx, scores[j]);
      }
      float sum = 0;
      for (int32_t j = first; j < n_ctx; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
      float* o = out + int64_t{t} * q_dim + h * D;
      std::fill_n(o, D, 0.0f);
      for (int32_t j = first; j < n_ctx; ++j) {
        const int64_t slot = int64_t{table[j / block_size_]} * block_size_ + j % block_size_;
        AxpyKv(scores[j] / sum, vc + (slot * kv_dim + kvh * D) * eb, o, D, kv_);
      }
      work_done_.fetch_add(1, std::memory_order_relaxed);
    }
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const Model& model, const EngineSection& engine) {
  if (engine.quantization != "none") {
    return absl::FailedPreconditionError(absl::StrCat("engine.quantization = '", engine.quantization,
                                                      "' needs the cuda backend; the cpu backend allows: none"));
  }
  INFERD_RETURN_IF_ERROR(CheckTensorParallel(model.config, engine.tensor_parallel_size));
  const bool as_stored = engine.cpu_weights == "as_stored";
  // auto: fp32 beside the fp32 weights (the reference arithmetic), 16-bit halves beside the stored ones, as
  // llama.cpp's cache.
  KvElement kv = as_stored ? KvElement::kFloat16 : KvElement::kFloat32;
  if (engine.kv_cache_dtype == "float32") {
    kv = KvElement::kFloat32;
  } else if (engine.kv_cache_dtype == "float16") {
    kv = KvElement::kFloat16;
  } else if (engine.kv_cache_dtype == "bfloat16") {
    kv = KvElement::kBfloat16;
  } else if (engine.kv_cache_dtype != "auto") {
    return absl::FailedPreconditionError(
        absl::StrCat("engine.kv_cache_dtype = '", engine.kv_cache_dtype,
                     "' needs the cuda backend; the cpu backend allows: auto, float32, float16, bfloat16"));
  }
  if (as_stored && engine.tensor_parallel_size > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine.cpu_weights = 'as_stored' runs tensor_parallel_size 1 on "
                     "the cpu backend (got ",
                     engine.tensor_parallel_size, "); fp32 shards"));
  }
  if (as_stored && !StoredKernelsAvailable()) {
    return absl::FailedPreconditionError(
        "engine.cpu_weights = 'as_stored' needs a CPU with AVX2, FMA, F16C and BMI2 (x86-64-v3), which this one "
        "lacks; allowed here: fp32");
  }
  INFERD_ASSIGN_OR_RETURN(CpuWeights weights, BuildCpuWeights(model.tensors, as_stored));
  return std::make_unique<CpuBackend>(model, engine, std::move(weights), kv);
}

}  // namespace inferd
