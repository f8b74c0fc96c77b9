// `inferd-bench speculative`: speculative decoding's speed-up and acceptance on workloads of real prompts, and the
// cost of a verify step against a plain decode step; see spec_bench.cc.
#pragma once

namespace inferd {

// argv[1] is "speculative". Returns 0 when every run completed and speculation changed no token a margin ≥ 0.1
// decided, 1 otherwise, 2 on bad arguments.
int SpecMain(int argc, char** argv);

}  // namespace inferd
