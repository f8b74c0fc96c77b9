// `inferd-bench serve`: the serving benchmark (a gRPC client of a running inferd); see serve_bench.cc.
#pragma once

namespace inferd {

// argv[1] is "serve". Returns 0 when every request completed, 1 when some failed, 2 on bad arguments.
int ServeMain(int argc, char** argv);

}  // namespace inferd
