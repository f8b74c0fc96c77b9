#include "engine/backends/cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/backends/cuda/ceilings.h"
#include "engine/backends/cuda/cuda_check.h"
#include "engine/backends/cuda/cuda_weights.h"
#include "engine/backends/cuda/device_buffer.h"
#include "engine/backends/cuda/gemm.h"
#include "engine/backends/cuda/nvml.h"
#include "engine/check.h"
#include "engine/runtime/device_memory.h"
#include "engine/status_macros.h"
#include "engine/trace.h"
#include "kernels/ceilings.h"
#include "kernels/elementwise.h"
#include "kernels/gemv.h"
#include "kernels/kv_swap.h"
#include "kernels/paged_attention.h"
#include "kernels/sampling.h"
#include "spdlog/spdlog.h"

namespace inferd {
namespace {

using cuda::CudaLayerWeights;
using cuda::CudaWeights;
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;
namespace k = kernels;

// `inferd plan` computes this backend's allocations without a GPU (engine/runtime/device_memory.h).
static_assert(kPlanAttentionWorkspaceBytes == k::kAttentionFloatWorkspaceBytes + k::kAttentionIntWorkspaceBytes);
static_assert(kPlanMaxTopLogprobs == k::kMaxTopLogprobs);

#define INFERD_KERNEL(expr) INFERD_RETURN_IF_ERROR(::inferd::cuda::FromCuda((expr), #expr))

// Carves typed arrays out of one allocation at fixed, 256-byte aligned offsets.
struct Arena {
  size_t size = 0;
  size_t Add(size_t bytes) {
    const size_t at = size;
    size += (bytes + 255) / 256 * 256;
    return at;
  }
};

// Where each step-input array lives in the input arena (pinned on the host, mirrored on the device).
struct InputOffsets {
  size_t token_ids, positions, slots;                    // [max tokens]
  size_t qo_indptr, kv_indptr;                           // [max seqs + 1]
  size_t kv_last_page_len, logits_indices;               // [max seqs]
  size_t params;                                         // [max seqs] SamplingRowParams
  size_t penalty_indptr;                                 // [max seqs + 1]
  size_t kv_indices;                                     // [max pages]; the last section copied from the start
  size_t penalty_tokens, penalty_counts, penalty_flags;  // [max penalty entries]
};

// Where each output array lives in the output arena.
struct OutputOffsets {
  size_t tokens, logprobs, top_ids, top_logprobs;
};

template <typename T>
class CudaBackend : public Backend {
 public:
  CudaBackend(const Model& model, CudaWeights weights, cudaDataType_t dtype, int64_t free_at_start, std::string device,
              bool cuda_graphs)
      : use_graphs_(cuda_graphs),
        cfg_(model.config),
        num_eos_(static_cast<int64_t>(model.eos_token_ids.size())),
        w_(std::move(weights)),
        dtype_(dtype),
        free_at_start_(free_at_start),
        device_(std::move(device)),
        nvml_(cuda::Nvml::Open(0)) {}

  ~CudaBackend() override {
    if (compute_) cudaStreamSynchronize(compute_);
    for (auto* graphs : {&graphs_, &unsplit_graphs_})
      for (auto& [rows, g] : *graphs) cudaGraphExecDestroy(g.exec);
    for (Slot& slot : slots_)
      for (cudaEvent_t e : {slot.outputs_ready, slot.compute_start, slot.compute_end})
        if (e) cudaEventDestroy(e);
    if (inputs_consumed_) cudaEventDestroy(inputs_consumed_);
    if (compute_) cudaStreamDestroy(compute_);
  }

  std::string name() const override { return "cuda"; }
  StepCounters counters() const override { return counters_; }
  absl::StatusOr<MemoryPlan> MeasureMemory(const StepLimits& limits) override;
  absl::Status AllocateKvCache(const MemoryPlan& plan) override;
  absl::Status AllocateSwapSpace(int32_t num_blocks) override;
  absl::Status SwapBlocks(std::span<const BlockCopy> out, std::span<const BlockCopy> in) override;
  absl::Status Step(const StepInput& input, StepOutput* output) override;
  absl::Status Launch(const StepInput& input) override;
  absl::Status Collect(StepOutput* output) override;
  absl::StatusOr<DeviceCeilings> MeasureCeilings() override;
  DeviceReading ReadDevice() const override { return nvml_ ? nvml_->Read() : DeviceReading{}; }

 private:
  absl::Status AllocateWorkspace();
  absl::Status AllocateInputs(int64_t max_pages, int64_t max_penalties);
  absl::Status AllocatePool(int32_t num_blocks);
  absl::Status Pack(const StepInput& in, size_t* penalty_entries);
  absl::Status Upload(const StepInput& in, size_t penalty_entries);
  absl::Status Plan(const StepInput& in, bool decode_graph, bool unsplit_kv, k::AttentionPlan* plan);
  absl::Status Forward(const StepInput& in, const k::AttentionPlan& plan);
  // Decode steps replay a CUDA graph captured at start-up for the smallest bucket that holds them; the rows
  // past the step's own are padding that reads and writes the reserved block only.
  StepInput PadDecode(const StepInput& in, int32_t rows) const;
  absl::Status CaptureDecodeGraphs();
  absl::Status CaptureDecodeGraph(int32_t rows, bool unsplit_kv);
  // Whether this decode step replays its bucket's graph of unsplit KV attention (k::DecodeKvUnsplit).
  bool UseUnsplitGraph(const StepInput& in, int32_t bucket) const;
  // Chooses cuBLASLt's algorithm by measurement for each product at each of these row counts (those past the
  // streaming kernel's), before the graphs freeze them.
  absl::Status TuneProducts(const std::vector<int32_t>& rows);
  int32_t DecodeBucket(const StepInput& in) const;
  T* K(int layer) const { return kv_.get<T>() + int64_t{layer} * 2 * layer_kv_elems_; }
  T* V(int layer) const { return K(layer) + layer_kv_elems_; }
  template <typename U>
  U* In(size_t off) const {
    return reinterpret_cast<U*>(inputs_dev_.get<char>() + off);
  }
  template <typename U>
  U* InHost(size_t off) const {
    return reinterpret_cast<U*>(inputs_host_.get<char>() + off);
  }

  struct DecodeGraph {
    cudaGraphExec_t exec = nullptr;
    k::AttentionPlan plan;  // the plan its attention was captured with; a replay must plan the same layout
  };
  const bool use_graphs_;
  std::map<int32_t, DecodeGraph> graphs_;          // by padded batch size; attention splits KV
  std::map<int32_t, DecodeGraph> unsplit_graphs_;  // the buckets whose rows alone fill the GPU; unsplit KV
  int32_t num_sms_ = 0;
  int32_t reserved_block_ = -1;  // the pool's last block, outside the scheduler's pool
  const ModelConfig& cfg_;
  int64_t num_eos_;  // ids banned before min_tokens, with the request's stop ids
  CudaWeights w_;
  cudaDataType_t dtype_;
  int64_t free_at_start_;
  std::string device_;
  std::unique_ptr<cuda::Nvml> nvml_;  // null where NVML cannot be loaded
  StepLimits limits_;
  int64_t activation_bytes_ = 0;
  std::unique_ptr<cuda::Gemm> gemm_;
  // One stream runs everything a step does in order: its input copies (the graphs read the inputs at fixed
  // addresses, so step N + 1's may land only once step N has read them), its kernels, the copy of its sampled
  // tokens to the host. The host overlaps: it packs step N + 1 while the device runs step N.
  cudaStream_t compute_ = nullptr;
  cudaEvent_t inputs_consumed_ = nullptr;  // the last launch's copies from the pinned inputs have run
  // A launched step's results land in its slot; three, so that while step N + 1 is launched and N collected,
  // N - 1's timing events are still there to measure the device's idle time before N.
  struct Slot {
    PinnedBuffer outputs_host;
    cudaEvent_t outputs_ready = nullptr;
    cudaEvent_t compute_start = nullptr, compute_end = nullptr;  // timing events around the step's compute
  };
  static constexpr int kSlots = 3;
  Slot slots_[kSlots];
  struct Launched {
    int slot = 0;
    int previous_slot = -1;      // the slot of the step launched just before it, if any
    std::vector<int32_t> top_n;  // per logits row: logprob alternatives reported
  };
  std::deque<Launched> launched_;  // oldest first; at most two
  int64_t launches_ = 0;
  int32_t last_num_logits_ = -1;  // rows the last launched step samples: what a PendingToken may name
  StepCounters counters_;

  // Activations: [max tokens, ...] and [max seqs, ...] (logits rows).
  DeviceBuffer x_, xn_, qkv_, attn_, tmp_, gate_up_, act_, last_, last_delta_, last_n_, logits_, penalty_raw_;
  DeviceBuffer inv_freq_;                     // [head_dim / 2] fp32
  DeviceBuffer attn_float_ws_, attn_int_ws_;  // FlashInfer's planner workspaces
  PinnedBuffer attn_int_ws_host_;
  DeviceBuffer inputs_dev_, outputs_dev_;
  PinnedBuffer inputs_host_;
  InputOffsets in_;
  OutputOffsets out_;
  int64_t max_pages_ = 0, max_penalties_ = 0;

  // KV pool: per layer K then V, each [num_blocks, block_size, num_kv_heads, head_dim].
  DeviceBuffer kv_;
  // Host swap space, pinned and mapped: [swap block][layer][K, V][block]; and the copy lists the swap kernel
  // reads (mapped too): device blocks then host blocks, for the outs then the ins.
  PinnedBuffer swap_, swap_lists_;
  char* swap_dev_ = nullptr;
  int32_t* swap_lists_dev_ = nullptr;
  int32_t num_swap_blocks_ = 0;
  int64_t layer_kv_elems_ = 0;
  int64_t num_slots_ = 0;
};

template <typename T>
absl::Status CudaBackend<T>::AllocateWorkspace() {
  INFERD_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  INFERD_CUDA(cudaEventCreateWithFlags(&inputs_consumed_, cudaEventDisableTiming));
  for (Slot& slot : slots_) {
    INFERD_CUDA(cudaEventCreateWithFlags(&slot.outputs_ready, cudaEventDisableTiming));
    INFERD_CUDA(cudaEventCreate(&slot.compute_start));
    INFERD_CUDA(cudaEventCreate(&slot.compute_end));
  }
  const int64_t Tn = limits_.max_num_batched_tokens, R = limits_.max_num_seqs;
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t q_dim = int64_t{cfg_.num_heads} * D, qkv_dim = q_dim + 2 * int64_t{cfg_.num_kv_heads} * D;
  int64_t* a = &activation_bytes_;
  const size_t e = sizeof(T);
  INFERD_RETURN_IF_ERROR(x_.Allocate(Tn * H * e, a));
  INFERD_RETURN_IF_ERROR(xn_.Allocate(Tn * H * e, a));
  INFERD_RETURN_IF_ERROR(qkv_.Allocate(Tn * qkv_dim * e, a));
  INFERD_RETURN_IF_ERROR(attn_.Allocate(Tn * q_dim * e, a));
  INFERD_RETURN_IF_ERROR(tmp_.Allocate(Tn * H * e, a));
  INFERD_RETURN_IF_ERROR(gate_up_.Allocate(Tn * 2 * I * e, a));
  INFERD_RETURN_IF_ERROR(act_.Allocate(Tn * I * e, a));
  INFERD_RETURN_IF_ERROR(last_.Allocate(R * H * e, a));
  INFERD_RETURN_IF_ERROR(last_delta_.Allocate(R * H * e, a));
  INFERD_RETURN_IF_ERROR(last_n_.Allocate(R * H * e, a));
  INFERD_RETURN_IF_ERROR(logits_.Allocate(R * int64_t{cfg_.vocab_size} * sizeof(float), a));
  INFERD_RETURN_IF_ERROR(attn_float_ws_.Allocate(k::kAttentionFloatWorkspaceBytes, a));
  INFERD_RETURN_IF_ERROR(attn_int_ws_.Allocate(k::kAttentionIntWorkspaceBytes, a));
  INFERD_RETURN_IF_ERROR(attn_int_ws_host_.Allocate(k::kAttentionIntWorkspaceBytes));
  const std::vector<float> inv_freq = RopeInverseFrequencies(cfg_);
  INFERD_RETURN_IF_ERROR(inv_freq_.Allocate(inv_freq.size() * sizeof(float), a));
  INFERD_CUDA(cudaMemcpy(inv_freq_.get(), inv_freq.data(), inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  INFERD_ASSIGN_OR_RETURN(gemm_, cuda::Gemm::Create(dtype_, a));
  Arena out;
  out_.tokens = out.Add(R * sizeof(int32_t));
  out_.logprobs = out.Add(R * sizeof(float));
  out_.top_ids = out.Add(R * k::kMaxTopLogprobs * sizeof(int32_t));
  out_.top_logprobs = out.Add(R * k::kMaxTopLogprobs * sizeof(float));
  INFERD_RETURN_IF_ERROR(outputs_dev_.Allocate(out.size, a));
  for (Slot& slot : slots_) INFERD_RETURN_IF_ERROR(slot.outputs_host.Allocate(out.size));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::AllocateInputs(int64_t max_pages, int64_t max_penalties) {
  const int64_t Tn = limits_.max_num_batched_tokens, R = limits_.max_num_seqs;
  Arena a;
  in_.token_ids = a.Add(Tn * 4);
  in_.positions = a.Add(Tn * 4);
  in_.slots = a.Add(Tn * 4);
  in_.qo_indptr = a.Add((R + 1) * 4);
  in_.kv_indptr = a.Add((R + 1) * 4);
  in_.kv_last_page_len = a.Add(R * 4);
  in_.logits_indices = a.Add(R * 4);
  in_.params = a.Add(R * sizeof(k::SamplingRowParams));
  in_.penalty_indptr = a.Add((R + 1) * 4);
  in_.kv_indices = a.Add(max_pages * 4);
  in_.penalty_tokens = a.Add(max_penalties * 4);
  in_.penalty_counts = a.Add(max_penalties * 4);
  in_.penalty_flags = a.Add(max_penalties);
  INFERD_RETURN_IF_ERROR(inputs_dev_.Allocate(a.size));
  INFERD_RETURN_IF_ERROR(inputs_host_.Allocate(a.size));
  INFERD_RETURN_IF_ERROR(penalty_raw_.Allocate(max_penalties * sizeof(float)));
  max_pages_ = max_pages;
  max_penalties_ = max_penalties;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::AllocatePool(int32_t num_blocks) {
  kv_ = DeviceBuffer();
  num_slots_ = int64_t{num_blocks} * limits_.block_size;
  layer_kv_elems_ = num_slots_ * cfg_.num_kv_heads * cfg_.head_dim;
  return kv_.Allocate(2 * cfg_.num_layers * layer_kv_elems_ * sizeof(T));
}

template <typename T>
absl::StatusOr<DeviceCeilings> CudaBackend<T>::MeasureCeilings() {
  // Small enough to fit beside the weights on any card that runs the model: 1 GiB of reads (20 times the
  // H100's L2) unless a quarter of the free memory is less, and a GEMM of 8192^3 (384 MiB) or 4096^3.
  size_t free = 0, total = 0;
  INFERD_CUDA(cudaMemGetInfo(&free, &total));
  const int64_t read_bytes = std::min<int64_t>(int64_t{1} << 30, static_cast<int64_t>(free / 4));
  const int64_t n = free > (size_t{2} << 30) ? 8192 : 4096;
  const bool bf16 = dtype_ == CUDA_R_16BF;
  DeviceCeilings c;
  // The GEMM first: its warm-up raises the clocks the read test then runs at.
  INFERD_ASSIGN_OR_RETURN(c.gemm_flops_per_s, cuda::MeasureGemmRate(*gemm_, bf16, n, compute_));
  INFERD_ASSIGN_OR_RETURN(c.read_bytes_per_s, cuda::MeasureReadBandwidth(read_bytes, compute_));
  c.read_test = absl::StrCat("a read-only reduction over ", read_bytes >> 20, " MiB");
  c.gemm_test = absl::StrCat("cuBLASLt ", bf16 ? "bf16" : "fp16", " GEMM at ", n, "^3");
  return c;
}

template <typename T>
absl::StatusOr<MemoryPlan> CudaBackend<T>::MeasureMemory(const StepLimits& limits) {
  limits_ = limits;
  INFERD_RETURN_IF_ERROR(AllocateWorkspace());
  const int64_t Tn = limits.max_num_batched_tokens, R = limits.max_num_seqs, bs = limits.block_size;
  // The largest step: R sequences, one holding every token the budget leaves after R - 1 decodes, on a
  // temporary pool just big enough; each row samples with every option on, so sampling's peak is seen too.
  const int32_t long_len = static_cast<int32_t>(Tn - (R - 1));
  const int32_t blocks = static_cast<int32_t>((long_len + bs - 1) / bs + (R - 1));
  // Step inputs at their worst case, allocated before measuring so that the plan covers them: every sequence
  // at the model's longest context, and one penalty entry per distinct id it can hold or ban (eos ids and
  // at most kMaxStopTokenIds stop ids).
  const int64_t max_context = cfg_.max_position_embeddings;
  const int64_t max_banned = kMaxStopTokenIds + num_eos_;
  INFERD_RETURN_IF_ERROR(AllocateInputs(std::min<int64_t>(R * ((max_context + bs - 1) / bs), int64_t{1} << 22),
                                        R * std::min<int64_t>(max_context + max_banned, cfg_.vocab_size)));
  INFERD_RETURN_IF_ERROR(AllocatePool(blocks));
  StepInput in;
  in.block_size = static_cast<int32_t>(bs);
  in.query_start.push_back(0);
  in.kv_indptr.push_back(0);
  std::vector<int32_t> history(long_len);
  for (int32_t i = 0; i < long_len; ++i) history[i] = (i * 7919) % cfg_.vocab_size;
  int32_t next_block = 0;
  for (int32_t s = 0; s < R; ++s) {
    const int32_t len = s == 0 ? long_len : 1;
    const int32_t pages = (len + bs - 1) / bs;
    for (int32_t p = 0; p < len; ++p) {
      in.token_ids.push_back(history[p]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(static_cast<int32_t>((next_block + p / bs) * bs + p % bs));
    }
    for (int32_t p = 0; p < pages; ++p) in.kv_indices.push_back(next_block++);
    in.query_start.push_back(in.num_tokens());
    in.kv_indptr.push_back(static_cast<int32_t>(in.kv_indices.size()));
    in.kv_last_page_len.push_back(len - (pages - 1) * static_cast<int32_t>(bs));
    in.context_lens.push_back(len);
    in.logits_indices.push_back(in.num_tokens() - 1);
    SamplingRow row;
    row.params.temperature = 0.8f;
    row.params.top_k = 50;
    row.params.top_p = 0.9f;
    row.params.min_p = 0.01f;
    row.params.repetition_penalty = 1.1f;
    row.position = len;
    row.uniform = 0.5;
    row.tokens = std::span<const int32_t>(history.data(), len);
    row.num_prompt_tokens = len;
    row.top_logprobs = k::kMaxTopLogprobs;
    in.sampling.push_back(row);
  }
  StepOutput out;
  INFERD_RETURN_IF_ERROR(Step(in, &out));
  kv_ = DeviceBuffer();
  size_t free = 0, total = 0;
  INFERD_CUDA(cudaMemGetInfo(&free, &total));
  MemoryPlan plan;
  plan.device = device_;
  plan.device_total_bytes = static_cast<int64_t>(total);
  plan.device_free_bytes = free_at_start_;
  plan.weight_bytes = w_.bytes;
  plan.activation_bytes = activation_bytes_;
  if (const int64_t planned = DeviceActivationBytes(cfg_, limits_, sizeof(T)); planned != activation_bytes_) {
    spdlog::warn("cuda: activations take {} bytes, `inferd plan` computes {}: its formula needs updating",
                 activation_bytes_, planned);
  }
  plan.other_bytes = std::max<int64_t>(0, free_at_start_ - static_cast<int64_t>(free) - w_.bytes - activation_bytes_);
  plan.kv_bytes_per_block = 2 * int64_t{cfg_.num_layers} * bs * cfg_.num_kv_heads * cfg_.head_dim * sizeof(T);
  plan.other_bytes += plan.kv_bytes_per_block;  // the reserved block that padded decode rows use
  return plan;
}

template <typename T>
absl::Status CudaBackend<T>::AllocateKvCache(const MemoryPlan& plan) {
  INFERD_RETURN_IF_ERROR(AllocatePool(plan.num_blocks + 1));
  reserved_block_ = plan.num_blocks;
  if (use_graphs_) INFERD_RETURN_IF_ERROR(CaptureDecodeGraphs());
  spdlog::info("cuda: KV pool of {} blocks ({:.1f} MiB) allocated", plan.num_blocks, kv_.bytes() / 1048576.0);
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::AllocateSwapSpace(int32_t num_blocks) {
  const int64_t block_bytes = int64_t{limits_.block_size} * cfg_.num_kv_heads * cfg_.head_dim * sizeof(T);
  INFERD_RETURN_IF_ERROR(swap_.Allocate(int64_t{num_blocks} * 2 * cfg_.num_layers * block_bytes));
  const int64_t max_copies = std::max<int64_t>(num_blocks, num_slots_ / limits_.block_size);
  INFERD_RETURN_IF_ERROR(swap_lists_.Allocate(4 * max_copies * sizeof(int32_t)));
  void* p = nullptr;
  INFERD_CUDA(cudaHostGetDevicePointer(&p, swap_.get(), 0));
  swap_dev_ = static_cast<char*>(p);
  INFERD_CUDA(cudaHostGetDevicePointer(&p, swap_lists_.get(), 0));
  swap_lists_dev_ = static_cast<int32_t*>(p);
  num_swap_blocks_ = num_blocks;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::SwapBlocks(std::span<const BlockCopy> out, std::span<const BlockCopy> in) {
  if (out.empty() && in.empty()) return absl::OkStatus();
  INFERD_CHECK(num_swap_blocks_ > 0 && int64_t(out.size() + in.size()) * 4 * sizeof(int32_t) <= swap_lists_.bytes(),
               "swap copies fit the lists sized for the pool");
  INFERD_CUDA(cudaStreamSynchronize(compute_));  // the last swap's kernels have read the lists
  int32_t* lists = swap_lists_.get<int32_t>();
  size_t at = 0;
  for (std::span<const BlockCopy> copies : {out, in}) {
    for (size_t i = 0; i < copies.size(); ++i) {
      INFERD_CHECK(copies[i].device_block >= 0 && copies[i].device_block < reserved_block_ &&
                       copies[i].host_block >= 0 && copies[i].host_block < num_swap_blocks_,
                   "swap copies name blocks of the pool and the swap space");
      lists[at + i] = copies[i].device_block;
      lists[at + copies.size() + i] = copies[i].host_block;
    }
    at += 2 * copies.size();
  }
  const int64_t block_bytes = int64_t{limits_.block_size} * cfg_.num_kv_heads * cfg_.head_dim * sizeof(T);
  const int64_t layer_bytes = layer_kv_elems_ * sizeof(T);
  const int32_t n_out = static_cast<int32_t>(out.size()), n_in = static_cast<int32_t>(in.size());
  // Same stream as the steps: outs read blocks before the next step reuses them; ins land before it reads them.
  INFERD_KERNEL(k::CopyKvBlocks(kv_.get<char>(), swap_dev_, swap_lists_dev_, swap_lists_dev_ + n_out, n_out,
                                cfg_.num_layers, layer_bytes, block_bytes, /*to_host=*/true, compute_));
  INFERD_KERNEL(k::CopyKvBlocks(kv_.get<char>(), swap_dev_, swap_lists_dev_ + 2 * n_out,
                                swap_lists_dev_ + 2 * n_out + n_in, n_in, cfg_.num_layers, layer_bytes, block_bytes,
                                /*to_host=*/false, compute_));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::Pack(const StepInput& in, size_t* penalty_entries) {
  const int32_t R = in.num_logits();
  auto put = [&](size_t off, const std::vector<int32_t>& v) {
    std::memcpy(InHost<int32_t>(off), v.data(), v.size() * sizeof(int32_t));
  };
  put(in_.token_ids, in.token_ids);
  put(in_.positions, in.positions);
  put(in_.slots, in.slot_mapping);
  put(in_.qo_indptr, in.query_start);
  put(in_.kv_indptr, in.kv_indptr);
  put(in_.kv_last_page_len, in.kv_last_page_len);
  put(in_.logits_indices, in.logits_indices);
  put(in_.kv_indices, in.kv_indices);
  // Penalty entries: one per distinct id of a row that uses penalties or bans ids.
  std::vector<std::pair<int32_t, int32_t>> seen;  // (id, 1 when from the output)
  int32_t* indptr = InHost<int32_t>(in_.penalty_indptr);
  indptr[0] = 0;
  size_t n = 0;
  for (int32_t r = 0; r < R; ++r) {
    const SamplingRow& row = in.sampling[r];
    const SamplingParams& p = row.params;
    k::SamplingRowParams& kp = InHost<k::SamplingRowParams>(in_.params)[r];
    kp = {p.temperature,
          p.top_k,
          p.top_p,
          p.min_p,
          p.repetition_penalty,
          p.presence_penalty,
          p.frequency_penalty,
          std::min(row.top_logprobs, k::kMaxTopLogprobs),
          row.uniform};
    const bool penalized = p.penalized();
    seen.clear();
    if (penalized) {
      for (size_t i = 0; i < row.tokens.size(); ++i) {
        if (p.repetition_penalty != 1.f || static_cast<int32_t>(i) >= row.num_prompt_tokens) {
          seen.emplace_back(row.tokens[i], static_cast<int32_t>(i) >= row.num_prompt_tokens ? 1 : 0);
        }
      }
    }
    for (int32_t b : row.banned) seen.emplace_back(b, -1);
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      const int32_t id = seen[i].first;
      int32_t count = 0;
      uint8_t flags = 0;
      for (; i < seen.size() && seen[i].first == id; ++i) {
        if (seen[i].second == -1) {
          flags |= k::kPenaltyBanned;
        } else {
          flags |= k::kPenaltySeen;
          count += seen[i].second;
        }
      }
      if (id < 0 || id >= cfg_.vocab_size) continue;
      INFERD_CHECK(static_cast<int64_t>(n) < max_penalties_, "penalty entries fit (sized for every row's context)");
      InHost<int32_t>(in_.penalty_tokens)[n] = id;
      InHost<int32_t>(in_.penalty_counts)[n] = count;
      InHost<uint8_t>(in_.penalty_flags)[n] = p.repetition_penalty != 1.f ? flags : (flags & k::kPenaltyBanned);
      ++n;
    }
    indptr[r + 1] = static_cast<int32_t>(n);
  }
  *penalty_entries = n;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::Upload(const StepInput& in, size_t penalties) {
  // Only what this step uses goes up: the fixed-size sections and the used page table in one copy, penalty
  // entries (sized for the worst case, megabytes) only when a row has any.
  const size_t head = in_.kv_indices + in.kv_indices.size() * sizeof(int32_t);
  INFERD_CUDA(cudaMemcpyAsync(inputs_dev_.get(), inputs_host_.get(), head, cudaMemcpyHostToDevice, compute_));
  if (penalties > 0) {
    for (auto [offset, bytes] : {std::pair{in_.penalty_tokens, penalties * sizeof(int32_t)},
                                 std::pair{in_.penalty_counts, penalties * sizeof(int32_t)},
                                 std::pair{in_.penalty_flags, penalties * sizeof(uint8_t)}}) {
      INFERD_CUDA(cudaMemcpyAsync(inputs_dev_.get<char>() + offset, inputs_host_.get<char>() + offset, bytes,
                                  cudaMemcpyHostToDevice, compute_));
    }
  }
  return absl::OkStatus();
}

// Graph buckets: 1, 2, 4, ... up to max_num_seqs (itself the last), only for batches whose every row is one
// new token that samples.
template <typename T>
int32_t CudaBackend<T>::DecodeBucket(const StepInput& in) const {
  if (graphs_.empty() || in.num_seqs() == 0 || in.num_tokens() != in.num_seqs() || in.num_logits() != in.num_seqs()) {
    return 0;
  }
  auto it = graphs_.lower_bound(in.num_seqs());
  if (it == graphs_.end()) return 0;
  const int64_t padded_pages = static_cast<int64_t>(in.kv_indices.size()) + (it->first - in.num_seqs());
  return padded_pages <= max_pages_ ? it->first : 0;  // padding takes one page per row
}

template <typename T>
StepInput CudaBackend<T>::PadDecode(const StepInput& in, int32_t rows) const {
  StepInput p = in;
  const int32_t bs = in.block_size;
  for (int32_t r = in.num_seqs(); r < rows; ++r) {
    p.token_ids.push_back(0);
    p.positions.push_back(0);
    p.slot_mapping.push_back(reserved_block_ * bs);
    p.query_start.push_back(p.query_start.back() + 1);
    p.context_lens.push_back(1);
    p.kv_indices.push_back(reserved_block_);
    p.kv_indptr.push_back(p.kv_indptr.back() + 1);
    p.kv_last_page_len.push_back(1);
    p.logits_indices.push_back(r);
    SamplingRow& greedy = p.sampling.emplace_back();
    greedy.params.temperature = 0;
    greedy.position = 1;
  }
  return p;
}

template <typename T>
absl::Status CudaBackend<T>::TuneProducts(const std::vector<int32_t>& rows) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t q_dim = int64_t{cfg_.num_heads} * D, qkv_dim = q_dim + 2 * int64_t{cfg_.num_kv_heads} * D;
  const bool bf16 = dtype_ == CUDA_R_16BF;
  for (DeviceBuffer* x : {&xn_, &attn_, &act_, &last_n_}) {  // random inputs: timings on real-looking data
    INFERD_CUDA(k::FillUniform16(x->get(), static_cast<int64_t>(x->bytes() / sizeof(T)), bf16, 3, compute_));
  }
  struct Product {
    const char* name;
    std::vector<const void*> weights;  // every layer's, cycled so that none is served from L2
    const void* x;
    void* y;
    int64_t n, k;
    const void* bias;
    bool out_fp32;
  };
  std::vector<Product> products = {
      {"qkv", {}, xn_.get(), qkv_.get(), qkv_dim, H, nullptr, false},
      {"o", {}, attn_.get(), tmp_.get(), H, q_dim, nullptr, false},
      {"gate_up", {}, xn_.get(), gate_up_.get(), 2 * I, H, nullptr, false},
      {"down", {}, act_.get(), tmp_.get(), H, I, nullptr, false},
      {"lm_head", {w_.lm_head()}, last_n_.get(), logits_.get(), cfg_.vocab_size, H, nullptr, true}};
  for (const CudaLayerWeights& L : w_.layers) {
    products[0].weights.push_back(L.qkv.get());
    products[0].bias = L.qkv_bias.bytes() ? L.qkv_bias.get() : nullptr;
    products[1].weights.push_back(L.o.get());
    products[2].weights.push_back(L.gate_up.get());
    products[3].weights.push_back(L.down.get());
  }
  std::vector<std::string> gains;
  for (int32_t m : rows) {
    if (m <= gemm_->gemv_max_rows()) continue;  // the streaming kernel's
    for (const Product& p : products) {
      INFERD_ASSIGN_OR_RETURN(const double gain,
                              gemm_->Tune(p.x, p.weights, p.y, m, p.n, p.k, p.bias, p.out_fp32, compute_));
      if (gain > 1.02) gains.push_back(absl::StrFormat("%s at %d rows %.2fx", p.name, m, gain));
    }
  }
  spdlog::info("cuda: cuBLASLt algorithms chosen by measurement in {:.2f} s; faster than the heuristic's first: {}",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               gains.empty() ? "none" : absl::StrJoin(gains, ", "));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::CaptureDecodeGraphs() {
  std::vector<int32_t> buckets;
  for (int32_t b = 1; b < limits_.max_num_seqs; b *= 2) buckets.push_back(b);
  buckets.push_back(limits_.max_num_seqs);
  INFERD_RETURN_IF_ERROR(TuneProducts(buckets));
  int device = 0;
  INFERD_CUDA(cudaGetDevice(&device));
  INFERD_CUDA(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
  std::vector<int32_t> unsplit;
  for (int32_t rows : buckets) {
    INFERD_RETURN_IF_ERROR(CaptureDecodeGraph(rows, /*unsplit_kv=*/false));
    if (k::DecodeKvUnsplit(rows, cfg_.num_kv_heads, num_sms_, 1, rows)) {
      INFERD_RETURN_IF_ERROR(CaptureDecodeGraph(rows, /*unsplit_kv=*/true));
      unsplit.push_back(rows);
    }
  }
  spdlog::info("cuda: decode graphs captured for batches of {} rows; with unsplit KV attention too for {}",
               absl::StrJoin(buckets, ", "), unsplit.empty() ? "none" : absl::StrJoin(unsplit, ", "));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::CaptureDecodeGraph(int32_t rows, bool unsplit_kv) {
  StepInput empty;
  empty.block_size = limits_.block_size;
  empty.query_start = {0};
  empty.kv_indptr = {0};
  const StepInput in = PadDecode(empty, rows);  // every row on the reserved block
  size_t penalties = 0;
  INFERD_RETURN_IF_ERROR(Pack(in, &penalties));
  INFERD_RETURN_IF_ERROR(Upload(in, penalties));
  DecodeGraph g;
  INFERD_RETURN_IF_ERROR(Plan(in, /*decode_graph=*/true, unsplit_kv, &g.plan));
  INFERD_RETURN_IF_ERROR(Forward(in, g.plan));  // once eagerly: cuBLASLt picks its algorithms outside capture
  cudaGraph_t graph = nullptr;
  INFERD_CUDA(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = Forward(in, g.plan);
  const cudaError_t ended = cudaStreamEndCapture(compute_, &graph);
  INFERD_RETURN_IF_ERROR(captured);
  INFERD_CUDA(ended);
  const cudaError_t made = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  INFERD_CUDA(made);
  (unsplit_kv ? unsplit_graphs_ : graphs_)[rows] = g;
  // The next capture rewrites the pinned inputs and attention schedule that this one's copies read.
  INFERD_CUDA(cudaStreamSynchronize(compute_));
  return absl::OkStatus();
}

template <typename T>
bool CudaBackend<T>::UseUnsplitGraph(const StepInput& in, int32_t bucket) const {
  if (!unsplit_graphs_.contains(bucket)) return false;
  int64_t max_pages = 0;
  for (int32_t s = 0; s < in.num_seqs(); ++s)
    max_pages = std::max<int64_t>(max_pages, in.kv_indptr[s + 1] - in.kv_indptr[s]);
  return k::DecodeKvUnsplit(in.num_seqs(), cfg_.num_kv_heads, num_sms_, max_pages, in.kv_indptr.back());
}

template <typename T>
absl::Status CudaBackend<T>::Plan(const StepInput& in, bool decode_graph, bool unsplit_kv, k::AttentionPlan* plan) {
  INFERD_KERNEL(k::PlanPagedAttention(attn_float_ws_.get(), attn_int_ws_.get(), attn_int_ws_host_.get(),
                                      InHost<int32_t>(in_.qo_indptr), InHost<int32_t>(in_.kv_indptr), in.num_tokens(),
                                      in.num_seqs(), cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim, in.block_size,
                                      decode_graph, unsplit_kv, plan, compute_));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::Forward(const StepInput& in, const k::AttentionPlan& plan) {
  const int64_t Tn = in.num_tokens(), R = in.num_logits();
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t q_dim = int64_t{cfg_.num_heads} * D, qkv_dim = q_dim + 2 * int64_t{cfg_.num_kv_heads} * D;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  cudaStream_t s = compute_;
  // A pending token id names a row of the device outputs, which still hold the last launched step's tokens.
  INFERD_KERNEL(k::EmbedTokens(w_.embed.get<T>(), In<int32_t>(in_.token_ids),
                               reinterpret_cast<const int32_t*>(outputs_dev_.get<char>() + out_.tokens), x_.get<T>(),
                               Tn, H, s));
  // Steps of the streaming products' few rows fuse RoPE and the K/V write into the q/k/v product.
  const bool fused_qkv_rope =
      Tn <= std::min<int64_t>(gemm_->gemv_max_rows(), 2) && k::GemvSupports(xn_.get(), w_.layers[0].qkv.get(), Tn, H);
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    TraceRange range("layer");
    const CudaLayerWeights& L = w_.layers[layer];
    INFERD_KERNEL(k::AddRmsNorm(x_.get<T>(), layer == 0 ? nullptr : tmp_.get<T>(), L.input_norm.get<T>(), xn_.get<T>(),
                                Tn, H, eps, s));
    const T* qkv_bias = L.qkv_bias.bytes() ? L.qkv_bias.get<T>() : nullptr;
    if (fused_qkv_rope) {  // one kernel: the product, RoPE and the K/V write
      INFERD_KERNEL(k::GemvQkvRope<T>(xn_.get<T>(), L.qkv.get<T>(), qkv_bias, qkv_.get<T>(), Tn, H,
                                      In<int32_t>(in_.positions), In<int32_t>(in_.slots), inv_freq_.get<float>(),
                                      K(layer), V(layer), cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim, s));
    } else {
      INFERD_RETURN_IF_ERROR(gemm_->Run(xn_.get(), L.qkv.get(), qkv_.get(), Tn, qkv_dim, H, qkv_bias, false, s));
      INFERD_KERNEL(k::RopeWriteKv(qkv_.get<T>(), In<int32_t>(in_.positions), In<int32_t>(in_.slots),
                                   inv_freq_.get<float>(), K(layer), V(layer), Tn, cfg_.num_heads, cfg_.num_kv_heads,
                                   cfg_.head_dim, s));
    }
    {
      TraceRange attention("attention");
      INFERD_KERNEL(k::RunPagedAttention<T>(plan, attn_float_ws_.get(), attn_int_ws_.get(), qkv_.get<T>(), qkv_dim,
                                            K(layer), V(layer), In<int32_t>(in_.qo_indptr), In<int32_t>(in_.kv_indptr),
                                            In<int32_t>(in_.kv_indices), In<int32_t>(in_.kv_last_page_len),
                                            attn_.get<T>(), in.num_seqs(), cfg_.num_heads, cfg_.num_kv_heads,
                                            cfg_.head_dim, in.block_size, 1.0f / std::sqrt(static_cast<float>(D)),
                                            /*early_launch=*/Tn <= gemm_->gemv_max_rows(), s));
    }
    INFERD_RETURN_IF_ERROR(gemm_->Run(attn_.get(), L.o.get(), tmp_.get(), Tn, H, q_dim, nullptr, false, s));
    INFERD_KERNEL(k::AddRmsNorm(x_.get<T>(), tmp_.get<T>(), L.post_norm.get<T>(), xn_.get<T>(), Tn, H, eps, s));
    INFERD_RETURN_IF_ERROR(gemm_->Run(xn_.get(), L.gate_up.get(), gate_up_.get(), Tn, 2 * I, H, nullptr, false, s));
    INFERD_KERNEL(k::SiluMul(gate_up_.get<T>(), act_.get<T>(), Tn, I, s));
    INFERD_RETURN_IF_ERROR(gemm_->Run(act_.get(), L.down.get(), tmp_.get(), Tn, H, I, nullptr, false, s));
  }
  // Only the rows that sample go through the final norm and the LM head.
  TraceRange sampling("final norm, LM head and sampling");
  INFERD_KERNEL(k::GatherRows(x_.get<T>(), In<int32_t>(in_.logits_indices), last_.get<T>(), R, H, s));
  INFERD_KERNEL(k::GatherRows(tmp_.get<T>(), In<int32_t>(in_.logits_indices), last_delta_.get<T>(), R, H, s));
  INFERD_KERNEL(
      k::AddRmsNorm(last_.get<T>(), last_delta_.get<T>(), w_.final_norm.get<T>(), last_n_.get<T>(), R, H, eps, s));
  INFERD_RETURN_IF_ERROR(
      gemm_->Run(last_n_.get(), w_.lm_head(), logits_.get(), R, cfg_.vocab_size, H, nullptr, true, s));
  char* out = outputs_dev_.get<char>();
  INFERD_KERNEL(k::SampleRows(
      logits_.get<float>(), static_cast<int32_t>(R), cfg_.vocab_size, In<k::SamplingRowParams>(in_.params),
      In<int32_t>(in_.penalty_indptr), In<int32_t>(in_.penalty_tokens), In<int32_t>(in_.penalty_counts),
      In<uint8_t>(in_.penalty_flags), penalty_raw_.get<float>(), reinterpret_cast<int32_t*>(out + out_.tokens),
      reinterpret_cast<float*>(out + out_.logprobs), reinterpret_cast<int32_t*>(out + out_.top_ids),
      reinterpret_cast<float*>(out + out_.top_logprobs), s));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::Step(const StepInput& in, StepOutput* out) {
  INFERD_CHECK(launched_.empty(), "nothing else is launched and not collected around a step");
  INFERD_RETURN_IF_ERROR(Launch(in));
  return Collect(out);
}

template <typename T>
absl::Status CudaBackend<T>::Launch(const StepInput& in) {
  INFERD_CHECK(kv_.bytes() > 0, "the KV cache is allocated before a step");
  INFERD_CHECK(launched_.size() < 2, "at most two steps are launched and not collected");
  INFERD_CHECK(in.num_tokens() <= limits_.max_num_batched_tokens && in.num_seqs() <= limits_.max_num_seqs &&
                   in.num_logits() <= limits_.max_num_seqs,
               "a step fits the limits the workspace was sized for");
  INFERD_CHECK(static_cast<int64_t>(in.kv_indices.size()) <= max_pages_, "a step's pages fit the page table");
  INFERD_CHECK(in.sampling.size() == in.logits_indices.size(), "every logits row has its sampling parameters");
  for (int32_t t = 0; t < in.num_tokens(); ++t) {
    const int32_t id = in.token_ids[t];
    if (IsPendingToken(id)) {  // read by the embedding from the device outputs the last step sampled into
      INFERD_CHECK(PendingRow(id) < last_num_logits_, "a pending token names a row of the step launched before");
    } else {
      INFERD_CHECK(id < cfg_.vocab_size, "step token ids are in the vocabulary");
    }
    INFERD_CHECK(in.slot_mapping[t] >= 0 && in.slot_mapping[t] < num_slots_, "slot mapping points into the pool");
  }
  const auto prepare_start = std::chrono::steady_clock::now();
  const int32_t bucket = DecodeBucket(in);
  const StepInput padded = bucket > 0 ? PadDecode(in, bucket) : StepInput();
  const StepInput& run = bucket > 0 ? padded : in;
  const bool unsplit = bucket > 0 && UseUnsplitGraph(in, bucket);  // judged on the step's own rows
  size_t penalties = 0;
  k::AttentionPlan plan;
  {
    TraceRange range("pack and copy inputs, plan attention");
    // The pinned inputs and attention schedule are rewritten only once the last launch's copies have read them
    // (they ran when that step started, so this rarely waits).
    INFERD_CUDA(cudaEventSynchronize(inputs_consumed_));
    INFERD_RETURN_IF_ERROR(Pack(run, &penalties));
    INFERD_RETURN_IF_ERROR(Upload(run, penalties));
    INFERD_RETURN_IF_ERROR(Plan(run, /*decode_graph=*/bucket > 0, unsplit, &plan));
    INFERD_CUDA(cudaEventRecord(inputs_consumed_, compute_));
  }
  Launched step;
  step.slot = static_cast<int>(launches_ % kSlots);
  step.previous_slot = launches_ > 0 ? static_cast<int>((launches_ - 1) % kSlots) : -1;
  Slot& slot = slots_[step.slot];
  // Busy time starts here, once the inputs and the schedule are on the device: the host's planning is not compute.
  INFERD_CUDA(cudaEventRecord(slot.compute_start, compute_));
  const DecodeGraph* graph = bucket > 0 ? &(unsplit ? unsplit_graphs_ : graphs_).at(bucket) : nullptr;
  if (graph && !std::equal(std::begin(plan.words), std::end(plan.words), std::begin(graph->plan.words))) {
    // The graph froze another attention layout: run this step's kernels directly (same plan, same result).
    spdlog::warn("cuda: decode graph for {} rows skipped: the attention plan changed layout", bucket);
    graph = nullptr;
  }
  if (graph) {
    TraceRange range("forward and sample (decode graph)");
    INFERD_CUDA(cudaGraphLaunch(graph->exec, compute_));
  } else {
    TraceRange range("forward and sample");
    INFERD_RETURN_IF_ERROR(Forward(run, plan));
  }
  INFERD_CUDA(cudaEventRecord(slot.compute_end, compute_));
  step.top_n.resize(in.num_logits());
  bool logprobs = false;
  for (int32_t r = 0; r < in.num_logits(); ++r) {
    step.top_n[r] = std::min(in.sampling[r].top_logprobs, k::kMaxTopLogprobs);
    logprobs |= step.top_n[r] > 0;
  }
  // The next step's sampling rewrites the device outputs: this copy is queued before it on the same stream. The
  // step's own tokens only, unless a row reports logprobs.
  if (logprobs) {
    INFERD_CUDA(cudaMemcpyAsync(slot.outputs_host.get(), outputs_dev_.get(), slot.outputs_host.bytes(),
                                cudaMemcpyDeviceToHost, compute_));
  } else {
    INFERD_CUDA(cudaMemcpyAsync(slot.outputs_host.template get<char>() + out_.tokens,
                                outputs_dev_.get<char>() + out_.tokens, in.num_logits() * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, compute_));
  }
  INFERD_CUDA(cudaEventRecord(slot.outputs_ready, compute_));
  counters_.last_prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - prepare_start).count();
  launched_.push_back(std::move(step));
  ++launches_;
  last_num_logits_ = in.num_logits();
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBackend<T>::Collect(StepOutput* out) {
  INFERD_CHECK(!launched_.empty(), "a step was launched before it is collected");
  const Launched step = std::move(launched_.front());
  launched_.pop_front();
  const Slot& slot = slots_[step.slot];
  {
    TraceRange range("wait for sampled tokens");
    INFERD_CUDA(cudaEventSynchronize(slot.outputs_ready));
  }
  float busy_ms = 0, idle_ms = 0;
  INFERD_CUDA(cudaEventElapsedTime(&busy_ms, slot.compute_start, slot.compute_end));
  if (step.previous_slot >= 0) {
    INFERD_CUDA(cudaEventElapsedTime(&idle_ms, slots_[step.previous_slot].compute_end, slot.compute_start));
  }
  ++counters_.steps;
  counters_.device_busy_s += busy_ms * 1e-3;
  counters_.last_device_s = busy_ms * 1e-3;
  counters_.last_idle_before_s = std::max(0.f, idle_ms) * 1e-3;
  const int32_t R = static_cast<int32_t>(step.top_n.size());
  const char* host = slot.outputs_host.template get<char>();
  const int32_t* tokens = reinterpret_cast<const int32_t*>(host + out_.tokens);
  out->tokens.assign(tokens, tokens + R);
  out->logprobs.assign(R, {});
  for (int32_t r = 0; r < R; ++r) {
    const int32_t n = step.top_n[r];
    if (n <= 0) continue;
    TokenLogprob& lp = out->logprobs[r];
    lp.token_id = tokens[r];
    lp.logprob = reinterpret_cast<const float*>(host + out_.logprobs)[r];
    for (int32_t i = 0; i < n; ++i) {
      lp.top.push_back({reinterpret_cast<const int32_t*>(host + out_.top_ids)[r * k::kMaxTopLogprobs + i],
                        reinterpret_cast<const float*>(host + out_.top_logprobs)[r * k::kMaxTopLogprobs + i]});
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string CudaUnsupportedReason(const ModelConfig& config) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return "no CUDA device is visible";
  if (!k::AttentionHeadDimSupported(config.head_dim)) {
    return absl::StrCat("head_dim = ", config.head_dim,
                        " is not supported by the cuda backend; supported: 64, 128, 256");
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const Model& model, const EngineSection& engine) {
  if (std::string why = CudaUnsupportedReason(model.config); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("engine.backend = cuda: ", why));
  }
  INFERD_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop;
  INFERD_CUDA(cudaGetDeviceProperties(&prop, 0));
  size_t free = 0, total = 0;
  INFERD_CUDA(cudaMemGetInfo(&free, &total));
  const bool fp16 = engine.dtype == "float16";
  const cudaDataType_t dtype = fp16 ? CUDA_R_16F : CUDA_R_16BF;
  INFERD_ASSIGN_OR_RETURN(CudaWeights weights, cuda::UploadWeights(model.tensors, dtype));
  spdlog::info("cuda: {} weights on {} ({:.1f} MiB)", fp16 ? "float16" : "bfloat16", prop.name,
               weights.bytes / 1048576.0);
  if (fp16) {
    return std::make_unique<CudaBackend<__half>>(model, std::move(weights), dtype, static_cast<int64_t>(free),
                                                 prop.name, engine.cuda_graphs);
  }
  return std::make_unique<CudaBackend<__nv_bfloat16>>(model, std::move(weights), dtype, static_cast<int64_t>(free),
                                                      prop.name, engine.cuda_graphs);
}

}  // namespace inferd
