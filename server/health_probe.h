// `inferd health-probe [--address HOST:PORT] [--timeout-s S]`: asks a server's grpc.health.v1 service whether it
// serves, for a container's health check (no grpcurl in the image). Exits 0 when SERVING; 1 when it answers
// anything else or cannot be reached, saying which; 2 on a bad command line.
#pragma once

namespace inferd {

int RunHealthProbe(int argc, char** argv);

}  // namespace inferd
