// Packs one step's inputs into the input arena the cuda backend copies to the device (pinned host memory laid
// out by DeviceLayout::inputs): the StepInput's flat index arrays, each logits row's sampling parameters, the
// penalty entries (one per distinct id a row penalizes or bans), and the structured-output masks. Host-only, so it is
// tested without a GPU.
#pragma once

#include <cstdint>

#include "engine/runtime/backend.h"
#include "engine/runtime/device_layout.h"

namespace inferd::cuda {

struct PackedStep {
  int64_t head_bytes = 0;       // bytes from the arena's start through the step's pages: what every step copies
  int64_t penalty_entries = 0;  // entries in penalty_tokens / counts / flags; copied only when there are any
  int64_t masked_rows = 0;      // rows [0, masked_rows) of `allowed` hold masks; copied only when there are any
};

// `arena` holds layout.inputs' regions (input_arena_bytes). The step fits the layout's limits (checked). Pages a
// window group let go (-1) become `no_block`, a block of the backend's own that no sequence holds.
PackedStep PackStepInputs(const StepInput& in, const InputRegions& layout, int32_t vocab_size, int32_t no_block,
                          char* arena);

}  // namespace inferd::cuda
