// DatasetService: JSONL uploads, validated in full before they are stored
// (state dir datasets/<id>.jsonl plus a store record), and their listing.
#ifndef LORAPLEX_SERVER_GRPC_DATASET_SERVICE_H_
#define LORAPLEX_SERVER_GRPC_DATASET_SERVICE_H_

#include "loraplex/v1/datasets.grpc.pb.h"
#include "server/grpc/unary_calls.h"

namespace loraplex {

// UploadDataset reads raw messages (UploadDatasetRequest, each parsed by
// the handler) and answers a serialized Dataset: only so can it tell a
// message that does not parse from the end of the stream.
class DatasetServiceImpl final
    : public v1::DatasetService::WithRawCallbackMethod_UploadDataset<
          v1::DatasetService::CallbackService> {
 public:
  explicit DatasetServiceImpl(const ServiceContext* context)
      : context_(context) {}

  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadDataset(
      grpc::CallbackServerContext* call, grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetDataset(grpc::CallbackServerContext* call,
                                       const v1::GetDatasetRequest* request,
                                       v1::Dataset* response) override;
  grpc::ServerUnaryReactor* ListDatasets(
      grpc::CallbackServerContext* call, const v1::ListDatasetsRequest* request,
      v1::ListDatasetsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteDataset(
      grpc::CallbackServerContext* call,
      const v1::DeleteDatasetRequest* request,
      v1::DeleteDatasetResponse* response) override;

 private:
  const ServiceContext* context_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_DATASET_SERVICE_H_
