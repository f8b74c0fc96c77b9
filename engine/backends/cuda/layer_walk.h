// What the cuda backend's walk of a family's layer program (forward.cc) assumes of it, checked before a model is
// loaded. Host-only: built and tested without CUDA.
#pragma once

#include <string>

#include "engine/model/architecture.h"

namespace inferd {

// Why the cuda backend cannot walk this family's layer ("" when it can). It fuses a residual add with the norm
// after it (the post-attention norm, or the next layer's input norm, or the final norm), and the per-head q/k
// norms, the rotary embedding and the K/V write into one kernel, so a layer must begin with its input norm, end
// with a residual add, have a residual add inside it only right before the post-attention norm, and the q/k norms
// (where it has them), the rotary embedding and the K/V write in a row.
std::string LayerWalkProblem(const Architecture& arch);

}  // namespace inferd
