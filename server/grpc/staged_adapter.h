// A PEFT adapter received by the service (an upload, or the weights of a
// checkpoint a new job continues from), written to a staging directory and
// checked against the base model; it becomes a stored adapter only with
// Publish(), so a request that fails later leaves nothing behind.
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto staged, StagedAdapter::Create(
//       context, tenant, "name", config_json, safetensors));
//   ... validate what uses staged->record() ...
//   LORAPLEX_RETURN_IF_ERROR(staged->Publish());
#ifndef LORAPLEX_SERVER_GRPC_STAGED_ADAPTER_H_
#define LORAPLEX_SERVER_GRPC_STAGED_ADAPTER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/grpc/unary_calls.h"
#include "server/store/records.h"

namespace loraplex {

class StagedAdapter {
 public:
  // INVALID_ARGUMENT (prefixed "files: ") for an adapter over the size
  // limit or one that does not fit the base model.
  static absl::StatusOr<std::unique_ptr<StagedAdapter>> Create(
      const ServiceContext& context, const std::string& tenant,
      const std::string& display_name, const std::string& config_json,
      const std::string& safetensors);

  // Removes the files unless Publish() succeeded.
  ~StagedAdapter();
  StagedAdapter(const StagedAdapter&) = delete;
  StagedAdapter& operator=(const StagedAdapter&) = delete;

  AdapterRecord& record() { return record_; }

  // Moves the files into place, then stores the record.
  absl::Status Publish();

  // Undoes a Publish() whose adapter turned out not to be needed (a repeat
  // of a request that had already stored its own): deletes the record,
  // then the files. A no-op unless published.
  absl::Status Withdraw();

 private:
  explicit StagedAdapter(const ServiceContext& context) : context_(context) {}

  const ServiceContext& context_;
  AdapterRecord record_;
  std::string dir_;
  std::string staged_;
  bool published_ = false;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_STAGED_ADAPTER_H_
