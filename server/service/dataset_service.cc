#include "server/service/dataset_service.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/atomic_file.h"
#include "core/common/status_macros.h"
#include "core/data/dataset.h"
#include "server/common/clock.h"
#include "server/common/sha256.h"
#include "server/jobs/resource_id.h"
#include "server/service/proto_convert.h"

namespace loraplex {
namespace {

// Receives the header and the chunks, then validates and stores the file
// on a worker thread so no gRPC thread parses a large upload.
class UploadReactor : public grpc::ServerReadReactor<v1::UploadDatasetRequest> {
 public:
  UploadReactor(const ServiceContext* context,
                grpc::CallbackServerContext* call, v1::Dataset* response)
      : context_(context), response_(response) {
    absl::StatusOr<std::string> tenant = Authenticate(*context_, call);
    if (!tenant.ok()) {
      Finish(ToGrpcStatus(tenant.status()));
      return;
    }
    tenant_ = *tenant;
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // The client has sent everything, or the call ended.
      if (cancelled_) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                            "the upload was cancelled; nothing was stored"));
        return;
      }
      if (!header_seen_) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError(
            "header is required: the first message must carry the upload "
            "header")));
        return;
      }
      context_->work->Post([this] {
        absl::Status status;
        try {
          status = Store();
        } catch (const std::exception& error) {
          status = absl::InternalError(ExceptionMessage(error));
        }
        Finish(ToGrpcStatus(status));
      });
      return;
    }
    absl::Status status = Accept();
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&request_);
  }

  // A cancelled upload (client gone, deadline) must not be stored with the
  // bytes that happened to arrive.
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override { delete this; }

 private:
  absl::Status Accept() {
    if (request_.has_header()) {
      if (header_seen_) {
        return absl::InvalidArgumentError(
            "header must be sent once, in the first message");
      }
      header_seen_ = true;
      display_name_ = request_.header().display_name();
      return CheckDisplayName(display_name_, "header.display_name");
    }
    if (!header_seen_) {
      return absl::InvalidArgumentError(
          "header is required: the first message must carry the upload "
          "header");
    }
    const std::string& chunk = request_.chunk();
    const int64_t limit = context_->limits.max_dataset_bytes;
    if (static_cast<int64_t>(contents_.size() + chunk.size()) > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk: the dataset exceeds the upload limit of ", limit,
                       " bytes (ServerInfo.max_dataset_bytes)"));
    }
    contents_ += chunk;
    return absl::OkStatus();
  }

  absl::Status Store() {
    absl::StatusOr<Dataset> dataset =
        ParseJsonlDataset(contents_, context_->datasets->tokenizer(),
                          context_->datasets->parse_options());
    if (!dataset.ok()) {
      return absl::Status(dataset.status().code(),
                          absl::StrCat("the dataset is not valid JSONL "
                                       "training data: ",
                                       dataset.status().message()));
    }
    DatasetRecord record;
    record.id = NewResourceId("ds");
    record.tenant = tenant_;
    record.display_name = display_name_;
    record.size_bytes = static_cast<int64_t>(contents_.size());
    record.num_examples = static_cast<int64_t>(dataset->examples.size());
    record.sha256 = Sha256Hex(contents_);
    record.create_time_ms = NowMillis();
    const std::string path = context_->datasets->PathOf(record.id);
    if (cancelled_) {
      return absl::CancelledError(
          "the upload was cancelled; nothing was stored");
    }
    LORAPLEX_RETURN_IF_ERROR(WriteFileAtomically(path, contents_));
    absl::Status inserted = context_->store->InsertDataset(record);
    if (!inserted.ok()) {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
      return inserted;
    }
    context_->logger->Info(
        "dataset ", record.id, " (tenant ", tenant_, "): stored, ",
        record.num_examples, " examples, ", dataset->num_tokens, " tokens (",
        dataset->num_target_tokens, " trained), ", record.size_bytes, " bytes");
    DatasetToProto(record, response_);
    return absl::OkStatus();
  }

  const ServiceContext* context_;
  v1::Dataset* response_;
  std::string tenant_;
  v1::UploadDatasetRequest request_;
  bool header_seen_ = false;
  std::string display_name_;
  std::string contents_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

grpc::ServerReadReactor<v1::UploadDatasetRequest>*
DatasetServiceImpl::UploadDataset(grpc::CallbackServerContext* call,
                                  v1::Dataset* response) {
  return new UploadReactor(context_, call, response);
}

grpc::ServerUnaryReactor* DatasetServiceImpl::GetDataset(
    grpc::CallbackServerContext* call, const v1::GetDatasetRequest* request,
    v1::Dataset* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(
        std::string id, ParseResourceName(request->name(), "datasets", "name"));
    LORAPLEX_ASSIGN_OR_RETURN(DatasetRecord record,
                              context_->store->GetDataset(tenant, id));
    DatasetToProto(record, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* DatasetServiceImpl::ListDatasets(
    grpc::CallbackServerContext* call, const v1::ListDatasetsRequest* request,
    v1::ListDatasetsResponse* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(int page_size, PageSize(request->page_size()));
    LORAPLEX_ASSIGN_OR_RETURN(Page<DatasetRecord> page,
                              context_->store->ListDatasets(
                                  tenant, page_size, request->page_token()));
    for (const DatasetRecord& record : page.items) {
      DatasetToProto(record, response->add_datasets());
    }
    response->set_next_page_token(page.next_page_token);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* DatasetServiceImpl::DeleteDataset(
    grpc::CallbackServerContext* call, const v1::DeleteDatasetRequest* request,
    v1::DeleteDatasetResponse* /*response*/) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(
        std::string id, ParseResourceName(request->name(), "datasets", "name"));
    LORAPLEX_RETURN_IF_ERROR(context_->store->DeleteDataset(tenant, id));
    // The record is gone (durably) first, so no job can refer to a file
    // that is being removed.
    std::error_code ignored;
    std::filesystem::remove(context_->datasets->PathOf(id), ignored);
    context_->logger->Info("dataset ", id, " (tenant ", tenant, "): deleted");
    return absl::OkStatus();
  });
}

}  // namespace loraplex
