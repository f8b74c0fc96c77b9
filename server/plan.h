// `inferd plan --config FILE [--gpu-memory-gib N] [--tensor-parallel N]`: the cuda memory plan of a config (per GPU
// with tensor parallelism) without starting it —
// weights, activation workspace, KV bytes per token and block, blocks, and concurrent sequences at several
// context lengths, for bf16 and fp16. Without --gpu-memory-gib it asks the visible GPU for its free memory.
#pragma once

namespace inferd {

int RunPlan(int argc, char** argv);

}  // namespace inferd
