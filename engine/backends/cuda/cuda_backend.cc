#include "engine/backends/cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/backends/cuda/ceilings.h"
#include "engine/backends/cuda/cuda_check.h"
#include "engine/backends/cuda/cuda_weights.h"
#include "engine/backends/cuda/decode_graphs.h"
#include "engine/backends/cuda/device_buffer.h"
#include "engine/backends/cuda/forward.h"
#include "engine/backends/cuda/gemm.h"
#include "engine/backends/cuda/kv_pool.h"
#include "engine/backends/cuda/nvml.h"
#include "engine/backends/cuda/step_packing.h"
#include "engine/check.h"
#include "engine/runtime/device_layout.h"
#include "engine/runtime/step_input.h"
#include "engine/status_macros.h"
#include "engine/trace.h"
#include "kernels/paged_attention.h"
#include "spdlog/spdlog.h"

namespace inferd {
namespace {

using cuda::CudaWeights;
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;
namespace k = kernels;

#define INFERD_KERNEL(expr) INFERD_RETURN_IF_ERROR(::inferd::cuda::FromCuda((expr), #expr))

// Ties the pieces together: allocates from the DeviceLayout, packs and copies each step's inputs
// (step_packing.h), plans its attention, replays a decode graph (decode_graphs.h) or runs the forward pass
// (forward.h), and brings the sampled tokens back.
class CudaBackend : public Backend {
 public:
  CudaBackend(const Model& model, CudaWeights weights, cudaDataType_t dtype, bool fp8_kv, int64_t free_at_start,
              std::string device, bool cuda_graphs)
      : use_graphs_(cuda_graphs),
        fp8_kv_(fp8_kv),
        model_(model),
        cfg_(model.config),
        w_(std::move(weights)),
        dtype_(dtype),
        free_at_start_(free_at_start),
        device_(std::move(device)),
        nvml_(cuda::Nvml::Open(0)) {}

  ~CudaBackend() override {
    if (compute_) cudaStreamSynchronize(compute_);
    graphs_.reset();
    for (Slot& slot : slots_)
      for (cudaEvent_t e : {slot.outputs_ready, slot.compute_start, slot.compute_end})
        if (e) cudaEventDestroy(e);
    if (inputs_consumed_) cudaEventDestroy(inputs_consumed_);
    if (compute_) cudaStreamDestroy(compute_);
  }

  std::string name() const override { return "cuda"; }
  StepCounters counters() const override {
    StepCounters c = counters_;
    c.copy_busy_s = kv_.copy_busy_s();
    c.copy_waited_s = kv_.copy_waited_s();
    return c;
  }
  std::vector<CopyTiming> TakeCopyTimings() override { return kv_.TakeTimings(); }
  absl::StatusOr<MemoryPlan> MeasureMemory(const StepLimits& limits) override;
  absl::Status AllocateKvCache(const MemoryPlan& plan) override;
  absl::Status AllocateHostBlocks(int32_t num_blocks) override { return kv_.AllocateHostBlocks(num_blocks); }
  absl::Status StartCopies(const CopyBatch& batch) override { return kv_.StartCopies(batch, compute_); }
  uint64_t CompletedCopies() override { return kv_.CompletedCopies(); }
  absl::Status WaitForCopies(uint64_t ticket) override { return kv_.WaitForCopies(ticket); }
  absl::Status Step(const StepInput& input, StepOutput* output) override;
  absl::Status Launch(const StepInput& input) override;
  absl::Status Collect(StepOutput* output) override;
  absl::StatusOr<DeviceCeilings> MeasureCeilings() override;
  DeviceReading ReadDevice() const override { return nvml_ ? nvml_->Read() : DeviceReading{}; }

 private:
  absl::Status Allocate();
  // Packs the step into the pinned inputs, copies what it uses to the device and plans its attention.
  absl::Status Stage(const StepInput& in, bool decode_graph, bool unsplit_kv, k::AttentionPlan* plan);
  absl::Status Forward(const StepInput& in, const k::AttentionPlan& plan);
  absl::Status CaptureDecodeGraphs();
  cuda::ForwardBuffers Buffers() const;

  const bool use_graphs_;
  const bool fp8_kv_;  // engine.kv_cache_dtype = fp8_e4m3
  const Model& model_;
  const ModelConfig& cfg_;
  CudaWeights w_;
  cudaDataType_t dtype_;
  int64_t free_at_start_;
  std::string device_;
  std::unique_ptr<cuda::Nvml> nvml_;  // null where NVML cannot be loaded
  DeviceLayout layout_;
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<cuda::DecodeGraphs> graphs_ = std::make_unique<cuda::DecodeGraphs>();
  // One stream runs everything a step does in order: its input copies (the graphs read the inputs at fixed
  // addresses, so step N + 1's may land only once step N has read them), its kernels, the copy of its sampled
  // tokens to the host. The host overlaps: it packs step N + 1 while the device runs step N. (Swaps run on it too.)
  cudaStream_t compute_ = nullptr;
  cudaEvent_t inputs_consumed_ = nullptr;  // the last launch's copies from the pinned inputs have run
  // A launched step's results land in its slot; three, so that while step N + 1 is launched and N collected,
  // N - 1's timing events are still there to measure the device's idle time before N.
  struct Slot {
    PinnedBuffer outputs_host;  // the output arena
    cudaEvent_t outputs_ready = nullptr;
    cudaEvent_t compute_start = nullptr, compute_end = nullptr;  // timing events around the step's compute
  };
  static constexpr int kSlots = 3;
  Slot slots_[kSlots];
  struct Launched {
    int slot = 0;
    int previous_slot = -1;      // the slot of the step launched just before it, if any
    std::vector<int32_t> top_n;  // per logits row: logprob alternatives reported, -1 when no logprob is
  };
  std::deque<Launched> launched_;  // oldest first; at most two
  int64_t launches_ = 0;
  int32_t last_num_logits_ = -1;  // rows the last launched step samples: what a PendingToken may name
  StepCounters counters_;

  DeviceBuffer activations_;       // layout_.activations
  PinnedBuffer attn_int_ws_host_;  // FlashInfer's schedule, staged here before its copy
  DeviceBuffer inputs_dev_;        // layout_.inputs, the device copy
  PinnedBuffer inputs_host_;       // layout_.inputs, packed on the host
  cuda::KvPool kv_;
};

cuda::ForwardBuffers CudaBackend::Buffers() const {
  cuda::ForwardBuffers b;
  b.layout = &layout_;
  b.activations = activations_.get<char>();
  b.inputs = inputs_dev_.get<char>();
  b.kv = kv_.data();
  b.layer_kv_bytes = kv_.layer_bytes();
  return b;
}

absl::Status CudaBackend::Allocate() {
  INFERD_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  INFERD_CUDA(cudaEventCreateWithFlags(&inputs_consumed_, cudaEventDisableTiming));
  for (Slot& slot : slots_) {
    INFERD_CUDA(cudaEventCreateWithFlags(&slot.outputs_ready, cudaEventDisableTiming));
    INFERD_CUDA(cudaEventCreate(&slot.compute_start));
    INFERD_CUDA(cudaEventCreate(&slot.compute_end));
    INFERD_RETURN_IF_ERROR(slot.outputs_host.Allocate(layout_.output_arena_bytes));
  }
  INFERD_RETURN_IF_ERROR(activations_.Allocate(layout_.activation_arena_bytes));
  INFERD_RETURN_IF_ERROR(attn_int_ws_host_.Allocate(layout_.activations.attn_int_ws.bytes));
  const std::vector<float> inv_freq = RopeInverseFrequencies(cfg_);
  INFERD_CHECK(static_cast<int64_t>(inv_freq.size() * sizeof(float)) <= layout_.activations.inv_freq.bytes,
               "the rotary frequencies fit their region");
  INFERD_CUDA(cudaMemcpy(activations_.get<char>() + layout_.activations.inv_freq.offset, inv_freq.data(),
                         inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  int64_t gemm_bytes = 0;
  INFERD_ASSIGN_OR_RETURN(gemm_, cuda::Gemm::Create(dtype_, layout_.gemm_workspace_bytes, &gemm_bytes));
  INFERD_RETURN_IF_ERROR(inputs_dev_.Allocate(layout_.input_arena_bytes));
  INFERD_RETURN_IF_ERROR(inputs_host_.Allocate(layout_.input_arena_bytes));
  return absl::OkStatus();
}

absl::StatusOr<DeviceCeilings> CudaBackend::MeasureCeilings() {
  // Small enough to fit beside the weights on any card that runs the model: 1 GiB of reads (20 times the
  // H100's L2) unless a quarter of the free memory is less, and a GEMM of 8192^3 (384 MiB) or 4096^3.
  size_t free = 0, total = 0;
  INFERD_CUDA(cudaMemGetInfo(&free, &total));
  const int64_t read_bytes = std::min<int64_t>(int64_t{1} << 30, static_cast<int64_t>(free / 4));
  const int64_t n = free > (size_t{2} << 30) ? 8192 : 4096;
  const bool bf16 = dtype_ == CUDA_R_16BF;
  DeviceCeilings c;
  // The GEMM first: its warm-up raises the clocks the read test then runs at.
  INFERD_ASSIGN_OR_RETURN(c.gemm_flops_per_s, cuda::MeasureGemmRate(*gemm_, bf16, n, compute_, w_.fp8));
  INFERD_ASSIGN_OR_RETURN(c.read_bytes_per_s, cuda::MeasureReadBandwidth(read_bytes, compute_));
  c.read_test = absl::StrCat("a read-only reduction over ", read_bytes >> 20, " MiB");
  c.gemm_test = absl::StrCat("cuBLASLt ", w_.fp8 ? "fp8 e4m3" : (bf16 ? "bf16" : "fp16"), " GEMM at ", n, "^3");
  return c;
}

absl::StatusOr<MemoryPlan> CudaBackend::MeasureMemory(const StepLimits& limits) {
  layout_ = PlanDeviceLayout(model_, limits, /*element_bytes=*/2, w_.fp8, /*kv_element_bytes=*/fp8_kv_ ? 1 : 2);
  INFERD_RETURN_IF_ERROR(Allocate());
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
  INFERD_RETURN_IF_ERROR(kv_.Allocate(layout_, cfg_.num_layers, num_pages));
  StepInput in = EmptyStepInput(bs);
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
  kv_.Free();
  size_t free = 0, total = 0;
  INFERD_CUDA(cudaMemGetInfo(&free, &total));
  MemoryPlan plan;
  plan.device = device_;
  plan.device_total_bytes = static_cast<int64_t>(total);
  plan.device_free_bytes = free_at_start_;
  plan.weight_bytes = w_.bytes;
  plan.activation_bytes = layout_.activation_bytes();
  plan.kv_bytes_per_block = layout_.kv_bytes_per_block;
  plan.kv_dtype = fp8_kv_ ? "fp8_e4m3" : (dtype_ == CUDA_R_16BF ? "bfloat16" : "float16");
  // What else start-up took: the step inputs, the CUDA context and libraries; and the reserved block that padded
  // decode rows use, allocated with the pool.
  plan.other_bytes =
      std::max<int64_t>(0, free_at_start_ - static_cast<int64_t>(free) - plan.weight_bytes - plan.activation_bytes) +
      layout_.kv_bytes_per_block;
  return plan;
}

absl::Status CudaBackend::AllocateKvCache(const MemoryPlan& plan) {
  INFERD_RETURN_IF_ERROR(kv_.Allocate(layout_, cfg_.num_layers, plan.num_blocks + 1));  // and the reserved one
  if (use_graphs_) INFERD_RETURN_IF_ERROR(CaptureDecodeGraphs());
  spdlog::info("cuda: KV pool of {} blocks ({:.1f} MiB) allocated", plan.num_blocks, kv_.bytes() / 1048576.0);
  return absl::OkStatus();
}

absl::Status CudaBackend::Stage(const StepInput& in, bool decode_graph, bool unsplit_kv, k::AttentionPlan* plan) {
  const InputRegions& ir = layout_.inputs;
  const cuda::PackedStep packed = cuda::PackStepInputs(in, ir, cfg_.vocab_size, inputs_host_.get<char>());
  // Only what this step uses goes up: the fixed-size sections and the used page table in one copy, penalty
  // entries (sized for the worst case, megabytes) only when a row has any.
  INFERD_CUDA(
      cudaMemcpyAsync(inputs_dev_.get(), inputs_host_.get(), packed.head_bytes, cudaMemcpyHostToDevice, compute_));
  if (packed.penalty_entries > 0) {
    const int64_t n = packed.penalty_entries;
    for (auto [region, bytes] : {std::pair{ir.penalty_tokens, n * 4}, std::pair{ir.penalty_counts, n * 4},
                                 std::pair{ir.penalty_bias, n * 4}, std::pair{ir.penalty_flags, n}}) {
      INFERD_CUDA(cudaMemcpyAsync(inputs_dev_.get<char>() + region.offset, inputs_host_.get<char>() + region.offset,
                                  bytes, cudaMemcpyHostToDevice, compute_));
    }
  }
  const ActivationRegions& a = layout_.activations;
  char* act = activations_.get<char>();
  INFERD_KERNEL(k::PlanPagedAttention(act + a.attn_float_ws.offset, act + a.attn_int_ws.offset, attn_int_ws_host_.get(),
                                      inputs_host_.get<int32_t>() + ir.qo_indptr.offset / 4,
                                      inputs_host_.get<int32_t>() + ir.kv_indptr.offset / 4, in.num_tokens(),
                                      in.num_seqs(), cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim, in.block_size,
                                      decode_graph, unsplit_kv, plan, compute_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Forward(const StepInput& in, const k::AttentionPlan& plan) {
  const cuda::ForwardBuffers b = Buffers();
  return dtype_ == CUDA_R_16BF ? cuda::RunForward<__nv_bfloat16>(cfg_, w_, *gemm_, b, in, plan, compute_)
                               : cuda::RunForward<__half>(cfg_, w_, *gemm_, b, in, plan, compute_);
}

absl::Status CudaBackend::CaptureDecodeGraphs() {
  const std::vector<int32_t>& buckets = layout_.decode_buckets;
  INFERD_RETURN_IF_ERROR(cuda::TuneProducts(cfg_, w_, *gemm_, Buffers(), dtype_ == CUDA_R_16BF, buckets, compute_));
  int device = 0, num_sms = 0;
  INFERD_CUDA(cudaGetDevice(&device));
  INFERD_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  graphs_->set_num_sms(num_sms);
  std::vector<int32_t> unsplit;
  for (int32_t rows : buckets) {
    const StepInput in = cuda::DecodeGraphs::Pad(EmptyStepInput(layout_.limits.block_size), rows, kv_.reserved_block());
    for (bool unsplit_kv : {false, true}) {
      if (unsplit_kv && !k::DecodeKvUnsplit(rows, cfg_.num_kv_heads, num_sms, 1, rows)) continue;
      k::AttentionPlan plan;
      INFERD_RETURN_IF_ERROR(Stage(in, /*decode_graph=*/true, unsplit_kv, &plan));
      INFERD_RETURN_IF_ERROR(graphs_->Capture(
          rows, unsplit_kv, plan, [&] { return Forward(in, plan); }, compute_));
      // The next capture rewrites the pinned inputs and attention schedule that this one's copies read.
      INFERD_CUDA(cudaStreamSynchronize(compute_));
      if (unsplit_kv) unsplit.push_back(rows);
    }
  }
  spdlog::info("cuda: decode graphs captured for batches of {} rows; with unsplit KV attention too for {}",
               absl::StrJoin(buckets, ", "), unsplit.empty() ? "none" : absl::StrJoin(unsplit, ", "));
  return absl::OkStatus();
}

absl::Status CudaBackend::Step(const StepInput& in, StepOutput* out) {
  INFERD_CHECK(launched_.empty(), "nothing else is launched and not collected around a step");
  INFERD_RETURN_IF_ERROR(Launch(in));
  return Collect(out);
}

absl::Status CudaBackend::Launch(const StepInput& in) {
  INFERD_CHECK(kv_.allocated(), "the KV cache is allocated before a step");
  INFERD_CHECK(launched_.size() < 2, "at most two steps are launched and not collected");
  const StepLimits& limits = layout_.limits;
  INFERD_CHECK(in.num_tokens() <= limits.max_num_batched_tokens && in.num_seqs() <= limits.max_num_seqs &&
                   in.num_logits() <= limits.max_logits_rows() && in.block_size == limits.block_size,
               "a step fits the limits the workspace was sized for");
  const int64_t num_slots = int64_t{kv_.num_blocks()} * in.block_size;
  for (int32_t t = 0; t < in.num_tokens(); ++t) {
    const int32_t id = in.token_ids[t];
    if (IsPendingToken(id)) {  // read by the embedding from the device outputs the last step sampled into
      INFERD_CHECK(PendingRow(id) < last_num_logits_, "a pending token names a row of the step launched before");
    } else {
      INFERD_CHECK(id < cfg_.vocab_size, "step token ids are in the vocabulary");
    }
    INFERD_CHECK(in.slot_mapping[t] >= 0 && in.slot_mapping[t] < num_slots, "slot mapping points into the pool");
  }
  INFERD_CHECK(static_cast<int64_t>(in.kv_indices.size()) <= layout_.inputs.max_pages,
               "a step's pages fit the page table");
  const auto prepare_start = std::chrono::steady_clock::now();
  const int32_t bucket = graphs_->BucketFor(in, layout_.inputs.max_pages);
  const StepInput padded = bucket > 0 ? cuda::DecodeGraphs::Pad(in, bucket, kv_.reserved_block()) : StepInput();
  const StepInput& run = bucket > 0 ? padded : in;
  const bool unsplit = bucket > 0 && graphs_->UseUnsplit(in, bucket, cfg_.num_kv_heads);
  k::AttentionPlan plan;
  {
    TraceRange range("pack and copy inputs, plan attention");
    // The pinned inputs and attention schedule are rewritten only once the last launch's copies have read them
    // (they ran when that step started, so this rarely waits).
    INFERD_CUDA(cudaEventSynchronize(inputs_consumed_));
    // A block this step writes that a copy still reads (a swap-out, a write-back) or fills: after the copy.
    INFERD_ASSIGN_OR_RETURN(const bool ordered, kv_.OrderWrites(in.slot_mapping, in.block_size, compute_));
    counters_.steps_ordered_after_copies += ordered;
    INFERD_RETURN_IF_ERROR(Stage(run, /*decode_graph=*/bucket > 0, unsplit, &plan));
    INFERD_CUDA(cudaEventRecord(inputs_consumed_, compute_));
  }
  Launched step;
  step.slot = static_cast<int>(launches_ % kSlots);
  step.previous_slot = launches_ > 0 ? static_cast<int>((launches_ - 1) % kSlots) : -1;
  Slot& slot = slots_[step.slot];
  // Busy time starts here, once the inputs and the schedule are on the device: the host's planning is not compute.
  INFERD_CUDA(cudaEventRecord(slot.compute_start, compute_));
  cudaGraphExec_t graph = bucket > 0 ? graphs_->Find(bucket, unsplit, plan) : nullptr;
  if (bucket > 0 && !graph) {
    // The graph froze another attention layout: run this step's kernels directly (same plan, same result).
    spdlog::warn("cuda: decode graph for {} rows skipped: the attention plan changed layout", bucket);
  }
  if (graph) {
    TraceRange range("forward and sample (decode graph)");
    INFERD_CUDA(cudaGraphLaunch(graph, compute_));
  } else {
    TraceRange range("forward and sample");
    INFERD_RETURN_IF_ERROR(Forward(run, plan));
  }
  INFERD_CUDA(cudaEventRecord(slot.compute_end, compute_));
  step.top_n.resize(in.num_logits());
  bool logprobs = false;
  for (int32_t r = 0; r < in.num_logits(); ++r) {
    const SamplingRow& row = in.sampling[r];
    const bool reports = row.top_logprobs > 0 || row.target >= 0;
    step.top_n[r] = reports ? std::min(row.top_logprobs, k::kMaxTopLogprobs) : -1;
    logprobs |= reports;
  }
  // The next step's sampling rewrites the device outputs: this copy is queued before it on the same stream. The
  // step's own tokens only, unless a row reports logprobs.
  const OutputRegions& o = layout_.outputs;
  const char* outputs_dev = activations_.get<char>() + layout_.activations.outputs.offset;
  if (logprobs) {
    INFERD_CUDA(cudaMemcpyAsync(slot.outputs_host.get(), outputs_dev, layout_.output_arena_bytes,
                                cudaMemcpyDeviceToHost, compute_));
  } else {
    INFERD_CUDA(cudaMemcpyAsync(slot.outputs_host.get<char>() + o.tokens.offset, outputs_dev + o.tokens.offset,
                                in.num_logits() * sizeof(int32_t), cudaMemcpyDeviceToHost, compute_));
  }
  INFERD_CUDA(cudaEventRecord(slot.outputs_ready, compute_));
  counters_.last_prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - prepare_start).count();
  launched_.push_back(std::move(step));
  ++launches_;
  last_num_logits_ = in.num_logits();
  return absl::OkStatus();
}

absl::Status CudaBackend::Collect(StepOutput* out) {
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
  counters_.last_compute_start_ms = kv_.DeviceClockMs(slot.compute_start);
  counters_.last_compute_end_ms = kv_.DeviceClockMs(slot.compute_end);
  const int32_t R = static_cast<int32_t>(step.top_n.size());
  const OutputRegions& o = layout_.outputs;
  const char* host = slot.outputs_host.get<char>();
  const int32_t* tokens = reinterpret_cast<const int32_t*>(host + o.tokens.offset);
  const float* logprobs = reinterpret_cast<const float*>(host + o.logprobs.offset);
  const int32_t* top_ids = reinterpret_cast<const int32_t*>(host + o.top_ids.offset);
  const float* top_logprobs = reinterpret_cast<const float*>(host + o.top_logprobs.offset);
  out->tokens.assign(tokens, tokens + R);
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
  if (!k::AttentionHeadDimSupported(config.head_dim)) {
    return absl::StrCat("head_dim = ", config.head_dim,
                        " is not supported by the cuda backend; supported: 64, 128, 256");
  }
  return "";
}

int64_t CudaVisibleFreeBytes() {
  size_t free = 0, total = 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return static_cast<int64_t>(free);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const Model& model, const EngineSection& engine) {
  if (std::string why = CudaUnsupportedReason(model.config); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("engine.backend = cuda: ", why));
  }
  if (engine.tensor_parallel_size != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config: engine.tensor_parallel_size = ", engine.tensor_parallel_size,
        " is not built for the cuda backend yet (one GPU per model); allowed on cuda: 1; the cpu backend splits "
        "models on threads"));
  }
  INFERD_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop;
  INFERD_CUDA(cudaGetDeviceProperties(&prop, 0));
  size_t free = 0, total = 0;
  INFERD_CUDA(cudaMemGetInfo(&free, &total));
  const bool fp16 = engine.dtype == "float16";
  const cudaDataType_t dtype = fp16 ? CUDA_R_16F : CUDA_R_16BF;
  // An FP8 checkpoint runs as stored: its weights and scales go up as they are.
  const bool fp8 = engine.quantization == "fp8" || model.tensors.fp8_checkpoint;
  if (model.tensors.fp8_checkpoint && engine.quantization != "fp8") {
    spdlog::info("cuda: the checkpoint is FP8 ({}): engine.quantization = fp8", model.config.quantization.description);
  }
  if (fp8 && prop.major * 10 + prop.minor < 89) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine.quantization = 'fp8' needs fp8 tensor cores (compute "
                     "capability 8.9 or later); ",
                     prop.name, " is ", prop.major, ".", prop.minor));
  }
  const ModelConfig& c = model.config;
  if (fp8 && (c.hidden_size % 16 != 0 || c.intermediate_size % 16 != 0 || c.q_width() % 16 != 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "engine.quantization = 'fp8' needs the products' inner dimensions to be multiples of 16 (fp8 tensor "
        "cores); this model has hidden_size ",
        c.hidden_size, ", intermediate_size ", c.intermediate_size, ", heads x head_dim ", c.q_width()));
  }
  const bool fp8_kv = engine.kv_cache_dtype == "fp8_e4m3";
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
  const auto start = std::chrono::steady_clock::now();
  INFERD_ASSIGN_OR_RETURN(CudaWeights weights, cuda::UploadWeights(model.tensors, dtype, fp8));
  spdlog::info("cuda: {} weights{} on {} ({:.1f} MiB) in {:.2f} s", fp16 ? "float16" : "bfloat16",
               fp8 ? " with fp8 e4m3 linear layers (per-channel scales)" : "", prop.name, weights.bytes / 1048576.0,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (fp8_kv) {
    spdlog::info("cuda: KV cache in fp8 e4m3 ({})", model.tensors.kv_cache_scales
                                                        ? "each layer's k_scale and v_scale from the checkpoint"
                                                        : "scale 1: the checkpoint has no kv_cache_scheme");
  } else if (model.tensors.kv_cache_scales) {
    spdlog::info("cuda: the checkpoint's KV cache scales are unused: engine.kv_cache_dtype is auto");
  }
  return std::make_unique<CudaBackend>(model, std::move(weights), dtype, fp8_kv, static_cast<int64_t>(free), prop.name,
                                       engine.cuda_graphs);
}

}  // namespace inferd
