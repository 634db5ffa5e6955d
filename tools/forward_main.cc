// loraplex-forward: runs the base model of a checkpoint directory (plus,
// with --adapter, a PEFT LoRA adapter) on given token rows, writes the
// logits to a safetensors file and prints the top-5 next tokens of every
// row. For checking a checkpoint or adapter brought from elsewhere, or one
// exported by the server.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "adapters/peft_adapter.h"
#include "core/common/status_macros.h"
#include "core/lora/multi_lora.h"
#include "core/model/llama_model.h"
#include "core/runtime/device.h"
#include "core/safetensors/safetensors.h"
#include "core/tokenizer/load_tokenizer.h"

namespace {

using loraplex::Tokenizer;

// "1,2,3;4,5" -> {{1,2,3},{4,5}}.
absl::StatusOr<std::vector<std::vector<int64_t>>> ParseIdRows(
    const std::string& text) {
  std::vector<std::vector<int64_t>> rows;
  int row_number = 0;
  for (absl::string_view row : absl::StrSplit(text, ';')) {
    ++row_number;
    std::vector<int64_t> ids;
    for (absl::string_view item : absl::StrSplit(row, ',')) {
      int64_t id;
      if (!absl::SimpleAtoi(item, &id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--ids: row ", row_number, ": \"", item, "\" is not an integer"));
      }
      ids.push_back(id);
    }
    rows.push_back(std::move(ids));
  }
  return rows;
}

std::string Describe(const Tokenizer* tokenizer, int64_t id) {
  if (tokenizer == nullptr) return std::to_string(id);
  if (id == tokenizer->bos_id()) return absl::StrCat(id, " <bos>");
  if (id == tokenizer->eos_id()) return absl::StrCat(id, " <eos>");
  absl::StatusOr<std::string> decoded = tokenizer->Decode({id});
  const std::string piece = decoded.ok() ? *decoded : std::string("?");
  std::string shown;
  for (char c : piece) {
    const auto byte = static_cast<unsigned char>(c);
    shown += (byte >= 32 && byte < 127) ? std::string(1, c)
                                        : absl::StrCat("\\x", absl::Hex(byte));
  }
  return absl::StrCat(id, " \"", shown, "\"");
}

absl::Status Run(const std::string& model_dir, const std::string& adapter_dir,
                 const std::string& ids_text,
                 const std::vector<std::string>& texts,
                 const std::string& dtype_name, const std::string& device_name,
                 int threads, const std::string& out_path) {
  LORAPLEX_ASSIGN_OR_RETURN(torch::Device device,
                            loraplex::ParseDevice(device_name));
  LORAPLEX_RETURN_IF_ERROR(loraplex::ConfigureThreads(threads).status());
  loraplex::ModelLoadOptions options;
  options.device = device;
  if (dtype_name == "f32") options.dtype = torch::kFloat32;
  if (dtype_name == "bf16") options.dtype = torch::kBFloat16;
  LORAPLEX_ASSIGN_OR_RETURN(auto model,
                            loraplex::LlamaModel::Load(model_dir, options));
  std::unique_ptr<loraplex::LoraWeights> adapter;
  if (!adapter_dir.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(
        loraplex::PeftAdapter peft,
        loraplex::LoadPeftAdapter(adapter_dir, model->config()));
    adapter = std::make_unique<loraplex::LoraWeights>(model->config(), device);
    LORAPLEX_RETURN_IF_ERROR(adapter->Bind(peft.config).status());
    LORAPLEX_RETURN_IF_ERROR(loraplex::CopyPeftAdapter(peft, *adapter));
  }
  auto tokenizer_or = loraplex::LoadTokenizer(model_dir);
  std::unique_ptr<Tokenizer> tokenizer;
  if (tokenizer_or.ok()) tokenizer = std::move(tokenizer_or).value();

  std::vector<std::vector<int64_t>> rows;
  if (!ids_text.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(rows, ParseIdRows(ids_text));
  }
  for (const std::string& text : texts) {
    if (tokenizer == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--text needs a tokenizer: ", tokenizer_or.status().message()));
    }
    std::vector<int64_t> ids;
    if (std::optional<int64_t> bos = tokenizer->bos_id()) ids.push_back(*bos);
    LORAPLEX_ASSIGN_OR_RETURN(std::vector<int64_t> text_ids,
                              tokenizer->Encode(text));
    ids.insert(ids.end(), text_ids.begin(), text_ids.end());
    rows.push_back(std::move(ids));
  }
  if (rows.empty()) {
    return absl::InvalidArgumentError("give token rows with --ids or --text");
  }
  size_t seq = 0;
  for (const auto& row : rows) seq = std::max(seq, row.size());
  const int64_t pad = tokenizer ? tokenizer->pad_id() : 0;
  torch::Tensor input_ids = torch::full(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(seq)}, pad,
      torch::kInt64);
  torch::Tensor lengths =
      torch::empty({static_cast<int64_t>(rows.size())}, torch::kInt64);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t t = 0; t < rows[r].size(); ++t) {
      input_ids[r][t] = rows[r][t];
    }
    lengths[r] = static_cast<int64_t>(rows[r].size());
  }

  torch::NoGradGuard no_grad;
  const loraplex::MultiLoraDelta delta({{adapter.get(), input_ids.size(0)}});
  LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor logits,
                            model->Forward(input_ids, lengths, &delta));
  logits = logits.cpu();
  std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                 {"model", model_dir}};
  if (adapter) metadata["adapter"] = adapter_dir;
  LORAPLEX_RETURN_IF_ERROR(loraplex::WriteSafetensors(
      out_path,
      {{"logits", logits}, {"input_ids", input_ids}, {"lengths", lengths}},
      metadata));

  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t last = static_cast<int64_t>(rows[r].size()) - 1;
    torch::Tensor probs = torch::softmax(logits[r][last], -1);
    auto [values, indices] = probs.topk(std::min<int64_t>(5, probs.size(0)));
    std::cout << "row " << r << " (" << rows[r].size()
              << " tokens) next-token top-5:";
    for (int64_t k = 0; k < values.size(0); ++k) {
      std::cout << "  " << Describe(tokenizer.get(), indices[k].item<int64_t>())
                << " p=" << std::fixed << std::setprecision(4)
                << values[k].item<float>();
    }
    std::cout << "\n";
  }
  std::cout << "wrote logits [" << logits.size(0) << ", " << logits.size(1)
            << ", " << logits.size(2) << "] to " << out_path << "\n";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Run a base model (and optionally a LoRA adapter) on token rows and "
      "write the logits."};
  std::string model_dir, adapter_dir, ids, dtype = "auto", device = "cpu", out;
  std::vector<std::string> texts;
  int threads = 0;
  app.add_option("--model", model_dir, "Checkpoint directory")->required();
  app.add_option("--adapter", adapter_dir,
                 "PEFT LoRA adapter directory (adapter_config.json + "
                 "adapter_model.safetensors) applied on top of the model");
  app.add_option("--ids", ids, "Token id rows, e.g. 1,2,3;4,5");
  app.add_option("--text", texts,
                 "Text row (tokenized with the model's tokenizer, BOS first); "
                 "repeatable");
  app.add_option("--dtype", dtype, "Compute dtype")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--device", device, "cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0 = all cores)")
      ->capture_default_str();
  app.add_option("--out", out, "Output safetensors file")->required();
  CLI11_PARSE(app, argc, argv);

  absl::Status status;
  try {
    status =
        Run(model_dir, adapter_dir, ids, texts, dtype, device, threads, out);
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  if (!status.ok()) {
    std::cerr << "loraplex-forward: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
