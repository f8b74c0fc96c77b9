// libFuzzer target: any bytes given to the safetensors reader are parsed or refused, and every tensor of a
// parsed file lies inside the data section with the byte count its shape and dtype need.
#include <cstdint>

#include "engine/model/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tensors = inferd::ParseSafetensors({data, size});
  if (!tensors.ok()) return 0;
  uint64_t header_len = 0;
  __builtin_memcpy(&header_len, data, 8);
  const uint64_t data_size = size - 8 - header_len;
  for (const auto& [name, t] : *tensors) {
    if (t.begin > t.end || t.end > data_size) __builtin_trap();
    if (t.end - t.begin != static_cast<uint64_t>(t.numel()) * inferd::DTypeSize(t.dtype)) __builtin_trap();
  }
  return 0;
}
