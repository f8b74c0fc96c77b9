// Packs a StepPlan into the flat arrays every backend reads (sampling rows are added by the engine, which
// owns the requests' sampling state).
#pragma once

#include "engine/runtime/backend.h"
#include "engine/scheduler/scheduler.h"

namespace inferd {

StepInput BuildStepInput(const StepPlan& plan, int32_t block_size);

}  // namespace inferd
