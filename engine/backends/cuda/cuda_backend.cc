#include "engine/backends/cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/backends/cuda/architectures.h"
#include "engine/backends/cuda/ceilings.h"
#include "engine/backends/cuda/collectives.h"
#include "engine/backends/cuda/cuda_check.h"
#include "engine/backends/cuda/cuda_weights.h"
#include "engine/backends/cuda/decode_graphs.h"
#include "engine/backends/cuda/device_buffer.h"
#include "engine/backends/cuda/forward.h"
#include "engine/backends/cuda/gemm.h"
#include "engine/backends/cuda/kv_pool.h"
#include "engine/backends/cuda/layer_walk.h"
#include "engine/backends/cuda/nvml.h"
#include "engine/backends/cuda/rank_threads.h"
#include "engine/backends/cuda/step_packing.h"
#include "engine/check.h"
#include "engine/model/head_padding.h"
#include "engine/model/tensor_parallel.h"
#include "engine/runtime/device_layout.h"
#include "engine/runtime/step_input.h"
#include "engine/status_macros.h"
#include "engine/trace.h"
#include "kernels/decode_attention.h"
#include "kernels/dependent_launch.h"
#include "kernels/device_code.h"
#include "kernels/gemv.h"
#include "kernels/moe_grouped_gemm.h"
#include "kernels/moe_routing.h"
#include "kernels/paged_attention.h"
#include "spdlog/spdlog.h"

namespace inferd {
namespace {

using cuda::CudaWeights;
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;
namespace k = kernels;

#define INFERD_KERNEL(expr) INFERD_RETURN_IF_ERROR(::inferd::cuda::FromCuda((expr), #expr))

// One GPU's share of the model and everything it runs a step with; on one GPU, the only one.
struct Rank {
  int index = 0;    // the rank: its shard of the model
  int device = 0;   // its GPU
  ModelConfig cfg;  // the shape this rank runs: its heads, KV heads and MLP columns (cuda::ShardConfig)
  CudaWeights w;
  std::unique_ptr<cuda::Collectives> comm;  // null on one GPU
  std::unique_ptr<cuda::Gemm> gemm;
  std::unique_ptr<cuda::DecodeGraphs> graphs = std::make_unique<cuda::DecodeGraphs>();
  // One stream runs everything a step does in order: its input copies (the graphs read the inputs at fixed
  // addresses, so step N + 1's may land only once step N has read them), its kernels, the copy of its sampled
  // tokens to the host. The host overlaps: it packs step N + 1 while the device runs step N.
  cudaStream_t compute = nullptr;
  cudaEvent_t inputs_consumed = nullptr;  // the last launch's copies from the pinned inputs have run
  DeviceBuffer activations;               // layout.activations
  PinnedBuffer attn_int_ws_host;          // FlashInfer's schedule, staged here before its copy
  PinnedBuffer attn_int_ws_window_host;   // the window layers' (a model with sliding windows)
  DeviceBuffer inputs_dev;                // layout.inputs, the device copy
  cuda::KvPool kv;
  int64_t free_at_start = 0;  // the device's free memory before the weights
  int moe_grouped_sms = 0;    // ForwardBuffers::moe_grouped_sms

  ~Rank() {
    cudaSetDevice(device);
    if (compute) cudaStreamSynchronize(compute);
    graphs.reset();  // before the communicator its graphs call
    comm.reset();
    if (inputs_consumed) cudaEventDestroy(inputs_consumed);
    if (compute) cudaStreamDestroy(compute);
  }
};

// Ties the pieces together: allocates from the DeviceLayout, packs each step's inputs once (step_packing.h), and
// on every rank copies them up, plans its attention, replays a decode graph (decode_graphs.h) or runs the forward
// pass (forward.h); rank 0's sampled tokens come back.
class CudaBackend : public Backend {
 public:
  // padded: the model with its heads padded for the attention kernels (PaddedForAttentionKernels), or null.
  CudaBackend(const Model& model, std::unique_ptr<Model> padded, std::vector<std::unique_ptr<Rank>> ranks,
              std::unique_ptr<cuda::RankThreads> threads, cudaDataType_t dtype, bool fp8_kv, std::string device,
              std::string device_code, bool cuda_graphs, CudaRankOptions options)
      : use_graphs_(cuda_graphs),
        options_(options),
        fp8_kv_(fp8_kv),
        padded_(std::move(padded)),
        model_(padded_ ? *padded_ : model),
        cfg_(model_.config),
        ranks_(std::move(ranks)),
        threads_(std::move(threads)),
        dtype_(dtype),
        device_(std::move(device)),
        device_code_(std::move(device_code)),
        hopper_prefill_(!fp8_kv_ && cfg_.attn_logit_softcap <= 0 && k::HopperPrefillAvailable(ranks_[0]->device)),
        nvml_(cuda::Nvml::Open(0)) {}

  ~CudaBackend() override {
    threads_.reset();
    // Every rank's work ends before any rank's memory goes: a peer kernel may still write a rank's inbox after
    // that rank's own kernel has ended.
    for (const auto& r : ranks_) {
      cudaSetDevice(r->device);
      if (r->compute) cudaStreamSynchronize(r->compute);
    }
    cudaSetDevice(ranks_[0]->device);
    for (Slot& slot : slots_)
      for (cudaEvent_t e : {slot.outputs_ready, slot.compute_start, slot.compute_end})
        if (e) cudaEventDestroy(e);
    if (masks_stream_) {
      cudaStreamSynchronize(masks_stream_);
      cudaStreamDestroy(masks_stream_);
    }
    if (masks_copied_) cudaEventDestroy(masks_copied_);
    ranks_.clear();
    cudaSetDevice(0);
  }

  std::string name() const override { return "cuda"; }
  StepCounters counters() const override {
    StepCounters c = counters_;
    c.copy_busy_s = kv0().copy_busy_s();
    c.copy_waited_s = kv0().copy_waited_s();
    return c;
  }
  std::vector<CopyTiming> TakeCopyTimings() override { return ranks_[0]->kv.TakeTimings(); }
  absl::StatusOr<MemoryPlan> MeasureMemory(const StepLimits& limits) override;
  absl::Status AllocateKvCache(const MemoryPlan& plan) override;
  absl::Status AllocateHostBlocks(int32_t num_blocks) override {
    return OnRanks([&](Rank& r) { return r.kv.AllocateHostBlocks(num_blocks); });
  }
  absl::Status StartCopies(const CopyBatch& batch) override {
    return OnRanks([&](Rank& r) { return r.kv.StartCopies(batch, r.compute); });
  }
  uint64_t CompletedCopies() override;
  absl::Status WaitForCopies(uint64_t ticket) override {
    return OnRanks([&](Rank& r) { return r.kv.WaitForCopies(ticket); });
  }
  absl::Status Step(const StepInput& input, StepOutput* output) override;
  absl::Status Launch(const StepInput& input) override;
  absl::Status Collect(StepOutput* output) override;
  absl::Status SupplyMasks(std::span<const std::span<const uint32_t>> masks) override;
  absl::StatusOr<DeviceCeilings> MeasureCeilings() override;
  DeviceReading ReadDevice() const override { return nvml_ ? nvml_->Read() : DeviceReading{}; }
  std::vector<KernelChoice> KernelChoices() const override { return choices_; }

 private:
  const cuda::KvPool& kv0() const { return ranks_[0]->kv; }
  // job(rank) on every rank at once, each on its own thread with its device current.
  absl::Status OnRanks(const std::function<absl::Status(Rank&)>& job) {
    return threads_->Run([&](int r) { return job(*ranks_[r]); });
  }
  absl::Status Allocate(Rank& r);
  // Copies the packed inputs (what this step uses) to the rank's device and plans its attention there.
  absl::Status Stage(Rank& r, const StepInput& in, const cuda::PackedStep& packed, bool decode_graph, bool unsplit_kv,
                     cuda::AttentionPlans* plans);
  absl::Status Forward(Rank& r, const StepInput& in, const cuda::AttentionPlans& plans);
  absl::Status CaptureDecodeGraphs();
  // With several ranks: their collectives, the peer kernels' buffers sized for this layout's messages.
  absl::Status CreateCollectives();
  // Which messages the peer kernels take (those they send faster than NCCL), measured on the decode sizes.
  absl::Status ChoosePeerLimit();
  // States what runs each operation on this GPU (KernelChoices, which the engine logs at start-up).
  void ChooseKernels();
  cuda::ForwardBuffers Buffers(const Rank& r) const;

  const bool use_graphs_;
  const CudaRankOptions options_;
  const bool fp8_kv_;  // engine.kv_cache_dtype = fp8_e4m3
  const std::unique_ptr<Model> padded_;
  const Model& model_;  // the model as the kernels run it: *padded_, or the engine's
  const ModelConfig& cfg_;
  std::vector<std::unique_ptr<Rank>> ranks_;  // rank r on GPU ranks_[r]->device
  std::unique_ptr<cuda::RankThreads> threads_;
  cudaDataType_t dtype_;
  std::string device_;
  std::string device_code_;  // the GPU's architecture and the code of this build it runs
  // Prefill steps over a cache of T without soft caps may plan for FlashInfer's Hopper kernel (sm_90a on a 9.0
  // GPU); Stage asks for it where a step's queries fill its tiles (kernels::HopperPrefillFits).
  const bool hopper_prefill_;
  std::vector<KernelChoice> choices_;  // KernelChoices, set by AllocateKvCache
  int64_t peer_limit_bytes_ = 0;       // the largest sum the peer kernels take (ChoosePeerLimit)
  std::unique_ptr<cuda::Nvml> nvml_;   // null where NVML cannot be loaded
  DeviceLayout layout_;                // every rank's (their shards are the same size)
  PinnedBuffer inputs_host_;           // layout_.inputs, packed once on the host for every rank
  // A launched step's results (rank 0's) land in its slot; three, so that while step N + 1 is launched and N
  // collected, N - 1's timing events are still there to measure the device's idle time before N.
  struct Slot {
    PinnedBuffer outputs_host;  // the output arena
    cudaEvent_t outputs_ready = nullptr;
    cudaEvent_t compute_start = nullptr, compute_end = nullptr;  // timing events around the step's compute
  };
  static constexpr int kSlots = 3;
  Slot slots_[kSlots];
  struct Launched {
    int slot = 0;
    int previous_slot = -1;            // the slot of the step launched just before it, if any
    std::vector<int32_t> top_n;        // per logits row: logprob alternatives reported, -1 when no logprob is
    std::vector<int32_t> masks_later;  // rows whose masks SupplyMasks brings (its sampling waits for them)
    // A mixture of experts: the experts its rows touched (StepOutput); -2 when the device counted them (the step ran
    // several rows, padding included, and the count comes back with the tokens).
    int64_t experts_touched = -1;
    bool graph = false;  // replayed a captured graph
  };
  // Masks that come after their step's launch (SupplyMasks): staged here, then copied up on rank 0's masks
  // stream, after them the word saying they are there (`one_`, a pinned 1).
  PinnedBuffer masks_host_, one_;
  cudaStream_t masks_stream_ = nullptr;
  cudaEvent_t masks_copied_ = nullptr;  // the last such copy has read masks_host_
  std::deque<Launched> launched_;       // oldest first; at most two
  int64_t launches_ = 0;
  int32_t last_num_logits_ = -1;  // rows the last launched step samples: what a PendingToken may name
  StepCounters counters_;
};

cuda::ForwardBuffers CudaBackend::Buffers(const Rank& r) const {
  cuda::ForwardBuffers b;
  b.layout = &layout_;
  b.activations = r.activations.get<char>();
  b.inputs = r.inputs_dev.get<char>();
  b.kv = r.kv.data();
  b.layer_kv_bytes = r.kv.layer_bytes();
  b.rank0_logits = ranks_[0]->activations.get<char>() + layout_.activations.logits.offset;
  b.moe_grouped_sms = r.moe_grouped_sms;
  return b;
}

absl::Status CudaBackend::Allocate(Rank& r) {
  INFERD_CUDA(cudaStreamCreateWithFlags(&r.compute, cudaStreamNonBlocking));
  INFERD_CUDA(cudaEventCreateWithFlags(&r.inputs_consumed, cudaEventDisableTiming));
  if (r.index == 0) {
    for (Slot& slot : slots_) {
      INFERD_CUDA(cudaEventCreateWithFlags(&slot.outputs_ready, cudaEventDisableTiming));
      INFERD_CUDA(cudaEventCreate(&slot.compute_start));
      INFERD_CUDA(cudaEventCreate(&slot.compute_end));
      INFERD_RETURN_IF_ERROR(slot.outputs_host.Allocate(layout_.output_arena_bytes));
    }
    INFERD_RETURN_IF_ERROR(inputs_host_.Allocate(layout_.input_arena_bytes));
    INFERD_RETURN_IF_ERROR(masks_host_.Allocate(layout_.inputs.allowed.bytes));
    INFERD_RETURN_IF_ERROR(one_.Allocate(sizeof(uint32_t)));
    *one_.get<uint32_t>() = 1;
    INFERD_CUDA(cudaStreamCreateWithFlags(&masks_stream_, cudaStreamNonBlocking));
    INFERD_CUDA(cudaEventCreateWithFlags(&masks_copied_, cudaEventDisableTiming));
  }
  INFERD_RETURN_IF_ERROR(r.activations.Allocate(layout_.activation_arena_bytes));
  if (layout_.activations.moe_counts.bytes > 0) {  // MoeRoute's counts: zero before its first call (it leaves them so)
    INFERD_CUDA(cudaMemset(r.activations.get<char>() + layout_.activations.moe_counts.offset, 0,
                           layout_.activations.moe_counts.bytes));
    int sms = 0;
    INFERD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, r.device));
    if (k::MoeGroupedGemmAvailable(r.device) && k::MoeGroupedGemmWorkspaceBytes(r.cfg.num_experts, sms) <=
                                                    static_cast<size_t>(layout_.activations.moe_gemm_ws.bytes)) {
      r.moe_grouped_sms = sms;
    }
  }
  INFERD_RETURN_IF_ERROR(r.attn_int_ws_host.Allocate(layout_.activations.attn_int_ws.bytes));
  if (layout_.activations.attn_int_ws_window.bytes > 0) {
    INFERD_RETURN_IF_ERROR(r.attn_int_ws_window_host.Allocate(layout_.activations.attn_int_ws_window.bytes));
  }
  // The rotary tables, each [head_dim / 2] of the heads as the kernels run them (the forward pass finds them by the
  // rank's head_dim): global, the sliding-window layers', LongRoPE's long positions.
  const int64_t table = r.cfg.head_dim / 2;
  std::vector<float> inv_freq(3 * table, 0.f);
  for (int t = 0; t < 3; ++t) {
    const std::vector<float> f = RopeInverseFrequencies(r.cfg, /*local=*/t == 1, /*long_positions=*/t == 2);
    INFERD_CHECK(static_cast<int64_t>(f.size()) <= table, "a rotary table fits its region");
    std::copy(f.begin(), f.end(), inv_freq.begin() + t * table);
  }
  INFERD_CHECK(static_cast<int64_t>(inv_freq.size() * sizeof(float)) <= layout_.activations.inv_freq.bytes,
               "the rotary frequencies fit their region");
  INFERD_CUDA(cudaMemcpy(r.activations.get<char>() + layout_.activations.inv_freq.offset, inv_freq.data(),
                         inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  int64_t gemm_bytes = 0;
  INFERD_ASSIGN_OR_RETURN(r.gemm, cuda::Gemm::Create(dtype_, layout_.gemm_workspace_bytes, &gemm_bytes));
  INFERD_RETURN_IF_ERROR(r.inputs_dev.Allocate(layout_.input_arena_bytes));
  return absl::OkStatus();
}

absl::StatusOr<DeviceCeilings> CudaBackend::MeasureCeilings() {
  // Small enough to fit beside the weights on any card that runs the model: 1 GiB of reads (20 times the
  // H100's L2) unless a quarter of the free memory is less, and a GEMM of 8192^3 (384 MiB) or 4096^3. Rank 0's
  // GPU: the others are of the same kind.
  size_t free = 0, total = 0;
  INFERD_CUDA(cudaMemGetInfo(&free, &total));
  const int64_t read_bytes = std::min<int64_t>(int64_t{1} << 30, static_cast<int64_t>(free / 4));
  const int64_t n = free > (size_t{2} << 30) ? 8192 : 4096;
  const bool bf16 = dtype_ == CUDA_R_16BF;
  const Rank& r = *ranks_[0];
  DeviceCeilings c;
  // The GEMM first: its warm-up raises the clocks the read test then runs at.
  INFERD_ASSIGN_OR_RETURN(c.gemm_flops_per_s, cuda::MeasureGemmRate(*r.gemm, bf16, n, r.compute, r.w.fp8));
  INFERD_ASSIGN_OR_RETURN(c.read_bytes_per_s, cuda::MeasureReadBandwidth(read_bytes, r.compute));
  c.read_test = absl::StrCat("a read-only reduction over ", read_bytes >> 20, " MiB");
  c.gemm_test = absl::StrCat("cuBLASLt ", r.w.fp8 ? "fp8 e4m3" : (bf16 ? "bf16" : "fp16"), " GEMM at ", n, "^3");
  return c;
}

absl::StatusOr<MemoryPlan> CudaBackend::MeasureMemory(const StepLimits& limits) {
  const int32_t num_ranks = static_cast<int32_t>(ranks_.size());
  layout_ = PlanDeviceLayout(model_, limits, /*element_bytes=*/2, ranks_[0]->w.fp8,
                             /*kv_element_bytes=*/fp8_kv_ ? 1 : 2, num_ranks);
  INFERD_RETURN_IF_ERROR(CreateCollectives());
  INFERD_RETURN_IF_ERROR(OnRanks([&](Rank& r) { return Allocate(r); }));
  const int32_t R = limits.max_num_seqs, bs = limits.block_size;
  // The largest step: R sequences that sample, every row with every option on so that sampling's peak is seen
  // too, holding the whole token budget where the model's context allows (no sequence is longer than it: a
  // budget larger than R contexts is never filled), on a temporary pool just big enough.
  const int32_t max_context = std::max(1, cfg_.max_position_embeddings);
  std::vector<int32_t> lens(R, 1);
  int64_t extra = int64_t{limits.max_num_batched_tokens} - R;
  for (int32_t s = 0; s < R && extra > 0; ++s) {
    const int32_t add = static_cast<int32_t>(std::min<int64_t>(extra, max_context - 1));
    lens[s] += add;
    extra -= add;
  }
  int32_t num_pages = 0;
  for (int32_t len : lens) num_pages += (len + bs - 1) / bs;
  std::vector<int32_t> history(lens[0]), pages(num_pages);
  for (int32_t i = 0; i < lens[0]; ++i) history[i] = (i * 7919) % cfg_.vocab_size;
  for (int32_t p = 0; p < num_pages; ++p) pages[p] = p;
  INFERD_RETURN_IF_ERROR(OnRanks([&](Rank& r) { return r.kv.Allocate(layout_, num_pages); }));
  StepInput in = EmptyStepInput(bs, layout_.kv_groups.num_groups());
  size_t next_page = 0;
  for (int32_t s = 0; s < R; ++s) {
    const int32_t len = lens[s];
    AddSequence(&in, history, 0, len, std::span(pages).subspan(next_page), /*sampled=*/true);
    next_page += (len + bs - 1) / bs;
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
  // And as many prompt rows (prompt_logprobs): the LM head's and sampling's largest shape.
  for (int32_t r = 0; r < R; ++r) {
    in.logits_indices.push_back(r % in.num_tokens());
    SamplingRow& row = in.sampling.emplace_back();
    row.top_logprobs = k::kMaxTopLogprobs;
    row.target = r % cfg_.vocab_size;
  }
  StepOutput out;
  INFERD_RETURN_IF_ERROR(Step(in, &out));
  // Per GPU: the weights of the largest shard (rank 0's, with the LM head), the least free memory at start, the
  // most that start-up took besides.
  MemoryPlan plan;
  std::vector<int64_t> free_now(num_ranks), total(num_ranks);
  INFERD_RETURN_IF_ERROR(OnRanks([&](Rank& r) {
    r.kv.Free();
    size_t f = 0, t = 0;
    INFERD_CUDA(cudaMemGetInfo(&f, &t));
    free_now[r.index] = static_cast<int64_t>(f);
    total[r.index] = static_cast<int64_t>(t);
    return absl::OkStatus();
  }));
  plan.device = device_;
  plan.device_total_bytes = *std::min_element(total.begin(), total.end());
  plan.activation_bytes = layout_.activation_bytes();
  plan.kv_bytes_per_block = layout_.kv_bytes_per_block;
  plan.kv_dtype = fp8_kv_ ? "fp8_e4m3" : (dtype_ == CUDA_R_16BF ? "bfloat16" : "float16");
  plan.fp8_weights = ranks_[0]->w.fp8;
  plan.device_free_bytes = ranks_[0]->free_at_start;
  int64_t other = 0;
  for (int32_t i = 0; i < num_ranks; ++i) {
    const Rank& r = *ranks_[i];
    plan.weight_bytes = std::max(plan.weight_bytes, r.w.bytes);
    plan.device_free_bytes = std::min(plan.device_free_bytes, r.free_at_start);
    // What else start-up took: the step inputs, the CUDA context and libraries (NCCL's buffers on several GPUs).
    other = std::max(other, r.free_at_start - free_now[i] - r.w.bytes - plan.activation_bytes);
  }
  // And the reserved block that padded decode rows use, allocated with the pool.
  plan.other_bytes = std::max<int64_t>(0, other) + layout_.kv_bytes_per_block;
  return plan;
}

absl::Status CudaBackend::CreateCollectives() {
  const int num_ranks = static_cast<int>(ranks_.size());
  if (num_ranks == 1 && !options_.collectives_on_one_gpu) return absl::OkStatus();
  std::vector<int> devices;
  for (const auto& r : ranks_) devices.push_back(r->device);
  // The peer kernels take decode-sized messages (the layout's: the largest decode graph's rows); ranks sharing a
  // GPU send every message through them, the largest a step's whole token budget. One rank: NCCL alone.
  const int64_t capacity = num_ranks == 1             ? 0
                           : options_.ranks_share_gpu ? layout_.limits.max_num_batched_tokens * cfg_.hidden_size * 2
                                                      : layout_.peer_message_bytes;
  INFERD_ASSIGN_OR_RETURN(auto comms, cuda::Collectives::Create(devices, capacity));
  for (int r = 0; r < num_ranks; ++r) ranks_[r]->comm = std::move(comms[r]);
  return absl::OkStatus();
}

absl::Status CudaBackend::ChoosePeerLimit() {
  const cuda::Collectives* comm0 = ranks_[0]->comm.get();
  if (!comm0 || !comm0->has_nccl() || !comm0->has_peer()) return absl::OkStatus();
  const bool bf16 = dtype_ == CUDA_R_16BF;
  int64_t limit = 0;
  std::vector<std::string> table;
  for (int32_t rows : layout_.decode_buckets) {
    const int64_t count = int64_t{rows} * cfg_.hidden_size;
    std::pair<double, double> us;
    INFERD_RETURN_IF_ERROR(OnRanks([&](Rank& r) -> absl::Status {
      INFERD_ASSIGN_OR_RETURN(auto t, r.comm->TimeAllReduce(r.activations.get<char>() + layout_.activations.tmp.offset,
                                                            count, bf16, 50, r.compute));
      if (r.index == 0) us = t;
      return absl::OkStatus();
    }));
    if (us.second >= 0 && us.second < us.first) limit = std::max(limit, count * 2);
    // What each rank sent over the links in the one-shot way (its whole message to every peer), per second.
    const double sent_gb = static_cast<double>(count) * 2 * (ranks_.size() - 1) / 1e9;
    table.push_back(absl::StrFormat("%d rows NCCL %.1f us, one-shot %.1f us (%.0f GB/s sent)", rows, us.first,
                                    us.second, us.second > 0 ? sent_gb / (us.second * 1e-6) : 0.0));
  }
  for (auto& r : ranks_) r->comm->set_peer_limit_bytes(limit);
  peer_limit_bytes_ = limit;
  spdlog::info(
      "cuda: all-reduce per layer half, measured: {}; the one-shot peer kernels take messages up to {} KiB, each "
      "fused with the residual add and RMSNorm after it",
      absl::StrJoin(table, "; "), limit / 1024);
  return absl::OkStatus();
}

void CudaBackend::ChooseKernels() {
  int cc = 0;
  cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, ranks_[0]->device);
  int minor = 0;
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ranks_[0]->device);
  const cuda::Gemm& gemm = *ranks_[0]->gemm;
  const bool fp8 = ranks_[0]->w.fp8;
  const GpuArchitecture* arch = ArchitectureFor(cc * 10 + minor);  // CreateCudaBackend checked there is one
  const std::string launch = k::DependentLaunchAllowed() ? absl::StrCat("on (compute capability ", cc, ".", minor, ")")
                             : arch && arch->dependent_launch
                                 ? absl::StrCat("off (compute capability ", cc, ".", minor,
                                                " has it, but the code it runs was built for one "
                                                "before 9.0)")
                                 : absl::StrCat("off (compute capability ", cc, ".", minor, " predates it)");
  choices_ = {
      {"gpu code", device_code_},
      {"attention",
       absl::StrCat("FlashInfer's paged prefill kernels (FA2, the sm80 code path, on every GPU) for prefill and "
                    "decode, the KV split by its planner",
                    hopper_prefill_ ? "; prefill steps whose queries fill 128-row tiles through its Hopper kernel "
                                      "(FA3: TMA and wgmma, sm_90a) in the global layers"
                                    : "",
                    cfg_.has_windows() ? "; the window layers through its sliding-window variant, planned apart" : "",
                    fp8_kv_ ? "; over an fp8 e4m3 cache" : "",
                    cfg_.attn_logit_softcap > 0 ? "; scores soft-capped (its soft-cap variant)" : "",
                    !fp8_kv_ && !fp8 &&
                            k::DecodeAttentionSupports(ranks_[0]->cfg.num_heads, ranks_[0]->cfg.num_kv_heads,
                                                       ranks_[0]->cfg.head_dim)
                        ? absl::StrCat("; decode steps of one row", cfg_.has_windows() ? " in the global layers" : "",
                                       " through inferd's one-launch split-KV kernel (a thread-block cluster per "
                                       "row and KV head, kernels/decode_attention.h)")
                        : "")},
      {"products",
       absl::StrCat("the weight-streaming kernel up to ", fp8 ? gemm.fp8_gemv_max_rows() : gemm.gemv_max_rows(),
                    " rows",
                    fp8 ? absl::StrCat(" (fp8 e4m3 weights, per-channel scales; CUDA cores below ",
                                       k::kGemvFp8TensorCoreRows, ", tensor-core tiles from there)")
                        : absl::StrCat(" (CUDA cores below ", k::kGemvTensorCoreRows,
                                       ", tensor-core tiles from there; RoPE and the gated activation fused in)"),
                    ", cuBLASLt beyond")},
      {"dependent launch", launch},
      {"experts",
       !cfg_.has_experts() ? "none (a dense model)"
       : fp8 ? absl::StrCat("fp8 e4m3 experts (per-channel scales), the router in the compute dtype; one row: its k "
                            "experts streamed against it in two launches; more rows: ",
                            ranks_[0]->moe_grouped_sms > 0
                                ? "rows quantized per token into CUTLASS's fp8 grouped GEMM (sm_90a; "
                                  "kernels/moe_grouped_gemm.h), the scales applied by the steps after each product "
                                  "(kernels/moe_fp8.h)"
                                : "streamed per expert as well (the grouped fp8 GEMM needs sm_90a; slow for long "
                                  "prompts)")
             : absl::StrCat("one row: its k experts' products and weighted sum in two launches; a few rows an "
                            "expert: streamed per expert (kernels/moe_products.h); more: ",
                            ranks_[0]->moe_grouped_sms > 0
                                ? "CUTLASS's grouped GEMM from 4 rows an expert (sm_90a, TMA and wgmma; "
                                  "kernels/moe_grouped_gemm.h)"
                                : "inferd's tensor-core tiles (wmma) from 8 rows an expert")},
      {"decode graphs", !use_graphs_ ? "off (engine.cuda_graphs)"
                        : layout_.limits.max_drafts > 0
                            ? "CUDA graphs per decode bucket and per verify bucket (speculative decoding)"
                            : "CUDA graphs per decode bucket"}};
  if (ranks_.size() > 1) {
    const cuda::Collectives* comm = ranks_[0]->comm.get();
    choices_.push_back({"all-reduce", comm && comm->has_peer() && peer_limit_bytes_ > 0
                                          ? absl::StrCat("one-shot peer kernels up to ", peer_limit_bytes_ / 1024,
                                                         " KiB (fused with the residual add and RMSNorm), NCCL beyond")
                                          : "NCCL"});
  }
}

absl::Status CudaBackend::AllocateKvCache(const MemoryPlan& plan) {
  INFERD_RETURN_IF_ERROR(OnRanks(  // and the reserved block
      [&](Rank& r) { return r.kv.Allocate(layout_, plan.num_blocks + 1); }));
  INFERD_RETURN_IF_ERROR(ChoosePeerLimit());
  ChooseKernels();
  if (use_graphs_) INFERD_RETURN_IF_ERROR(CaptureDecodeGraphs());
  spdlog::info("cuda: KV pool of {} blocks ({:.1f} MiB{}) allocated", plan.num_blocks, kv0().bytes() / 1048576.0,
               ranks_.size() > 1 ? " per GPU" : "");
  return absl::OkStatus();
}

uint64_t CudaBackend::CompletedCopies() {
  if (ranks_.size() == 1) return ranks_[0]->kv.CompletedCopies();
  std::vector<uint64_t> done(ranks_.size());
  (void)OnRanks([&](Rank& r) {
    done[r.index] = r.kv.CompletedCopies();
    return absl::OkStatus();
  });
  return *std::min_element(done.begin(), done.end());  // a batch is done once every rank's part is
}

absl::Status CudaBackend::Stage(Rank& r, const StepInput& in, const cuda::PackedStep& packed, bool decode_graph,
                                bool unsplit_kv, cuda::AttentionPlans* plans) {
  const InputRegions& ir = layout_.inputs;
  // Only what this step uses goes up: the fixed-size sections and the used page table in one copy, penalty
  // entries (sized for the worst case, megabytes) only when a row has any.
  INFERD_CUDA(
      cudaMemcpyAsync(r.inputs_dev.get(), inputs_host_.get(), packed.head_bytes, cudaMemcpyHostToDevice, r.compute));
  if (packed.masked_rows > 0) {  // structured output's masks, when a row has one
    INFERD_CUDA(cudaMemcpyAsync(r.inputs_dev.get<char>() + ir.allowed.offset,
                                inputs_host_.get<char>() + ir.allowed.offset, packed.masked_rows * ir.mask_words * 4,
                                cudaMemcpyHostToDevice, r.compute));
  }
  if (packed.penalty_entries > 0) {
    const int64_t n = packed.penalty_entries;
    for (auto [region, bytes] : {std::pair{ir.penalty_tokens, n * 4}, std::pair{ir.penalty_counts, n * 4},
                                 std::pair{ir.penalty_bias, n * 4}, std::pair{ir.penalty_flags, n}}) {
      INFERD_CUDA(cudaMemcpyAsync(r.inputs_dev.get<char>() + region.offset, inputs_host_.get<char>() + region.offset,
                                  bytes, cudaMemcpyHostToDevice, r.compute));
    }
  }
  const ActivationRegions& a = layout_.activations;
  char* act = r.activations.get<char>();
  const bool hopper_prefill =
      hopper_prefill_ && !decode_graph &&
      k::HopperPrefillFits(inputs_host_.get<int32_t>() + ir.qo_indptr.offset / 4, in.num_seqs(), r.cfg.head_dim);
  const auto plan = [&](const Region& int_ws, PinnedBuffer& int_ws_host, int32_t window_left, k::AttentionPlan* out) {
    return cuda::FromCuda(
        k::PlanPagedAttention(act + a.attn_float_ws.offset, act + int_ws.offset, int_ws_host.get(),
                              inputs_host_.get<int32_t>() + ir.qo_indptr.offset / 4,
                              inputs_host_.get<int32_t>() + ir.kv_indptr.offset / 4, in.num_tokens(), in.num_seqs(),
                              r.cfg.num_heads, r.cfg.num_kv_heads, r.cfg.head_dim, in.block_size, decode_graph,
                              unsplit_kv, out, r.compute, window_left, hopper_prefill,
                              inputs_host_.get<int32_t>() + ir.kv_last_page_len.offset / 4),
        "kernels::PlanPagedAttention");
  };
  // The global layers as any model's; the window layers on a plan of their own, its KV chunks sized by the window.
  INFERD_RETURN_IF_ERROR(plan(a.attn_int_ws, r.attn_int_ws_host, /*window_left=*/-1, &plans->global));
  if (a.attn_int_ws_window.bytes > 0) {
    INFERD_RETURN_IF_ERROR(
        plan(a.attn_int_ws_window, r.attn_int_ws_window_host, r.cfg.sliding_window() - 1, &plans->window));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Forward(Rank& r, const StepInput& in, const cuda::AttentionPlans& plans) {
  const cuda::ForwardBuffers b = Buffers(r);
  const cuda::Collectives* comm = r.comm.get();
  return dtype_ == CUDA_R_16BF ? cuda::RunForward<__nv_bfloat16>(r.cfg, r.w, *r.gemm, b, in, plans, comm, r.compute)
                               : cuda::RunForward<__half>(r.cfg, r.w, *r.gemm, b, in, plans, comm, r.compute);
}

absl::Status CudaBackend::CaptureDecodeGraphs() {
  const std::vector<GraphBucket>& buckets = layout_.graph_buckets;
  const bool bf16 = dtype_ == CUDA_R_16BF;
  std::vector<int32_t> rows;  // the products' row counts: every bucket's tokens
  for (GraphBucket b : buckets) rows.push_back(b.tokens);
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  INFERD_RETURN_IF_ERROR(OnRanks([&](Rank& r) {
    INFERD_RETURN_IF_ERROR(cuda::TuneProducts(r.cfg, r.w, *r.gemm, Buffers(r), bf16, rows, r.compute));
    int num_sms = 0;
    INFERD_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, r.device));
    r.graphs->set_num_sms(num_sms);
    return absl::OkStatus();
  }));
  int num_sms = 0;
  INFERD_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, ranks_[0]->device));
  const int64_t kv_heads = ranks_[0]->cfg.num_kv_heads;
  std::vector<int32_t> unsplit;
  std::vector<std::string> verify;
  for (GraphBucket bucket : buckets) {
    const StepInput in = PadToBucket(EmptyStepInput(layout_.limits.block_size, layout_.kv_groups.num_groups()), bucket,
                                     kv0().reserved_block());
    for (bool unsplit_kv : {false, true}) {
      if (unsplit_kv && !(bucket.decode() && k::DecodeKvUnsplit(bucket.seqs, kv_heads, num_sms, 1, bucket.seqs))) {
        continue;
      }
      const cuda::PackedStep packed =
          cuda::PackStepInputs(in, layout_.inputs, cfg_.vocab_size, kv0().reserved_block(), inputs_host_.get<char>());
      INFERD_RETURN_IF_ERROR(OnRanks([&](Rank& r) {
        cuda::AttentionPlans plans;
        INFERD_RETURN_IF_ERROR(Stage(r, in, packed, /*decode_graph=*/true, unsplit_kv, &plans));
        INFERD_RETURN_IF_ERROR(r.graphs->Capture(
            bucket, unsplit_kv, plans, [&] { return Forward(r, in, plans); }, r.compute));
        // The next capture rewrites the pinned inputs and attention schedule that this one's copies read.
        INFERD_CUDA(cudaStreamSynchronize(r.compute));
        return absl::OkStatus();
      }));
      if (unsplit_kv) unsplit.push_back(bucket.seqs);
    }
    if (!bucket.decode()) verify.push_back(absl::StrCat(bucket.seqs, " x ", bucket.tokens / bucket.seqs));
  }
  spdlog::info(
      "cuda: decode graphs captured for batches of {} rows; with unsplit KV attention too for {}; verify graphs "
      "(sequences x tokens each) for {}",
      absl::StrJoin(layout_.decode_buckets, ", "), unsplit.empty() ? "none" : absl::StrJoin(unsplit, ", "),
      verify.empty() ? "none (speculative.method off)" : absl::StrJoin(verify, ", "));
  return absl::OkStatus();
}

absl::Status CudaBackend::Step(const StepInput& in, StepOutput* out) {
  INFERD_CHECK(launched_.empty(), "nothing else is launched and not collected around a step");
  INFERD_RETURN_IF_ERROR(Launch(in));
  return Collect(out);
}

absl::Status CudaBackend::Launch(const StepInput& in) {
  INFERD_CHECK(kv0().allocated(), "the KV cache is allocated before a step");
  INFERD_CHECK(launched_.size() < 2, "at most two steps are launched and not collected");
  INFERD_CHECK(launched_.empty() || launched_.back().masks_later.empty(),
               "a step whose sampling waits for its masks gets them before another is launched");
  const StepLimits& limits = layout_.limits;
  INFERD_CHECK(in.num_tokens() <= limits.max_num_batched_tokens && in.num_seqs() <= limits.max_num_seqs &&
                   in.num_logits() <= limits.max_logits_rows() && in.block_size == limits.block_size,
               "a step fits the limits the workspace was sized for");
  const int64_t num_slots = int64_t{kv0().num_blocks()} * in.block_size;
  for (int32_t t = 0; t < in.num_tokens(); ++t) {
    const int32_t id = in.token_ids[t];
    if (IsPendingToken(id)) {  // read by the embedding from the device outputs the last step sampled into
      INFERD_CHECK(PendingRow(id) < last_num_logits_, "a pending token names a row of the step launched before");
    } else {
      INFERD_CHECK(id < cfg_.vocab_size, "step token ids are in the vocabulary");
    }
    for (const std::vector<int32_t>& slots : in.slot_mapping) {
      INFERD_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot mapping points into the pool");
    }
  }
  INFERD_CHECK(in.num_kv_groups() == layout_.kv_groups.num_groups() && in.kv_indptr.back() <= layout_.inputs.max_pages,
               "a step's pages, a table per KV group, fit the page table");
  const auto prepare_start = std::chrono::steady_clock::now();
  const cuda::DecodeGraphs& graphs0 = *ranks_[0]->graphs;
  const GraphBucket bucket = graphs0.BucketFor(in, layout_.inputs.max_pages);
  const StepInput padded = bucket.empty() ? StepInput() : PadToBucket(in, bucket, kv0().reserved_block());
  const StepInput& run = bucket.empty() ? in : padded;
  const bool unsplit = !bucket.empty() && graphs0.UseUnsplit(in, bucket, ranks_[0]->cfg.num_kv_heads);
  Launched step;
  step.slot = static_cast<int>(launches_ % kSlots);
  step.previous_slot = launches_ > 0 ? static_cast<int>((launches_ - 1) % kSlots) : -1;
  Slot& slot = slots_[step.slot];
  if (cfg_.num_experts > 0) {  // one row takes k distinct experts in each sparse layer (RunForward counts more)
    step.experts_touched = run.num_tokens() > 1 ? -2 : int64_t{cfg_.experts_per_token} * cfg_.num_sparse_layers();
  }
  step.top_n.resize(in.num_logits());
  bool logprobs = false;
  for (int32_t r = 0; r < in.num_logits(); ++r) {
    const SamplingRow& row = in.sampling[r];
    if (row.allowed_later) step.masks_later.push_back(r);
    const bool reports = row.top_logprobs > 0 || row.target >= 0;
    step.top_n[r] = reports ? std::min(row.top_logprobs, k::kMaxTopLogprobs) : -1;
    logprobs |= reports;
  }
  // The masks that come later are copied up as one run of rows (those between them, unmasked, are not read).
  INFERD_CHECK(step.masks_later.empty() || std::none_of(in.sampling.begin(), in.sampling.end(),
                                                        [](const SamplingRow& row) { return !row.allowed.empty(); }),
               "a step's masks all come at launch or all later");
  cuda::PackedStep packed;
  {
    TraceRange range("pack inputs");
    // The pinned inputs are rewritten only once every rank's copies of the last launch have read them (they ran
    // when that step started, so this rarely waits).
    for (const auto& r : ranks_) INFERD_CUDA(cudaEventSynchronize(r->inputs_consumed));
    packed =
        cuda::PackStepInputs(run, layout_.inputs, cfg_.vocab_size, kv0().reserved_block(), inputs_host_.get<char>());
  }
  bool ordered = false;
  INFERD_RETURN_IF_ERROR(OnRanks([&](Rank& r) -> absl::Status {
    const bool rank0 = r.index == 0;
    cuda::AttentionPlans plans;
    {
      TraceRange range("copy inputs, plan attention");
      // A block this step writes that a copy still reads (a swap-out, a write-back) or fills: after the copy.
      bool waits = false;
      for (const std::vector<int32_t>& slots : in.slot_mapping) {
        INFERD_ASSIGN_OR_RETURN(const bool group_waits, r.kv.OrderWrites(slots, in.block_size, r.compute));
        waits |= group_waits;
      }
      if (rank0) ordered = waits;
      INFERD_RETURN_IF_ERROR(Stage(r, run, packed, /*decode_graph=*/!bucket.empty(), unsplit, &plans));
      INFERD_CUDA(cudaEventRecord(r.inputs_consumed, r.compute));
    }
    // Busy time starts here, once the inputs and the schedule are on the device: the host's planning is not
    // compute.
    if (rank0) INFERD_CUDA(cudaEventRecord(slot.compute_start, r.compute));
    cudaGraphExec_t graph = bucket.empty() ? nullptr : r.graphs->Find(bucket, unsplit, plans);
    if (!bucket.empty() && !graph) {
      // The graph froze another attention layout: run this step's kernels directly (same plan, same result).
      spdlog::warn("cuda: graph for {} sequences of {} tokens skipped: the attention plan changed layout", bucket.seqs,
                   bucket.tokens);
    }
    if (rank0) step.graph = graph != nullptr;
    if (graph) {
      TraceRange range("forward and sample (decode graph)");
      INFERD_CUDA(cudaGraphLaunch(graph, r.compute));
    } else {
      TraceRange range("forward and sample");
      INFERD_RETURN_IF_ERROR(Forward(r, run, plans));
    }
    if (!rank0) return absl::OkStatus();
    INFERD_CUDA(cudaEventRecord(slot.compute_end, r.compute));
    // The next step's sampling rewrites the device outputs: this copy is queued before it on the same stream. The
    // step's own tokens only, unless a row reports logprobs.
    const OutputRegions& o = layout_.outputs;
    const char* outputs_dev = r.activations.get<char>() + layout_.activations.outputs.offset;
    if (logprobs) {
      INFERD_CUDA(cudaMemcpyAsync(slot.outputs_host.get(), outputs_dev, layout_.output_arena_bytes,
                                  cudaMemcpyDeviceToHost, r.compute));
    } else {
      INFERD_CUDA(cudaMemcpyAsync(slot.outputs_host.get<char>() + o.tokens.offset, outputs_dev + o.tokens.offset,
                                  in.num_logits() * sizeof(int32_t), cudaMemcpyDeviceToHost, r.compute));
      if (step.experts_touched == -2) {
        INFERD_CUDA(cudaMemcpyAsync(slot.outputs_host.get<char>() + o.experts_touched.offset,
                                    outputs_dev + o.experts_touched.offset, sizeof(int32_t), cudaMemcpyDeviceToHost,
                                    r.compute));
      }
    }
    INFERD_CUDA(cudaEventRecord(slot.outputs_ready, r.compute));
    return absl::OkStatus();
  }));
  counters_.steps_ordered_after_copies += ordered;
  counters_.last_prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - prepare_start).count();
  launched_.push_back(std::move(step));
  ++launches_;
  last_num_logits_ = in.num_logits();
  return absl::OkStatus();
}

absl::Status CudaBackend::SupplyMasks(std::span<const std::span<const uint32_t>> masks) {
  INFERD_CHECK(!launched_.empty() && !launched_.back().masks_later.empty(),
               "the last launched step's sampling waits for masks");
  Launched& step = launched_.back();
  INFERD_CHECK(masks.size() == step.masks_later.size(), "a mask for each row that waits for one");
  Rank& r = *ranks_[0];
  INFERD_CUDA(cudaSetDevice(r.device));
  const int64_t words = layout_.inputs.mask_words;
  INFERD_CUDA(cudaEventSynchronize(masks_copied_));  // the last copy has read the staging buffer
  uint32_t* host = masks_host_.get<uint32_t>();
  for (size_t i = 0; i < masks.size(); ++i) {
    INFERD_CHECK(static_cast<int64_t>(masks[i].size()) == words, "a row's mask covers the vocabulary");
    std::memcpy(host + step.masks_later[i] * words, masks[i].data(), words * sizeof(uint32_t));
  }
  // After this step's inputs went up (they set the ready word to 0), on a stream of its own: the step's sampling,
  // on the compute stream, waits for the word.
  char* dev = r.inputs_dev.get<char>();
  INFERD_CUDA(cudaStreamWaitEvent(masks_stream_, r.inputs_consumed, 0));
  INFERD_CUDA(cudaMemcpyAsync(dev + layout_.inputs.allowed.offset, host,
                              (step.masks_later.back() + 1) * words * sizeof(uint32_t), cudaMemcpyHostToDevice,
                              masks_stream_));
  INFERD_CUDA(cudaMemcpyAsync(dev + layout_.inputs.masks_ready.offset, one_.get(), sizeof(uint32_t),
                              cudaMemcpyHostToDevice, masks_stream_));
  INFERD_CUDA(cudaEventRecord(masks_copied_, masks_stream_));
  step.masks_later.clear();
  return absl::OkStatus();
}

absl::Status CudaBackend::Collect(StepOutput* out) {
  INFERD_CHECK(!launched_.empty(), "a step was launched before it is collected");
  if (!launched_.front().masks_later.empty()) {
    // Its sampling would wait forever: every token allowed, and the step fails.
    std::vector<uint32_t> all(layout_.inputs.mask_words, ~0u);
    std::vector<std::span<const uint32_t>> masks(launched_.front().masks_later.size(), all);
    INFERD_RETURN_IF_ERROR(SupplyMasks(masks));
    StepOutput ignored;
    (void)Collect(&ignored);
    return absl::InternalError("a step was collected before its masks were supplied");
  }
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
  counters_.last_graph = step.graph;
  counters_.last_compute_start_ms = kv0().DeviceClockMs(slot.compute_start);
  counters_.last_compute_end_ms = kv0().DeviceClockMs(slot.compute_end);
  const int32_t R = static_cast<int32_t>(step.top_n.size());
  const OutputRegions& o = layout_.outputs;
  const char* host = slot.outputs_host.get<char>();
  const int32_t* tokens = reinterpret_cast<const int32_t*>(host + o.tokens.offset);
  const float* logprobs = reinterpret_cast<const float*>(host + o.logprobs.offset);
  const int32_t* top_ids = reinterpret_cast<const int32_t*>(host + o.top_ids.offset);
  const float* top_logprobs = reinterpret_cast<const float*>(host + o.top_logprobs.offset);
  out->tokens.assign(tokens, tokens + R);
  out->experts_touched = step.experts_touched == -2 ? *reinterpret_cast<const int32_t*>(host + o.experts_touched.offset)
                                                    : step.experts_touched;
  out->logprobs.assign(R, {});
  for (int32_t r = 0; r < R; ++r) {
    const int32_t n = step.top_n[r];
    if (n < 0) continue;
    TokenLogprob& lp = out->logprobs[r];
    lp.token_id = tokens[r];
    lp.logprob = logprobs[r];
    for (int32_t i = 0; i < n; ++i) {
      lp.top.push_back({top_ids[r * k::kMaxTopLogprobs + i], top_logprobs[r * k::kMaxTopLogprobs + i]});
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string CudaUnsupportedReason(const ModelConfig& config) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return "no CUDA device is visible";
  const int32_t run_head_dim = k::AttentionRunHeadDim(config.head_dim);
  if (run_head_dim == 0) {
    return absl::StrCat("head_dim = ", config.head_dim,
                        " is not supported by the cuda backend; supported: even head dims up to 256");
  }
  if (run_head_dim != config.head_dim && config.arch->qk_norm()) {
    return absl::StrCat(config.architecture, "'s per-head q/k norms over heads of ", config.head_dim,
                        " (run padded to ", run_head_dim,
                        ") are not run by the cuda backend; engine.backend: cpu runs them");
  }
  if (config.has_experts() && (config.num_experts > k::kMoeMaxExperts || config.experts_per_token > k::kMoeMaxTopK ||
                               config.hidden_size % 8 != 0 || config.moe_intermediate_size % 8 != 0)) {
    return absl::StrCat(config.architecture, "'s mixture of experts (", config.num_experts, " experts, ",
                        config.experts_per_token, " a token, hidden ", config.hidden_size, ", expert width ",
                        config.moe_intermediate_size, ") is not run by the cuda backend; it runs up to ",
                        k::kMoeMaxExperts, " experts, ", k::kMoeMaxTopK,
                        " a token, widths that are multiples of 8; engine.backend: cpu runs it");
  }
  if (config.sliding_window() < 0) {
    return absl::StrCat(config.architecture,
                        "'s layers have sliding windows of different sizes, which the cuda backend does not plan one "
                        "attention schedule for; engine.backend: cpu runs them");
  }
  if (std::string why = LayerWalkProblem(*config.arch); !why.empty()) {
    return absl::StrCat(config.architecture, "'s layer: ", why, "; engine.backend: cpu runs it");
  }
  return "";
}

int64_t CudaVisibleFreeBytes() {
  size_t free = 0, total = 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return static_cast<int64_t>(free);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const Model& given, const EngineSection& engine,
                                                           CudaRankOptions options) {
  if (std::string why = CudaUnsupportedReason(given.config); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("engine.backend = cuda: ", why));
  }
  INFERD_ASSIGN_OR_RETURN(std::unique_ptr<Model> padded, PaddedForAttentionKernels(given));
  const Model& model = padded ? *padded : given;
  if (padded) {
    spdlog::info(
        "cuda: heads of {} run padded with zeros to {} (FlashInfer's attention runs head dims 64, 128 and "
        "256): the q/k/v and output products and the KV cache hold {:.0f}% more",
        given.config.head_dim, model.config.head_dim,
        100.0 * (model.config.head_dim - given.config.head_dim) / given.config.head_dim);
  }
  const int num_ranks = engine.tensor_parallel_size;
  INFERD_RETURN_IF_ERROR(CheckTensorParallel(model.config, num_ranks));
  int visible = 0;
  INFERD_CUDA(cudaGetDeviceCount(&visible));
  if (visible < num_ranks && !options.ranks_share_gpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config: engine.tensor_parallel_size = ", num_ranks, " needs ", num_ranks, " GPUs (one per rank); ", visible,
        " visible (CUDA_VISIBLE_DEVICES chooses them); allowed here: at most ", visible));
  }
  INFERD_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop;
  INFERD_CUDA(cudaGetDeviceProperties(&prop, 0));
  const bool fp16 = engine.dtype == "float16";
  const cudaDataType_t dtype = fp16 ? CUDA_R_16F : CUDA_R_16BF;
  // An FP8 checkpoint runs as stored: its weights and scales go up as they are.
  const bool fp8 = engine.quantization == "fp8" || model.tensors.fp8_checkpoint;
  if (model.tensors.fp8_checkpoint && engine.quantization != "fp8") {
    spdlog::info("cuda: the checkpoint is FP8 ({}): engine.quantization = fp8", model.config.quantization.description);
  }
  // The GPU's row of the architecture table and the code of this build it runs: a GPU the build has no code for is
  // refused here, naming what to build, instead of failing at its first launch.
  const GpuArchitecture* arch = ArchitectureFor(prop.major * 10 + prop.minor);
  if (arch == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(prop.name, " is compute capability ", prop.major, ".", prop.minor,
                                                      ", which inferd does not run on; it runs on ",
                                                      GpuArchitectureList()));
  }
  int ptx_version = 0, binary_version = 0;
  if (const cudaError_t e = k::DeviceCode(&ptx_version, &binary_version); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("this build carries no GPU code that ", prop.name, " (compute capability ", prop.major, ".",
                     prop.minor, ") runs: it was built with CUDA_ARCHITECTURES ", k::BuiltCudaArchitectures(), " (",
                     cudaGetErrorString(e), "); build with -DCMAKE_CUDA_ARCHITECTURES=", arch->code, " or inferd-all"));
  }
  std::string device_code = absl::StrCat(arch->name, "; ", prop.name, " runs ",
                                         DescribeDeviceCode(k::BuiltCudaArchitectures(), ptx_version, binary_version));
  if (fp8 && !arch->fp8) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine.quantization = 'fp8' needs fp8 tensor cores (compute capability 8.9 or later); ",
                     prop.name, " is ", prop.major, ".", prop.minor, "; allowed on it: none"));
  }
  const ModelConfig& c = model.config;
  if (fp8 && (c.hidden_size % 16 != 0 || c.intermediate_size % 16 != 0 || c.q_width() % 16 != 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "engine.quantization = 'fp8' needs the products' inner dimensions to be multiples of 16 (fp8 tensor "
        "cores); this model has hidden_size ",
        c.hidden_size, ", intermediate_size ", c.intermediate_size, ", heads x head_dim ", c.q_width()));
  }
  if (fp8 && c.has_experts()) {
    // Each rank's experts' down product has its run of the expert intermediate columns as inner dimension.
    for (int r = 0; r < num_ranks; ++r) {
      const int64_t cols = ShardOf(c, num_ranks, r).expert_intermediate.size();
      if (cols % 16 != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "engine.quantization = 'fp8' needs each GPU's share of an expert's intermediate columns to be a multiple "
            "of 16 (fp8 tensor cores); moe_intermediate_size ",
            c.moe_intermediate_size, " over ", num_ranks, " GPUs gives ", cols, " on GPU ", r));
      }
    }
  }
  const bool fp8_kv = engine.kv_cache_dtype == "fp8_e4m3";
  if (const std::string& kv = engine.kv_cache_dtype; kv != "auto" && !fp8_kv && kv != (fp16 ? "float16" : "bfloat16")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "engine.kv_cache_dtype = '", kv, "': the cuda backend's cache holds ", fp16 ? "float16" : "bfloat16",
        " (engine.dtype) or fp8_e4m3; allowed: auto, ", fp16 ? "float16" : "bfloat16", ", fp8_e4m3"));
  }
  if (fp8_kv && fp16) {
    return absl::FailedPreconditionError(
        "engine.kv_cache_dtype = 'fp8_e4m3' needs engine.dtype bfloat16 (or auto); engine.dtype is float16");
  }
  if (fp8_kv && !k::AttentionFp8KvHeadDimSupported(c.head_dim)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "engine.kv_cache_dtype = 'fp8_e4m3' needs head_dim 128 or 256 (FlashInfer's fp8 KV attention); this model's "
        "head_dim is ",
        c.head_dim, "; allowed for it: auto"));
  }
  if (fp8_kv && c.has_windows()) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine.kv_cache_dtype = 'fp8_e4m3' is not run with sliding-window attention on cuda (",
                     c.architecture, "'s layers); allowed for it: auto"));
  }
  if (fp8_kv && c.attn_logit_softcap > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine.kv_cache_dtype = 'fp8_e4m3' is not run with soft-capped attention on cuda (",
                     c.architecture, "'s attn_logit_softcapping ", c.attn_logit_softcap, "); allowed for it: auto"));
  }
  // Rank r on GPU r, each on its own thread (rank 0 on this one); their collectives come once the layout is known.
  std::vector<std::unique_ptr<Rank>> ranks;
  std::vector<int> devices;
  for (int r = 0; r < num_ranks; ++r) {
    ranks.push_back(std::make_unique<Rank>());
    ranks[r]->index = r;
    ranks[r]->device = options.ranks_share_gpu ? 0 : r;
    ranks[r]->cfg = cuda::ShardConfig(c, ShardOf(c, num_ranks, r));
    devices.push_back(ranks[r]->device);
  }
  auto threads = std::make_unique<cuda::RankThreads>(num_ranks, [devices](int r) { cudaSetDevice(devices[r]); });
  // Each rank uploads its own shard, all at once.
  const auto start = std::chrono::steady_clock::now();
  INFERD_RETURN_IF_ERROR(threads->Run([&](int r) -> absl::Status {
    size_t rank_free = 0, rank_total = 0;
    INFERD_CUDA(cudaMemGetInfo(&rank_free, &rank_total));
    ranks[r]->free_at_start = static_cast<int64_t>(rank_free);
    INFERD_ASSIGN_OR_RETURN(ranks[r]->w, cuda::UploadWeights(model.tensors, dtype, fp8, ShardOf(c, num_ranks, r), c));
    return absl::OkStatus();
  }));
  // The padded copy's tensors hold the checkpoint's mapped files too: they go once the weights are up.
  if (padded) ReleaseTensorBytes(&padded->tensors).clear();
  spdlog::info("cuda: {} (compute capability {}.{}): programmatic dependent launch {}", prop.name, prop.major,
               prop.minor,
               k::DependentLaunchAllowed() ? "on" : "off (the GPU or the code this build runs on it predates 9.0)");
  spdlog::info("cuda: {} weights{} on {}{} ({:.1f} MiB{}) in {:.2f} s", fp16 ? "float16" : "bfloat16",
               fp8 ? " with fp8 e4m3 linear layers (per-channel scales)" : "", prop.name,
               num_ranks > 1 ? absl::StrCat(" x", num_ranks, ", tensor parallel") : "", ranks[0]->w.bytes / 1048576.0,
               num_ranks > 1 ? " on GPU 0, the largest shard" : "",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (fp8_kv) {
    spdlog::info("cuda: KV cache in fp8 e4m3 ({})", model.tensors.kv_cache_scales
                                                        ? "each layer's k_scale and v_scale from the checkpoint"
                                                        : "scale 1: the checkpoint has no kv_cache_scheme");
  } else if (model.tensors.kv_cache_scales) {
    spdlog::info("cuda: the checkpoint's KV cache scales are unused: engine.kv_cache_dtype is auto");
  }
  const std::string device =
      num_ranks > 1 ? absl::StrCat(prop.name, " x", num_ranks, " (tensor parallel; memory per GPU)") : prop.name;
  // Ranks sharing a GPU wait for each other on the host before each sum: no graphs (collectives.h).
  const bool graphs = engine.cuda_graphs && !(options.ranks_share_gpu && num_ranks > 1);
  spdlog::info("cuda: {}", device_code);
  return std::make_unique<CudaBackend>(given, std::move(padded), std::move(ranks), std::move(threads), dtype, fp8_kv,
                                       device, std::move(device_code), graphs, options);
}

}  // namespace inferd
