// `inferd-bench cpu`: the cpu backend in process, as llama.cpp's llama-bench measures llama.cpp (no server, no client
// on the same cores): prompt processing of N tokens and decode at batch sizes; see cpu_bench.cc.
#pragma once

namespace inferd {

// argv[1] is "cpu". Returns 0 when every run completed, 1 otherwise, 2 on bad arguments.
int CpuBenchMain(int argc, char** argv);

}  // namespace inferd
