#include "server/grpc/dataset_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/atomic_file.h"
#include "core/common/sha256.h"
#include "core/common/status_macros.h"
#include "core/data/dataset.h"
#include "server/common/clock.h"
#include "server/grpc/proto_convert.h"
#include "server/grpc/request_ids.h"
#include "server/jobs/resource_id.h"

namespace loraplex {
namespace {

bool IsSha256Hex(absl::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Receives the header and the chunks, then validates and stores the file
// on a worker thread so no gRPC thread parses a large upload. It reads the
// messages as bytes and parses them itself: gRPC reports a message it
// cannot parse as a failed read, which is also how the stream's end looks,
// so a malformed message would otherwise end the upload with the chunks
// before it.
class UploadReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(const ServiceContext* context,
                grpc::CallbackServerContext* call, grpc::ByteBuffer* response)
      : context_(context), call_(call), response_(response) {
    absl::StatusOr<std::string> tenant = Authenticate(*context_, call);
    if (!tenant.ok()) {
      Finish(ToGrpcStatus(tenant.status()));
      return;
    }
    tenant_ = *tenant;
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // The client has sent everything, or the call ended.
      if (cancelled_ || call_->IsCancelled()) {
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
      if (declared_bytes_ &&
          static_cast<int64_t>(contents_.size()) != *declared_bytes_) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError(
            absl::StrCat("header.total_bytes: the upload declared ",
                         *declared_bytes_, " bytes but its stream ended after ",
                         contents_.size(), "; nothing was stored"))));
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
    ++messages_;
    absl::Status status = Parse();
    if (status.ok()) status = Accept();
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&message_);
  }

  // A cancelled upload (client gone, deadline) must not be stored with the
  // bytes that happened to arrive.
  void OnCancel() override { cancelled_ = true; }

  void OnDone() override {
    // The cancel may be seen only now (a read can fail before OnCancel
    // runs): a dataset whose OK never reached the client is taken back.
    if (!stored_id_.empty() && call_->IsCancelled()) Unstore();
    delete this;
  }

 private:
  // message_ into request_.
  absl::Status Parse() {
    request_.Clear();
    grpc::Status parsed =
        grpc::SerializationTraits<v1::UploadDatasetRequest>::Deserialize(
            &message_, &request_);
    if (parsed.ok()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "the upload stream could not be parsed: its message ", messages_,
        " is no UploadDatasetRequest (malformed, truncated, or a string "
        "that is not UTF-8); nothing was stored"));
  }

  absl::Status Accept() {
    if (request_.has_header()) {
      if (header_seen_) {
        return absl::InvalidArgumentError(
            "header must be sent once, in the first message");
      }
      header_seen_ = true;
      const v1::UploadDatasetHeader& header = request_.header();
      display_name_ = header.display_name();
      LORAPLEX_RETURN_IF_ERROR(
          CheckDisplayName(display_name_, "header.display_name"));
      if (header.has_total_bytes()) {
        const int64_t limit = context_->limits.max_dataset_bytes;
        if (header.total_bytes() < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "header.total_bytes must be >= 0, got ", header.total_bytes()));
        }
        if (header.total_bytes() > limit) {
          return absl::InvalidArgumentError(absl::StrCat(
              "header.total_bytes: the dataset (", header.total_bytes(),
              " bytes) exceeds the upload limit of ", limit,
              " bytes (ServerInfo.max_dataset_bytes)"));
        }
        declared_bytes_ = header.total_bytes();
      }
      LORAPLEX_ASSIGN_OR_RETURN(
          request_key_, RequestKeyOf(tenant_, "UploadDataset",
                                     header.request_id(), "header.request_id"));
      LORAPLEX_ASSIGN_OR_RETURN(
          chat_defaults_, ParseChatLineDefaults(header.chat_template_kwargs(),
                                                header.turns(), "header."));
      declared_sha256_ = header.sha256();
      if (!declared_sha256_.empty() && !IsSha256Hex(declared_sha256_)) {
        return absl::InvalidArgumentError(
            "header.sha256 must be 64 lowercase hex digits");
      }
      return absl::OkStatus();
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
    if (declared_bytes_ &&
        static_cast<int64_t>(contents_.size() + chunk.size()) >
            *declared_bytes_) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk: more bytes than header.total_bytes (",
                       *declared_bytes_, ") arrived; nothing was stored"));
    }
    contents_ += chunk;
    return absl::OkStatus();
  }

  // Takes back what Store stored.
  void Unstore() {
    absl::Status deleted = context_->store->DeleteDataset(tenant_, stored_id_);
    std::error_code ignored;
    std::filesystem::remove(context_->datasets->PathOf(stored_id_), ignored);
    std::filesystem::remove(context_->datasets->ChatDefaultsPathOf(stored_id_),
                            ignored);
    if (deleted.ok()) {
      context_->logger->Info("dataset ", stored_id_, " (tenant ", tenant_,
                             "): the client cancelled before its answer; "
                             "removed");
    } else {
      context_->logger->Error("dataset ", stored_id_, " (tenant ", tenant_,
                              "): the client cancelled before its answer, "
                              "but removing it failed: ",
                              deleted.message());
    }
  }

  // Answers with the dataset an earlier upload with the same request_id
  // stored; false when there is none.
  absl::StatusOr<bool> AnswerAsRepeat() {
    LORAPLEX_ASSIGN_OR_RETURN(std::optional<std::string> id,
                              EarlierResult(*context_, request_key_));
    if (!id) return false;
    LORAPLEX_ASSIGN_OR_RETURN(DatasetRecord earlier,
                              context_->store->GetDataset(tenant_, *id));
    LORAPLEX_RETURN_IF_ERROR(Answer(earlier));
    return true;
  }

  absl::Status Store() {
    LORAPLEX_ASSIGN_OR_RETURN(bool repeat, AnswerAsRepeat());
    if (repeat) return absl::OkStatus();
    DatasetParseOptions options = context_->datasets->parse_options();
    options.chat_defaults = chat_defaults_;
    absl::StatusOr<Dataset> dataset =
        ParseJsonlDataset(contents_, context_->datasets->tokenizer(), options);
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
    if (!declared_sha256_.empty() && declared_sha256_ != record.sha256) {
      return absl::InvalidArgumentError(absl::StrCat(
          "header.sha256: the bytes that arrived hash to ", record.sha256,
          ", not the declared ", declared_sha256_, "; nothing was stored"));
    }
    record.create_time_ms = NowMillis();
    const std::string path = context_->datasets->PathOf(record.id);
    if (cancelled_ || call_->IsCancelled()) {
      return absl::CancelledError(
          "the upload was cancelled; nothing was stored");
    }
    // Jobs parse the stored file again: the upload's defaults go with it.
    const std::string defaults_path =
        context_->datasets->ChatDefaultsPathOf(record.id);
    if (HasChatDefaults()) {
      LORAPLEX_RETURN_IF_ERROR(WriteFileAtomically(
          defaults_path, ChatLineDefaultsToJson(chat_defaults_)));
    }
    absl::Status written = WriteFileAtomically(path, contents_);
    absl::Status inserted =
        written.ok() ? context_->store->InsertDataset(
                           record, request_key_ ? &*request_key_ : nullptr)
                     : written;
    if (!inserted.ok()) {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
      std::filesystem::remove(defaults_path, ignored);
      // A repeat that ran alongside the first: the first's dataset answers.
      if (request_key_ && absl::IsAlreadyExists(inserted)) {
        LORAPLEX_ASSIGN_OR_RETURN(repeat, AnswerAsRepeat());
        if (repeat) return absl::OkStatus();
      }
      return inserted;
    }
    stored_id_ = record.id;
    context_->logger->Info(
        "dataset ", record.id, " (tenant ", tenant_, "): stored, ",
        record.num_examples, " examples, ", dataset->num_tokens, " tokens (",
        dataset->num_target_tokens, " trained), ", record.size_bytes, " bytes",
        dataset->num_per_turn_lines > 0
            ? absl::StrCat("; ", dataset->num_per_turn_lines, " of ",
                           dataset->num_lines,
                           " lines became one example per assistant turn")
            : std::string());
    return Answer(record);
  }

  bool HasChatDefaults() const {
    return !chat_defaults_.chat_template_kwargs.empty() ||
           chat_defaults_.turns != "all";
  }

  // Sets the response to `record`.
  absl::Status Answer(const DatasetRecord& record) {
    v1::Dataset dataset;
    DatasetToProto(record, &dataset);
    bool own_buffer = false;
    grpc::Status serialized = grpc::SerializationTraits<v1::Dataset>::Serialize(
        dataset, response_, &own_buffer);
    if (serialized.ok()) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("the dataset's answer could not be serialized: ",
                     serialized.error_message()));
  }

  const ServiceContext* context_;
  grpc::CallbackServerContext* call_;
  grpc::ByteBuffer* response_;  // A v1::Dataset.
  std::string tenant_;
  grpc::ByteBuffer message_;          // The message read last.
  int64_t messages_ = 0;              // Messages read so far.
  v1::UploadDatasetRequest request_;  // message_, parsed.
  bool header_seen_ = false;
  std::string display_name_;
  std::string contents_;
  std::optional<int64_t> declared_bytes_;  // header.total_bytes.
  std::string declared_sha256_;            // header.sha256; "": none.
  ChatLineDefaults chat_defaults_;  // header.chat_template_kwargs and turns.
  std::optional<RequestKey> request_key_;  // header.request_id's.
  std::string stored_id_;                  // Set once Store stored it.
  std::atomic<bool> cancelled_{false};
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* DatasetServiceImpl::UploadDataset(
    grpc::CallbackServerContext* call, grpc::ByteBuffer* response) {
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
    std::filesystem::remove(context_->datasets->ChatDefaultsPathOf(id),
                            ignored);
    context_->logger->Info("dataset ", id, " (tenant ", tenant, "): deleted");
    return absl::OkStatus();
  });
}

}  // namespace loraplex
