// `inferd-bench perplexity FILE`: a running inferd's perplexity over a text, from prompt logprobs
// (perplexity_bench.cc).
#pragma once

namespace inferd {

// argv[1] is "perplexity". Returns 0 when every window was scored, 1 when one failed, 2 on bad arguments.
int PerplexityMain(int argc, char** argv);

}  // namespace inferd
