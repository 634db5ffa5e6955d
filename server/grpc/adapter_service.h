// AdapterService: attach an uploaded or stored PEFT adapter through a new
// job, retire a running job's slot, export adapters as PEFT files, and
// list adapters and slots.
#ifndef LORAPLEX_SERVER_GRPC_ADAPTER_SERVICE_H_
#define LORAPLEX_SERVER_GRPC_ADAPTER_SERVICE_H_

#include "loraplex/v1/adapters.grpc.pb.h"
#include "server/grpc/unary_calls.h"

namespace loraplex {

class AdapterServiceImpl final : public v1::AdapterService::CallbackService {
 public:
  explicit AdapterServiceImpl(const ServiceContext* context)
      : context_(context) {}

  grpc::ServerUnaryReactor* AttachAdapter(
      grpc::CallbackServerContext* call,
      const v1::AttachAdapterRequest* request,
      v1::AttachAdapterResponse* response) override;
  grpc::ServerUnaryReactor* RetireAdapter(
      grpc::CallbackServerContext* call,
      const v1::RetireAdapterRequest* request,
      v1::RetireAdapterResponse* response) override;
  grpc::ServerWriteReactor<v1::ExportAdapterChunk>* ExportAdapter(
      grpc::CallbackServerContext* call,
      const v1::ExportAdapterRequest* request) override;
  grpc::ServerUnaryReactor* GetAdapter(grpc::CallbackServerContext* call,
                                       const v1::GetAdapterRequest* request,
                                       v1::Adapter* response) override;
  grpc::ServerUnaryReactor* ListAdapters(
      grpc::CallbackServerContext* call, const v1::ListAdaptersRequest* request,
      v1::ListAdaptersResponse* response) override;
  grpc::ServerUnaryReactor* ListSlots(grpc::CallbackServerContext* call,
                                      const v1::ListSlotsRequest* request,
                                      v1::ListSlotsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteAdapter(
      grpc::CallbackServerContext* call,
      const v1::DeleteAdapterRequest* request,
      v1::DeleteAdapterResponse* response) override;

 private:
  // AttachAdapter's work, on a worker thread.
  absl::Status Attach(const std::string& tenant,
                      const v1::AttachAdapterRequest& request,
                      v1::AttachAdapterResponse* response);

  const ServiceContext* context_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_ADAPTER_SERVICE_H_
