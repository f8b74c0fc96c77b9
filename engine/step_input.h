// Packs a StepPlan into the flat arrays every backend reads.
#pragma once

#include "engine/backend.h"
#include "engine/scheduler.h"

namespace inferd {

StepInput BuildStepInput(const StepPlan& plan, int32_t block_size);

}  // namespace inferd
