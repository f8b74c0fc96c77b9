// A model's attention heads padded with zeros to a wider head dim, for attention kernels that do not run its own
// (FlashInfer's run 64, 128 and 256; Phi-3-mini's heads are 96 wide). Each head's q, k and v rows (and biases) are
// followed by zero rows and the output projection's columns by zero columns, so the padded q·k products, the
// attention weights and the outputs are the unpadded ones: the rotary embedding turns the stored dimensions only
// and the softmax scale stays 1/√(stored head dim). What it costs is memory and bandwidth: the padded share of the
// q/k/v and output products, and of the KV cache.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/model.h"

namespace inferd {

// A description of `model` (its name, config, tensors and end ids; no tokenizer or chat template) with every head
// padded to `head_dim`, which is wider than the model's. The tensors read the same mapped bytes. Refused for a
// family with per-head q/k norms (a norm over the padded head would divide by the wider dim).
absl::StatusOr<std::unique_ptr<Model>> WithPaddedHeads(const Model& model, int32_t head_dim);

// The model as the cuda backend's kernels run it (and `inferd plan` plans it): padded to
// kernels::AttentionRunHeadDim where that is not its own head dim, else null (it runs as it is).
absl::StatusOr<std::unique_ptr<Model>> PaddedForAttentionKernels(const Model& model);

}  // namespace inferd
