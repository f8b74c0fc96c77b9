// inferd-bench's `tiles` section (with --quantization fp8): each of CUTLASS's fp8 tiles (kernels/fp8_gemm.h) on
// each of the model's layer products, at decode and prefill row counts, against the GPU's ceilings.
#pragma once

#include "engine/model/model_config.h"
#include "nlohmann/json.hpp"

namespace inferd {

// Prints a table (microseconds, and the share of the read ceiling up to 128 rows, of the fp8 GEMM ceiling
// beyond) and returns it as JSON rows {m, product, tile, ms}. Empty where the GPU does not run the kernel.
nlohmann::json Fp8TileProducts(const ModelConfig& c, double read_tbs, double fp8_tflops);

}  // namespace inferd
