#include "server/grpc/staged_adapter.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "adapters/peft_files.h"
#include "core/common/atomic_file.h"
#include "core/common/status_macros.h"
#include "core/runtime/exception_message.h"
#include "server/common/clock.h"
#include "server/jobs/job_scheduler.h"
#include "server/jobs/resource_id.h"
#include "server/store/job_store.h"

namespace loraplex {

namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<StagedAdapter>> StagedAdapter::Create(
    const ServiceContext& context, const std::string& tenant,
    const std::string& display_name, const std::string& config_json,
    const std::string& safetensors) {
  const int64_t size =
      static_cast<int64_t>(config_json.size() + safetensors.size());
  if (size > context.limits.max_adapter_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "files: the adapter has ", size, " bytes, more than the limit of ",
        context.limits.max_adapter_bytes));
  }
  std::unique_ptr<StagedAdapter> staged(new StagedAdapter(context));
  AdapterRecord& record = staged->record_;
  record.id = NewResourceId("adapter");
  record.tenant = tenant;
  record.display_name = display_name;
  record.base_model = context.base_model_name;
  record.create_time_ms = NowMillis();
  staged->dir_ = context.scheduler->AdapterDir(record.id);
  staged->staged_ = staged->dir_ + ".staged";
  std::error_code error;
  fs::create_directories(staged->staged_, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", staged->staged_, ": ", error.message()));
  }
  LORAPLEX_RETURN_IF_ERROR(WriteFileAtomically(
      absl::StrCat(staged->staged_, "/", kPeftConfigFile), config_json));
  LORAPLEX_RETURN_IF_ERROR(WriteFileAtomically(
      absl::StrCat(staged->staged_, "/", kPeftWeightsFile), safetensors));
  absl::StatusOr<LoraConfig> lora = [&]() -> absl::StatusOr<LoraConfig> {
    try {
      return context.check_adapter(staged->staged_);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(ExceptionMessage(e));
    }
  }();
  if (!lora.ok()) {
    // The caller sent files, not a directory: name them without the
    // server's state path.
    return absl::InvalidArgumentError(absl::StrCat(
        "files: ", absl::StrReplaceAll(lora.status().message(),
                                       {{staged->staged_ + "/", ""},
                                        {staged->staged_, "the adapter"}})));
  }
  record.lora = LoraConfigToJson(*lora);
  return staged;
}

StagedAdapter::~StagedAdapter() {
  std::error_code ignored;
  fs::remove_all(staged_, ignored);
  if (!published_) fs::remove_all(dir_, ignored);
}

absl::Status StagedAdapter::Publish() {
  LORAPLEX_RETURN_IF_ERROR(PublishDirectory(staged_, dir_));
  LORAPLEX_RETURN_IF_ERROR(context_.store->InsertAdapter(record_));
  published_ = true;
  context_.logger->Info("adapter ", record_.id, " (tenant ", record_.tenant,
                        "): stored");
  return absl::OkStatus();
}

absl::Status StagedAdapter::Withdraw() {
  if (!published_) return absl::OkStatus();
  LORAPLEX_RETURN_IF_ERROR(
      context_.store->DeleteAdapter(record_.tenant, record_.id));
  published_ = false;  // The destructor removes the files.
  context_.logger->Info("adapter ", record_.id, " (tenant ", record_.tenant,
                        "): withdrawn, a repeated request");
  return absl::OkStatus();
}

}  // namespace loraplex
