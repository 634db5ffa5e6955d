// The one list of supported model families: a new family is a file under
// families/ and a line here.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/model/model_family.h"

namespace loraplex {

const ModelFamilySpec& LlamaFamily();
const ModelFamilySpec& Qwen2Family();
const ModelFamilySpec& MistralFamily();
const ModelFamilySpec& Qwen3Family();
const ModelFamilySpec& Olmo2Family();
const ModelFamilySpec& Olmo3Family();
const ModelFamilySpec& Gemma3TextFamily();
const ModelFamilySpec& Phi3Family();
const ModelFamilySpec& Gemma3Family();
const ModelFamilySpec& Qwen3MoeFamily();
const ModelFamilySpec& GptOssFamily();

const std::vector<const ModelFamilySpec*>& ModelFamilies() {
  static const std::vector<const ModelFamilySpec*> families = {
      &LlamaFamily(),  &Qwen2Family(),    &MistralFamily(),    &Qwen3Family(),
      &Olmo2Family(),  &Olmo3Family(),    &Gemma3TextFamily(), &Phi3Family(),
      &Gemma3Family(), &Qwen3MoeFamily(), &GptOssFamily()};
  return families;
}

const ModelFamilySpec* FindModelFamily(absl::string_view model_type) {
  for (const ModelFamilySpec* family : ModelFamilies()) {
    if (family->model_type == model_type) return family;
  }
  return nullptr;
}

const WrappedTextModel* WrappedTextModelOf(const ModelConfig& config) {
  const ModelFamilySpec* family = FindModelFamily(config.model_type);
  return family == nullptr ? nullptr : family->wrapped;
}

std::string WrappedName(const WrappedTextModel::Layout& layout,
                        absl::string_view name) {
  if (absl::ConsumePrefix(&name, "model.")) {
    return absl::StrCat(layout.model_prefix, name);
  }
  if (absl::ConsumePrefix(&name, "lm_head")) {
    return absl::StrCat(layout.lm_head, name);
  }
  return std::string(name);
}

std::string SupportedModelTypes() {
  return absl::StrJoin(ModelFamilies(), ", ",
                       [](std::string* out, const ModelFamilySpec* family) {
                         absl::StrAppend(out, family->model_type);
                       });
}

}  // namespace loraplex
