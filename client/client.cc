#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "core/common/atomic_file.h"
#include "core/common/read_file.h"
#include "core/common/sha256.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

// Largest response the client accepts; export chunks and big pages fit.
constexpr int kMaxReceiveMessageBytes = 256 << 20;

absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          absl::string_view field) {
  absl::StatusOr<std::string> contents = ReadFile(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", contents.status().message()));
  }
  return contents;
}

// INTERNAL when a List call answered with the page token it was sent, which
// would page forever.
absl::Status CheckPageTokenAdvanced(absl::string_view method,
                                    const std::string& sent,
                                    const std::string& next) {
  if (next.empty() || next != sent) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(method, ": the server returned next_page_token \"", next,
                   "\" for the same page_token, which would page forever"));
}

// Why `file_name` may not be written into the export directory, or "".
std::string ExportFileNameProblem(const std::string& file_name) {
  if (file_name.empty()) return "is empty";
  if (file_name.find('/') != std::string::npos) return "contains '/'";
  if (file_name.find("..") != std::string::npos) return "contains '..'";
  if (file_name == ".") return "is '.'";
  if (file_name.find('\0') != std::string::npos) return "contains NUL";
  return "";
}

}  // namespace

void WatchCancellation::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  for (grpc::ClientContext* context : contexts_) context->TryCancel();
}

bool WatchCancellation::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

bool WatchCancellation::Register(grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return false;
  contexts_.push_back(context);
  return true;
}

void WatchCancellation::Unregister(grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(mu_);
  contexts_.erase(std::remove(contexts_.begin(), contexts_.end(), context),
                  contexts_.end());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

absl::StatusOr<std::unique_ptr<LoraplexClient>> LoraplexClient::Connect(
    const ClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("address must not be empty");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout must be positive, got ",
                     absl::FormatDuration(options.timeout)));
  }
  if (options.transfer_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer_timeout must be positive, got ",
                     absl::FormatDuration(options.transfer_timeout)));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls_ca_file.empty()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    LORAPLEX_ASSIGN_OR_RETURN(
        std::string ca_pem, ReadWholeFile(options.tls_ca_file, "tls_ca_file"));
    if (ca_pem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tls_ca_file: ", options.tls_ca_file,
                       " is empty; it must hold the PEM certificate of a CA"));
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = std::move(ca_pem);
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  // A watch has no deadline: pings during calls notice a server that
  // vanished without closing the connection, so the watch can reconnect.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30 * 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10 * 1000);
  auto channel = grpc::CreateCustomChannel(options.address, credentials, args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: cannot create a channel to ", options.address));
  }
  return std::unique_ptr<LoraplexClient>(
      new LoraplexClient(options, std::move(channel)));
}

LoraplexClient::LoraplexClient(ClientOptions options,
                               std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      server_stub_(v1::ServerService::NewStub(channel_)),
      dataset_stub_(v1::DatasetService::NewStub(channel_)),
      job_stub_(v1::JobService::NewStub(channel_)),
      adapter_stub_(v1::AdapterService::NewStub(channel_)),
      sampling_stub_(v1::SamplingService::NewStub(channel_)),
      session_stub_(v1::TrainingSessionService::NewStub(channel_)) {}

LoraplexClient::~LoraplexClient() = default;

void LoraplexClient::PrepareContext(grpc::ClientContext* context,
                                    absl::Duration timeout) const {
  if (!options_.token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.token);
  }
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
}

template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> LoraplexClient::CallUnary(
    Stub* stub,
    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                 Response*),
    const Request& request, std::optional<absl::Duration> timeout) const {
  grpc::ClientContext context;
  PrepareContext(&context, timeout.value_or(options_.timeout));
  Response response;
  const grpc::Status status = (stub->*method)(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::ServerInfo> LoraplexClient::GetServerInfo() {
  v1::GetServerInfoRequest request;
  return CallUnary(server_stub_.get(), &v1::ServerService::Stub::GetServerInfo,
                   request);
}

std::string NewRequestId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&id, absl::Hex(random(), absl::kZeroPad8));
  }
  return id;
}

template <typename Result>
Result LoraplexClient::Retrying(const std::function<Result()>& call) const {
  absl::Duration backoff = options_.retry_backoff;
  for (int attempt = 1;; ++attempt) {
    Result result = call();
    const absl::StatusCode code = result.status().code();
    const bool transient = code == absl::StatusCode::kUnavailable ||
                           code == absl::StatusCode::kDeadlineExceeded;
    if (!transient || attempt >= options_.attempts) return result;
    absl::SleepFor(backoff);
    backoff *= 2;
  }
}

absl::StatusOr<v1::Dataset> LoraplexClient::Upload(
    const std::string& display_name, int64_t total_bytes,
    const std::string& sha256, const DatasetUploadOptions& upload_options,
    const std::function<absl::StatusOr<ChunkSource>()>& open) {
  v1::UploadDatasetRequest header;
  header.mutable_header()->set_chat_template_kwargs(
      upload_options.chat_template_kwargs);
  header.mutable_header()->set_turns(upload_options.turns);
  header.mutable_header()->set_display_name(display_name);
  header.mutable_header()->set_total_bytes(total_bytes);
  header.mutable_header()->set_sha256(sha256);
  header.mutable_header()->set_request_id(NewRequestId());
  return Retrying<absl::StatusOr<v1::Dataset>>(
      [&]() -> absl::StatusOr<v1::Dataset> {
        LORAPLEX_ASSIGN_OR_RETURN(ChunkSource next_chunk, open());
        return UploadOnce(header, next_chunk);
      });
}

absl::StatusOr<v1::Dataset> LoraplexClient::UploadOnce(
    const v1::UploadDatasetRequest& header, const ChunkSource& next_chunk) {
  grpc::ClientContext context;
  PrepareContext(&context, options_.transfer_timeout);
  v1::Dataset dataset;
  std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer =
      dataset_stub_->UploadDataset(&context, &dataset);
  // A failed Write means the server ended the call; Finish() says why.
  bool open = writer->Write(header);
  absl::Status read_status;
  while (open) {
    std::string chunk;
    bool done = false;
    read_status = next_chunk(&chunk, &done);
    if (!read_status.ok()) {
      context.TryCancel();
      break;
    }
    if (!chunk.empty()) {
      v1::UploadDatasetRequest part;
      part.set_chunk(std::move(chunk));
      open = writer->Write(part);
    }
    if (done) break;
  }
  if (open && read_status.ok()) writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!read_status.ok()) return read_status;
  if (!status.ok()) return FromGrpcStatus(status);
  return dataset;
}

absl::StatusOr<v1::Dataset> LoraplexClient::UploadDatasetFile(
    const std::string& path, const std::string& display_name,
    const DatasetUploadOptions& upload_options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("dataset file ", path, ": ", std::strerror(errno)));
  }
  // A first pass for the size and digest the server checks the upload
  // against.
  Sha256 digest;
  int64_t total_bytes = 0;
  std::string buffer(kUploadChunkBytes, '\0');
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    digest.Update(absl::string_view(buffer.data(), in.gcount()));
    total_bytes += in.gcount();
  }
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("dataset file ", path, ": read failed"));
  }
  const std::string sha256 = digest.HexDigest();
  // Each try reads the file from its start.
  auto file = std::make_shared<std::ifstream>();
  auto sent = std::make_shared<int64_t>(0);
  return Upload(display_name, total_bytes, sha256, upload_options,
                [&]() -> absl::StatusOr<ChunkSource> {
                  file->close();
                  file->clear();
                  file->open(path, std::ios::binary);
                  *sent = 0;
                  if (!*file) {
                    return absl::NotFoundError(absl::StrCat(
                        "dataset file ", path, ": ", std::strerror(errno)));
                  }
                  return ChunkSource([file, sent, path, total_bytes](
                                         std::string* chunk, bool* done) {
                    chunk->resize(kUploadChunkBytes);
                    file->read(chunk->data(),
                               static_cast<std::streamsize>(chunk->size()));
                    chunk->resize(static_cast<size_t>(file->gcount()));
                    *sent += file->gcount();
                    if (file->bad() || (file->eof() && *sent != total_bytes)) {
                      return absl::DataLossError(absl::StrCat(
                          "dataset file ", path,
                          ": read failed or changed while uploading"));
                    }
                    *done = file->eof();
                    return absl::OkStatus();
                  });
                });
}

absl::StatusOr<v1::Dataset> LoraplexClient::UploadDatasetContents(
    absl::string_view contents, const std::string& display_name,
    const DatasetUploadOptions& upload_options) {
  return Upload(
      display_name, static_cast<int64_t>(contents.size()), Sha256Hex(contents),
      upload_options, [contents]() -> absl::StatusOr<ChunkSource> {
        auto offset = std::make_shared<size_t>(0);
        return ChunkSource([contents, offset](std::string* chunk, bool* done) {
          const size_t size =
              std::min(kUploadChunkBytes, contents.size() - *offset);
          chunk->assign(contents.data() + *offset, size);
          *offset += size;
          *done = *offset >= contents.size();
          return absl::OkStatus();
        });
      });
}

absl::StatusOr<v1::Dataset> LoraplexClient::GetDataset(
    const std::string& name) {
  v1::GetDatasetRequest request;
  request.set_name(name);
  return CallUnary(dataset_stub_.get(), &v1::DatasetService::Stub::GetDataset,
                   request);
}

absl::StatusOr<v1::ListDatasetsResponse> LoraplexClient::ListDatasets(
    const v1::ListDatasetsRequest& request) {
  return CallUnary(dataset_stub_.get(), &v1::DatasetService::Stub::ListDatasets,
                   request);
}

absl::StatusOr<std::vector<v1::Dataset>> LoraplexClient::ListAllDatasets() {
  std::vector<v1::Dataset> all;
  v1::ListDatasetsRequest request;
  request.set_page_size(1000);
  do {
    LORAPLEX_ASSIGN_OR_RETURN(v1::ListDatasetsResponse page,
                              ListDatasets(request));
    for (auto& dataset : *page.mutable_datasets()) {
      all.push_back(std::move(dataset));
    }
    LORAPLEX_RETURN_IF_ERROR(CheckPageTokenAdvanced(
        "ListDatasets", request.page_token(), page.next_page_token()));
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::Status LoraplexClient::DeleteDataset(const std::string& name) {
  v1::DeleteDatasetRequest request;
  request.set_name(name);
  grpc::ClientContext context;
  PrepareContext(&context, options_.timeout);
  v1::DeleteDatasetResponse response;
  return FromGrpcStatus(
      dataset_stub_->DeleteDataset(&context, request, &response));
}

absl::Status LoraplexClient::DeleteJob(const std::string& name) {
  v1::DeleteJobRequest request;
  request.set_name(name);
  return CallUnary(job_stub_.get(), &v1::JobService::Stub::DeleteJob, request)
      .status();
}

absl::Status LoraplexClient::DeleteAdapter(const std::string& name) {
  v1::DeleteAdapterRequest request;
  request.set_name(name);
  return CallUnary(adapter_stub_.get(),
                   &v1::AdapterService::Stub::DeleteAdapter, request)
      .status();
}

absl::StatusOr<v1::Job> LoraplexClient::CreateJob(
    const v1::CreateJobRequest& given) {
  v1::CreateJobRequest request = given;
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  return Retrying<absl::StatusOr<v1::Job>>([&] {
    return CallUnary(job_stub_.get(), &v1::JobService::Stub::CreateJob,
                     request);
  });
}

absl::StatusOr<v1::Job> LoraplexClient::GetJob(const std::string& name) {
  v1::GetJobRequest request;
  request.set_name(name);
  return CallUnary(job_stub_.get(), &v1::JobService::Stub::GetJob, request);
}

absl::StatusOr<v1::ListJobsResponse> LoraplexClient::ListJobs(
    const v1::ListJobsRequest& request) {
  return CallUnary(job_stub_.get(), &v1::JobService::Stub::ListJobs, request);
}

absl::StatusOr<std::vector<v1::Job>> LoraplexClient::ListAllJobs(
    const std::vector<v1::JobStatus>& statuses) {
  std::vector<v1::Job> all;
  v1::ListJobsRequest request;
  request.set_page_size(1000);
  for (v1::JobStatus status : statuses) request.add_statuses(status);
  do {
    LORAPLEX_ASSIGN_OR_RETURN(v1::ListJobsResponse page, ListJobs(request));
    for (auto& job : *page.mutable_jobs()) all.push_back(std::move(job));
    LORAPLEX_RETURN_IF_ERROR(CheckPageTokenAdvanced(
        "ListJobs", request.page_token(), page.next_page_token()));
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::StatusOr<v1::Job> LoraplexClient::CancelJob(const std::string& name) {
  v1::CancelJobRequest request;
  request.set_name(name);
  return CallUnary(job_stub_.get(), &v1::JobService::Stub::CancelJob, request);
}

absl::StatusOr<v1::Job> LoraplexClient::PauseJob(const std::string& name) {
  v1::PauseJobRequest request;
  request.set_name(name);
  return CallUnary(job_stub_.get(), &v1::JobService::Stub::PauseJob, request);
}

absl::StatusOr<v1::Job> LoraplexClient::ResumeJob(const std::string& name) {
  v1::ResumeJobRequest request;
  request.set_name(name);
  return CallUnary(job_stub_.get(), &v1::JobService::Stub::ResumeJob, request);
}

absl::StatusOr<v1::ListCheckpointsResponse> LoraplexClient::ListCheckpoints(
    const std::string& name) {
  v1::ListCheckpointsRequest request;
  request.set_name(name);
  return CallUnary(job_stub_.get(), &v1::JobService::Stub::ListCheckpoints,
                   request);
}

absl::Status LoraplexClient::WatchJob(
    const std::string& name, int64_t after_sequence,
    const std::function<bool(const v1::JobEvent&)>& on_event,
    WatchCancellation* cancellation) {
  grpc::ClientContext context;
  PrepareContext(&context, absl::InfiniteDuration());
  if (cancellation != nullptr && !cancellation->Register(&context)) {
    return absl::CancelledError(
        absl::StrCat("the watch of ", name, " was cancelled"));
  }
  v1::WatchJobRequest request;
  request.set_name(name);
  request.set_after_sequence(after_sequence);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
      job_stub_->WatchJob(&context, request);
  v1::JobEvent event;
  bool stopped = false;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      stopped = true;
      context.TryCancel();
      break;
    }
  }
  grpc::Status status = reader->Finish();
  // Unregistered before `context` goes away, so Cancel() never touches it
  // afterwards.
  if (cancellation != nullptr) {
    cancellation->Unregister(&context);
    if (!stopped && cancellation->cancelled()) {
      return absl::CancelledError(
          absl::StrCat("the watch of ", name, " was cancelled"));
    }
  }
  if (stopped) return absl::OkStatus();
  return FromGrpcStatus(status);
}

absl::StatusOr<v1::ListJobEventsResponse> LoraplexClient::ListJobEvents(
    const v1::ListJobEventsRequest& request) {
  return CallUnary(job_stub_.get(), &v1::JobService::Stub::ListJobEvents,
                   request);
}

absl::StatusOr<std::vector<v1::JobEvent>> LoraplexClient::ListAllJobEvents(
    const std::string& name, int64_t after_sequence) {
  std::vector<v1::JobEvent> all;
  v1::ListJobEventsRequest request;
  request.set_name(name);
  request.set_after_sequence(after_sequence);
  request.set_page_size(1000);
  do {
    LORAPLEX_ASSIGN_OR_RETURN(v1::ListJobEventsResponse page,
                              ListJobEvents(request));
    for (auto& event : *page.mutable_events()) all.push_back(std::move(event));
    LORAPLEX_RETURN_IF_ERROR(CheckPageTokenAdvanced(
        "ListJobEvents", request.page_token(), page.next_page_token()));
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::StatusOr<v1::AttachAdapterResponse> LoraplexClient::AttachAdapter(
    const v1::AttachAdapterRequest& given) {
  v1::AttachAdapterRequest request = given;
  if (request.request_id().empty() && request.job().request_id().empty()) {
    request.set_request_id(NewRequestId());
  }
  // Uploading the adapter's files may take as long as a dataset upload.
  return Retrying<absl::StatusOr<v1::AttachAdapterResponse>>([&] {
    return CallUnary(
        adapter_stub_.get(), &v1::AdapterService::Stub::AttachAdapter, request,
        request.has_files()
            ? std::optional<absl::Duration>(options_.transfer_timeout)
            : std::nullopt);
  });
}

absl::StatusOr<v1::RetireAdapterResponse> LoraplexClient::RetireAdapter(
    const std::string& job) {
  v1::RetireAdapterRequest request;
  request.set_job(job);
  return CallUnary(adapter_stub_.get(),
                   &v1::AdapterService::Stub::RetireAdapter, request);
}

absl::StatusOr<std::vector<ExportedFile>> LoraplexClient::ExportAdapter(
    const v1::ExportAdapterRequest& request, const std::string& out_dir) {
  std::error_code error;
  const bool existed = std::filesystem::exists(out_dir, error);
  std::filesystem::create_directories(out_dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "export directory ", out_dir, ": cannot create: ", error.message()));
  }
  absl::StatusOr<std::vector<ExportedFile>> files =
      ReceiveExport(request, out_dir);
  // remove() only deletes an empty directory: never the user's files.
  if (!files.ok() && !existed) std::filesystem::remove(out_dir, error);
  return files;
}

absl::StatusOr<std::vector<ExportedFile>> LoraplexClient::ReceiveExport(
    const v1::ExportAdapterRequest& request, const std::string& out_dir) {
  grpc::ClientContext context;
  PrepareContext(&context, options_.transfer_timeout);
  std::unique_ptr<grpc::ClientReader<v1::ExportAdapterChunk>> reader =
      adapter_stub_->ExportAdapter(&context, request);

  std::vector<ExportedFile> written;
  // The complete files of `written`, renamed into place only once all
  // arrived: a failed export never mixes new files with old ones.
  std::vector<std::unique_ptr<AtomicFileWriter>> complete;
  std::set<std::string> seen_names;
  std::unique_ptr<AtomicFileWriter> file;  // The file being received.
  ExportedFile current;
  int64_t received = 0;
  // Checks the file being received is complete and sets it aside.
  auto finish_file = [&]() -> absl::Status {
    if (file == nullptr) return absl::OkStatus();
    if (received != current.size_bytes) {
      return absl::DataLossError(absl::StrCat("export: ", current.file_name,
                                              " announced ", current.size_bytes,
                                              " bytes, received ", received));
    }
    complete.push_back(std::move(file));
    written.push_back(current);
    return absl::OkStatus();
  };
  // Handles one chunk; an error stops the stream.
  auto take_chunk = [&](const v1::ExportAdapterChunk& chunk) -> absl::Status {
    if (!chunk.file_name().empty()) {
      LORAPLEX_RETURN_IF_ERROR(finish_file());
      const std::string problem = ExportFileNameProblem(chunk.file_name());
      if (!problem.empty()) {
        return absl::InternalError(
            absl::StrCat("export: server sent file_name \"", chunk.file_name(),
                         "\" that ", problem));
      }
      if (!seen_names.insert(chunk.file_name()).second) {
        return absl::InternalError(absl::StrCat(
            "export: server sent file_name \"", chunk.file_name(), "\" twice"));
      }
      if (chunk.file_size() < 0) {
        return absl::InternalError(absl::StrCat("export: ", chunk.file_name(),
                                                " has negative file_size ",
                                                chunk.file_size()));
      }
      current.file_name = chunk.file_name();
      current.path =
          (std::filesystem::path(out_dir) / chunk.file_name()).string();
      current.size_bytes = chunk.file_size();
      received = 0;
      LORAPLEX_ASSIGN_OR_RETURN(file, AtomicFileWriter::Create(current.path));
    } else if (file == nullptr) {
      return absl::InternalError("export: the first chunk has no file_name");
    }
    received += static_cast<int64_t>(chunk.data().size());
    if (received > current.size_bytes) {
      return absl::DataLossError(absl::StrCat("export: ", current.file_name,
                                              " announced ", current.size_bytes,
                                              " bytes, received more"));
    }
    return file->Append(chunk.data().data(), chunk.data().size());
  };

  v1::ExportAdapterChunk chunk;
  absl::Status local_status;
  while (reader->Read(&chunk)) {
    local_status = take_chunk(chunk);
    if (!local_status.ok()) {
      context.TryCancel();
      break;
    }
  }
  grpc::Status status = reader->Finish();
  if (!local_status.ok()) return local_status;
  if (!status.ok()) return FromGrpcStatus(status);
  LORAPLEX_RETURN_IF_ERROR(finish_file());
  if (written.empty()) {
    return absl::InternalError("export: the server sent no files");
  }
  for (std::unique_ptr<AtomicFileWriter>& complete_file : complete) {
    LORAPLEX_RETURN_IF_ERROR(complete_file->Commit());
  }
  return written;
}

absl::StatusOr<v1::Adapter> LoraplexClient::GetAdapter(
    const std::string& name) {
  v1::GetAdapterRequest request;
  request.set_name(name);
  return CallUnary(adapter_stub_.get(), &v1::AdapterService::Stub::GetAdapter,
                   request);
}

absl::StatusOr<v1::ListAdaptersResponse> LoraplexClient::ListAdapters(
    const v1::ListAdaptersRequest& request) {
  return CallUnary(adapter_stub_.get(), &v1::AdapterService::Stub::ListAdapters,
                   request);
}

absl::StatusOr<std::vector<v1::Adapter>> LoraplexClient::ListAllAdapters() {
  std::vector<v1::Adapter> all;
  v1::ListAdaptersRequest request;
  request.set_page_size(1000);
  do {
    LORAPLEX_ASSIGN_OR_RETURN(v1::ListAdaptersResponse page,
                              ListAdapters(request));
    for (auto& adapter : *page.mutable_adapters()) {
      all.push_back(std::move(adapter));
    }
    LORAPLEX_RETURN_IF_ERROR(CheckPageTokenAdvanced(
        "ListAdapters", request.page_token(), page.next_page_token()));
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::StatusOr<v1::ListSlotsResponse> LoraplexClient::ListSlots() {
  v1::ListSlotsRequest request;
  return CallUnary(adapter_stub_.get(), &v1::AdapterService::Stub::ListSlots,
                   request);
}

absl::StatusOr<v1::SampleResponse> LoraplexClient::Sample(
    const v1::SampleRequest& request) {
  return CallUnary(sampling_stub_.get(), &v1::SamplingService::Stub::Sample,
                   request, options_.transfer_timeout);
}

absl::StatusOr<v1::Session> LoraplexClient::CreateSession(
    const v1::CreateSessionRequest& request) {
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::CreateSession, request,
                   options_.transfer_timeout);
}

absl::StatusOr<v1::Session> LoraplexClient::GetSession(
    const std::string& name) {
  v1::GetSessionRequest request;
  request.set_name(name);
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::GetSession, request);
}

absl::StatusOr<v1::ListSessionsResponse> LoraplexClient::ListSessions() {
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::ListSessions,
                   v1::ListSessionsRequest());
}

absl::StatusOr<v1::SessionResult> LoraplexClient::ForwardBackward(
    const v1::ForwardBackwardRequest& request) {
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::ForwardBackward, request,
                   options_.transfer_timeout);
}

absl::StatusOr<v1::SessionResult> LoraplexClient::OptimStep(
    const v1::OptimStepRequest& request) {
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::OptimStep, request,
                   options_.transfer_timeout);
}

absl::StatusOr<v1::SessionResult> LoraplexClient::SaveWeightsForSampler(
    const v1::SaveWeightsForSamplerRequest& request) {
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::SaveWeightsForSampler,
                   request, options_.transfer_timeout);
}

absl::StatusOr<v1::SessionResult> LoraplexClient::SaveState(
    const v1::SaveStateRequest& request) {
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::SaveState, request,
                   options_.transfer_timeout);
}

absl::StatusOr<v1::SessionResult> LoraplexClient::LoadState(
    const v1::LoadStateRequest& request) {
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::LoadState, request,
                   options_.transfer_timeout);
}

absl::StatusOr<v1::RetrieveResultResponse> LoraplexClient::RetrieveResult(
    const v1::RetrieveResultRequest& request) {
  const int64_t wait_ms =
      request.timeout_ms() == 0 ? 30000 : request.timeout_ms();
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::RetrieveResult, request,
                   options_.timeout + absl::Milliseconds(wait_ms));
}

absl::StatusOr<v1::Session> LoraplexClient::CloseSession(
    const std::string& name) {
  v1::CloseSessionRequest request;
  request.set_name(name);
  return CallUnary(session_stub_.get(),
                   &v1::TrainingSessionService::Stub::CloseSession, request,
                   options_.transfer_timeout);
}

absl::StatusOr<v1::SampleResponse> LoraplexClient::StreamSample(
    const v1::SampleRequest& request,
    const std::function<bool(const v1::SampledToken&)>& on_token) {
  grpc::ClientContext context;
  PrepareContext(&context, options_.transfer_timeout);
  std::unique_ptr<grpc::ClientReader<v1::SampleStreamChunk>> reader =
      sampling_stub_->StreamSample(&context, request);
  v1::SampleStreamChunk chunk;
  std::optional<v1::SampleResponse> response;
  bool stopped = false;
  while (reader->Read(&chunk)) {
    if (chunk.has_response()) {
      response = std::move(*chunk.mutable_response());
    } else if (chunk.has_token() && !on_token(chunk.token())) {
      stopped = true;
      context.TryCancel();
      break;
    }
  }
  grpc::Status status = reader->Finish();
  if (stopped) return absl::CancelledError("the sample was cancelled");
  LORAPLEX_RETURN_IF_ERROR(FromGrpcStatus(status));
  if (!response.has_value()) {
    return absl::InternalError("the sample stream ended without a response");
  }
  return *std::move(response);
}

}  // namespace loraplex
