// libFuzzer target: any bytes given to the GGUF reader are parsed or refused, never read out of bounds,
// and every tensor of a parsed file dequantizes within its bytes.
#include <cstdint>
#include <vector>

#include "engine/model/formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = inferd::ParseGguf({data, size});
  if (!g.ok()) return 0;
  std::vector<float> out;
  for (const inferd::GgufTensor& t : g->tensors) {
    if (t.numel > (1 << 22)) continue;
    out.resize(t.numel);
    const std::span<const uint8_t> bytes(data + g->data_offset + t.offset, t.size);
    if (!inferd::DequantizeGgml(t.type, bytes, t.numel, out.data()).ok()) __builtin_trap();
  }
  return 0;
}
