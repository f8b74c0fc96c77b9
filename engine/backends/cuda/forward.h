// One step's forward pass on the compute stream: embedding, the layers (norm, q/k/v product with RoPE and the
// K/V write, paged attention, o product, norm, gate/up product, SiLU·mul, down product), then the final norm and
// LM head on the rows that sample, and sampling on the device. The only code templated on the dtype.
// On a rank of a tensor-parallel model the layers run on the rank's heads and MLP columns (its ModelConfig shard,
// ShardConfig): the attention output and down products give partial sums, summed over the ranks in place
// (Collectives); each rank computes its vocabulary run of the logits into rank 0's (where the GPUs reach each
// other's memory; else rank 0 computes them all), rank 0 samples, then broadcasts the sampled tokens, which the
// next step's embedding reads on every rank.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "absl/status/status.h"
#include "engine/backends/cuda/collectives.h"
#include "engine/backends/cuda/cuda_weights.h"
#include "engine/backends/cuda/gemm.h"
#include "engine/model/model_config.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/device_layout.h"
#include "kernels/paged_attention.h"

namespace inferd::cuda {

// Where a step's forward pass reads and writes: the device arenas laid out by DeviceLayout, and the KV pool.
struct ForwardBuffers {
  const DeviceLayout* layout = nullptr;
  char* activations = nullptr;   // the activation arena (layout->activations)
  char* inputs = nullptr;        // the device copy of the input arena (layout->inputs)
  char* kv = nullptr;            // per KV slot K then V, each [num_blocks, block_size, num_kv_heads, head_dim]
  int64_t layer_kv_bytes = 0;    // one slot's K (or V): num_blocks * layout->kv_block_bytes
  char* rank0_logits = nullptr;  // rank 0's logits (layout->activations.logits), as this rank addresses them
  int moe_grouped_sms = 0;       // > 0: the experts' long runs go through kernels::MoeGroupedGemm on this many SMs

  template <typename U>
  U* act(const Region& r) const {
    return reinterpret_cast<U*>(activations + r.offset);
  }
  template <typename U>
  U* in(const Region& r) const {
    return reinterpret_cast<U*>(inputs + r.offset);
  }
  char* outputs() const { return activations + layout->activations.outputs.offset; }
  // A layer's K and V: its slot's (KvGroups::slot_of) in its group's blocks.
  void* k(int layer) const { return kv + int64_t{layout->kv_groups.slot_of[layer]} * 2 * layer_kv_bytes; }
  void* v(int layer) const { return kv + (int64_t{layout->kv_groups.slot_of[layer]} * 2 + 1) * layer_kv_bytes; }
  // A layer's group's KV slots of the step's tokens, and its page table's indptr (InputRegions).
  const int32_t* slots(int layer) const {
    return in<int32_t>(layout->inputs.slots) + layout->kv_groups.group_of[layer] * layout->inputs.slots_stride;
  }
  const int32_t* kv_indptr(int layer) const {
    return in<int32_t>(layout->inputs.kv_indptr) + layout->kv_groups.group_of[layer] * layout->inputs.indptr_stride;
  }
};

// A step's attention plans: the global layers', and for a model with sliding windows its window layers' (FlashInfer
// sizes a windowed run's KV chunks by the window, so one split plan cannot serve both kinds;
// kernels/paged_attention.h).
struct AttentionPlans {
  kernels::AttentionPlan global, window;
  bool operator==(const AttentionPlans& o) const {
    return std::equal(std::begin(global.words), std::end(global.words), std::begin(o.global.words)) &&
           std::equal(std::begin(window.words), std::end(window.words), std::begin(o.window.words));
  }
};

// The shape one rank of `size` runs: the model's with its heads, KV heads and MLP columns (the whole model's
// for one rank).
ModelConfig ShardConfig(const ModelConfig& model, const TensorParallelShard& shard);

// T: __nv_bfloat16 or __half (instantiated in forward.cc). The step's inputs are on the device; `plans` are its
// attention plans. A PendingToken id names a row of the outputs the last launched step sampled into. `comm`: this
// rank's communicator, null on one GPU.
template <typename T>
absl::Status RunForward(const ModelConfig& cfg, const CudaWeights& w, Gemm& gemm, const ForwardBuffers& b,
                        const StepInput& in, const AttentionPlans& plans, const Collectives* comm, cudaStream_t stream);

// Chooses cuBLASLt's algorithm by measurement for each of the forward pass's products at each of these row
// counts past the streaming kernel's, on random inputs in the activation arena. Logs what it gained.
absl::Status TuneProducts(const ModelConfig& cfg, const CudaWeights& w, Gemm& gemm, const ForwardBuffers& b, bool bf16,
                          const std::vector<int32_t>& rows, cudaStream_t stream);

}  // namespace inferd::cuda
