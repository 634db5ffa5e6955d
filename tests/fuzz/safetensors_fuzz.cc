// libFuzzer target: a safetensors header (the JSON after the 8-byte
// length), checked against a data buffer whose size the input's first 8
// bytes give.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"
#include "core/safetensors/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(uint64_t)) return 0;
  uint64_t data_size = 0;
  std::memcpy(&data_size, data, sizeof(data_size));
  loraplex::ParseSafetensorsHeader(
      absl::string_view(reinterpret_cast<const char*>(data) + sizeof(data_size),
                        size - sizeof(data_size)),
      data_size, "fuzz.safetensors")
      .IgnoreError();
  return 0;
}
