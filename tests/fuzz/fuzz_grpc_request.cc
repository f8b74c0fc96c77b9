// libFuzzer target: any bytes as a GenerateRequest (what a gRPC client sends) are parsed or refused, and a parsed
// request is built into an engine request (messages rendered with a chat template, text tokenized, every field
// checked) or refused with INVALID_ARGUMENT; never a crash.
#include <cstdint>

#include "inferd/v1/inferd.pb.h"
#include "tests/fuzz/fuzz_fixtures.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const inferd::fuzz::Fixtures& fixtures = inferd::fuzz::GetFixtures();
  inferd::v1::GenerateRequest request;
  if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  auto built = inferd::BuildRequest(request, fixtures.limits(data[0]));
  if (!built.ok() && built.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
  return 0;
}
