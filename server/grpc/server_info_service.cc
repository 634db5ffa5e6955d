#include "server/grpc/server_info_service.h"

#include <string>

#include "core/common/status_macros.h"
#include "server/grpc/proto_convert.h"

namespace loraplex {
grpc::ServerUnaryReactor* ServerInfoServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* call,
    const v1::GetServerInfoRequest* /*request*/, v1::ServerInfo* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    const ModelConfig& model = context_->model;
    v1::BaseModel* base = response->mutable_base_model();
    base->set_name(context_->base_model_name);
    base->set_family(model.model_type);
    base->set_vocab_size(model.vocab_size);
    base->set_hidden_size(model.hidden_size);
    base->set_intermediate_size(model.intermediate_size);
    base->set_num_hidden_layers(model.num_hidden_layers);
    base->set_num_attention_heads(model.num_attention_heads);
    base->set_num_key_value_heads(model.num_key_value_heads);
    base->set_max_position_embeddings(model.max_position_embeddings);
    base->set_dtype(std::string(StoredDtypeName(model.dtype)));
    response->set_version(context_->version);
    response->set_slot_capacity(context_->limits.slot_capacity);
    response->set_max_rank(context_->limits.max_rank);
    response->set_slots_per_tenant(context_->limits.slots_per_tenant);
    response->set_device(context_->device);
    response->set_max_dataset_bytes(context_->limits.max_dataset_bytes);
    response->set_tenant(tenant);
    *response->mutable_runtime() = RuntimeProto(context_->runtime);
    return absl::OkStatus();
  });
}

}  // namespace loraplex
