// The GPU backend: bf16/fp16 weights on the device, cuBLASLt products, FlashInfer paged attention, our fused
// kernels and sampling on the device. Everything a step does runs in order on one stream: its inputs' copy from
// pinned memory (packed while the step before runs), its kernels or decode graph, the copy of its sampled token ids
// back. Logits never leave the device. A model split over several GPUs (engine.tensor_parallel_size) runs one rank
// per GPU on a thread of its own, its layers summed over the ranks by NCCL (collectives.h, rank_threads.h). The
// pieces: device_layout.h (what is allocated where), step_packing.h,
// decode_graphs.h, forward.h, kv_pool.h.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/model/model.h"
#include "engine/runtime/backend.h"

namespace inferd {

// Why this machine or model cannot run on cuda ("" when it can): no device, an unsupported head_dim, soft caps, or
// a layer program the cuda walk cannot fuse (LayerWalkProblem).
std::string CudaUnsupportedReason(const ModelConfig& config);

// Free memory of device 0 in bytes; 0 when no device is visible.
int64_t CudaVisibleFreeBytes();

// How a tensor-parallel model's ranks are laid out, for tests on one GPU; the default serves.
struct CudaRankOptions {
  // One rank with an NCCL communicator of its own, whose sums and broadcasts every step makes as a rank of several
  // would: the NCCL path, exercised on one GPU.
  bool collectives_on_one_gpu = false;
  // Every rank of engine.tensor_parallel_size on GPU 0, summing through the one-shot peer kernels (NCCL takes one
  // rank per GPU): the sharded arithmetic of several ranks, on one GPU, without decode graphs (collectives.h says
  // why). Size the KV pool with engine.num_blocks.
  bool ranks_share_gpu = false;
};

// engine.tensor_parallel_size > 1: one rank per GPU (0..N-1 of the visible ones), on threads of this process.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const Model& model, const EngineSection& engine,
                                                           CudaRankOptions options = {});

}  // namespace inferd
