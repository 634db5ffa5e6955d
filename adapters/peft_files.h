// The file names of a PEFT adapter directory (peft_adapter.h), for code
// that handles the files without LibTorch.
#ifndef LORAPLEX_ADAPTERS_PEFT_FILES_H_
#define LORAPLEX_ADAPTERS_PEFT_FILES_H_

namespace loraplex {

inline constexpr char kPeftConfigFile[] = "adapter_config.json";
inline constexpr char kPeftWeightsFile[] = "adapter_model.safetensors";

}  // namespace loraplex

#endif  // LORAPLEX_ADAPTERS_PEFT_FILES_H_
