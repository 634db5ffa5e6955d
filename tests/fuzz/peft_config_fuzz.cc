// libFuzzer target: an uploaded adapter_config.json.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "adapters/peft_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loraplex::ParsePeftConfigText(
      absl::string_view(reinterpret_cast<const char*>(data), size),
      /*num_layers=*/4, "adapter_config.json")
      .IgnoreError();
  return 0;
}
