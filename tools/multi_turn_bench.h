// `inferd-bench serve --multi-turn`: simulated users holding conversations with a running inferd over gRPC; see
// multi_turn_bench.cc.
#pragma once

namespace inferd {

// argv[1] is "serve", argv[2] "--multi-turn". Returns 0 when every turn completed, 1 when some failed, 2 on bad
// arguments.
int MultiTurnMain(int argc, char** argv);

}  // namespace inferd
