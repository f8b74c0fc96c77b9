#include "server/health_probe.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace inferd {
namespace {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
const char* StatusName(int status) {
  switch (status) {
    case 0:
      return "UNKNOWN";
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
  }
  return "an unknown status";
}

// The serving status in a HealthCheckResponse's bytes: field 1, a varint (absent = 0, UNKNOWN). -1 when the
// bytes are not such a message.
int ParseStatus(const std::string& bytes) {
  int status = 0;
  for (size_t i = 0; i < bytes.size();) {
    const uint8_t key = static_cast<uint8_t>(bytes[i++]);
    if ((key & 7) != 0) return -1;  // only varint fields are expected
    uint64_t value = 0;
    for (int shift = 0; i < bytes.size(); shift += 7) {
      const uint8_t b = static_cast<uint8_t>(bytes[i++]);
      value |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) break;
      if (shift > 56) return -1;
    }
    if ((key >> 3) == 1) status = static_cast<int>(value);
  }
  return status;
}

}  // namespace

int RunHealthProbe(int argc, char** argv) {
  std::string address = "127.0.0.1:50051";
  double timeout_s = 2;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--address" && i + 1 < argc) {
      address = argv[++i];
    } else if (a == "--timeout-s" && i + 1 < argc) {
      timeout_s = std::atof(argv[++i]);
      if (!(timeout_s > 0)) {
        std::fprintf(stderr, "inferd health-probe: --timeout-s must be a positive number of seconds\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: inferd health-probe [--address HOST:PORT] [--timeout-s S]\n");
      return 2;
    }
  }
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
  grpc::Slice empty(std::string{});  // an empty HealthCheckRequest: the server as a whole
  grpc::ByteBuffer request(&empty, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    cv.notify_one();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  if (!status.ok()) {
    std::fprintf(stderr, "inferd health-probe: %s did not answer: %s\n", address.c_str(),
                 status.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  const int serving = ParseStatus(bytes);
  std::printf("%s: %s\n", address.c_str(), serving < 0 ? "an unreadable health answer" : StatusName(serving));
  return serving == 1 ? 0 : 1;
}

}  // namespace inferd
