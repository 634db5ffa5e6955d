#include "server/sessions/session_service.h"

#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/resource_names.h"
#include "core/common/status_macros.h"
#include "core/lora/lora_config.h"
#include "server/grpc/proto_convert.h"

namespace loraplex {
namespace {

v1::OptimizerFamily FamilyToProto(OptimizerFamily family) {
  switch (family) {
    case OptimizerFamily::kAdamW:
      return v1::OPTIMIZER_FAMILY_ADAMW;
    case OptimizerFamily::kAdam:
      return v1::OPTIMIZER_FAMILY_ADAM;
    case OptimizerFamily::kMuon:
      return v1::OPTIMIZER_FAMILY_MUON;
    case OptimizerFamily::kLion:
      return v1::OPTIMIZER_FAMILY_LION;
    case OptimizerFamily::kSoap:
      return v1::OPTIMIZER_FAMILY_SOAP;
  }
  return v1::OPTIMIZER_FAMILY_UNSPECIFIED;
}

v1::SessionState SessionStateToProto(SessionState state) {
  switch (state) {
    case SessionState::kOpening:
      return v1::SESSION_STATE_OPENING;
    case SessionState::kOpen:
      return v1::SESSION_STATE_OPEN;
    case SessionState::kClosing:
      return v1::SESSION_STATE_CLOSING;
    case SessionState::kClosed:
      return v1::SESSION_STATE_CLOSED;
  }
  return v1::SESSION_STATE_UNSPECIFIED;
}

void SessionToProto(const SessionInfo& info, v1::Session* session) {
  session->set_name(FormatResourceName(kSessions, info.id));
  session->set_display_name(info.spec.display_name);
  session->set_state(SessionStateToProto(info.state));
  session->set_slot(info.slot);
  LoraConfigToProto(info.spec.lora, session->mutable_lora());
  session->set_family(FamilyToProto(info.spec.optimizer.family));
  session->set_steps(info.steps);
  session->set_next_seq_id(info.next_seq_id);
  TimestampFromMillis(info.create_time_ms, session->mutable_create_time());
  TimestampFromMillis(info.last_activity_ms,
                      session->mutable_last_activity_time());
  if (!info.idle_state.empty()) {
    session->set_idle_state(
        FormatResourceName(kSessionStates, info.idle_state));
  }
}

// Finishes `reactor` with the session `info`, or its error.
std::function<void(absl::StatusOr<SessionInfo>)> FinishWithSession(
    grpc::ServerUnaryReactor* reactor, v1::Session* response) {
  return [reactor, response](absl::StatusOr<SessionInfo> info) {
    if (info.ok()) SessionToProto(*info, response);
    reactor->Finish(ToGrpcStatus(info.status()));
  };
}

template <typename T>
std::vector<double> Doubles(const google::protobuf::RepeatedField<T>& values) {
  return std::vector<double>(values.begin(), values.end());
}

absl::StatusOr<std::string> SessionId(const std::string& name) {
  return ParseResourceName(name, kSessions, "session");
}

// A save (of weights for the sampler, or of the state) named
// `display_name`.
absl::StatusOr<SessionRequest> NamedSave(SessionOp::Kind kind,
                                         const std::string& display_name) {
  LORAPLEX_RETURN_IF_ERROR(CheckDisplayName(display_name, "display_name"));
  SessionRequest save;
  save.kind = kind;
  save.display_name = display_name;
  return save;
}

}  // namespace

ForwardBackwardInput ForwardBackwardInputOf(
    const v1::ForwardBackwardRequest& request) {
  ForwardBackwardInput native;
  native.loss_fn = request.loss_fn();
  native.loss_fn_config.insert(request.loss_fn_config().begin(),
                               request.loss_fn_config().end());
  native.forward_only = request.forward_only();
  native.data.reserve(request.data_size());
  for (const v1::Datum& d : request.data()) {
    Datum datum;
    datum.input_ids.assign(d.input_ids().begin(), d.input_ids().end());
    datum.target_tokens.assign(d.target_tokens().begin(),
                               d.target_tokens().end());
    datum.targets_per_position =
        d.targets_per_position() == 0 ? 1 : d.targets_per_position();
    datum.weights = Doubles(d.weights());
    datum.sampler_logprobs = Doubles(d.logprobs());
    datum.advantages = Doubles(d.advantages());
    native.data.push_back(std::move(datum));
  }
  return native;
}

void SessionResultToProto(const SessionResult& result,
                          v1::SessionResult* proto) {
  proto->set_seq_id(result.seq_id);
  switch (result.kind) {
    case SessionOp::Kind::kForwardBackward:
    case SessionOp::Kind::kForward: {
      const ForwardBackwardOutput& out = result.result.forward_backward;
      v1::ForwardBackwardOutput* fb = proto->mutable_forward_backward();
      for (const std::vector<double>& logprobs : out.logprobs) {
        fb->add_outputs()->mutable_logprobs()->Assign(logprobs.begin(),
                                                      logprobs.end());
      }
      fb->set_loss(out.loss);
      (*fb->mutable_metrics())["loss:sum"] = out.loss;
      fb->set_tokens(out.tokens);
      break;
    }
    case SessionOp::Kind::kOptimStep: {
      const SlotStepMetrics& step = result.result.step;
      v1::OptimStepOutput* out = proto->mutable_optim_step();
      out->set_lr(step.lr);
      out->set_grad_norm(step.grad_norm);
      out->set_skipped(step.skipped);
      out->set_skip_reason(step.skip_reason);
      out->set_steps(result.result.steps);
      break;
    }
    case SessionOp::Kind::kSaveWeights: {
      v1::SavedWeights* saved = proto->mutable_saved_weights();
      saved->set_adapter(FormatResourceName(kAdapters, result.adapter_id));
      saved->set_steps(result.result.steps);
      break;
    }
    case SessionOp::Kind::kSaveState: {
      v1::SavedState* saved = proto->mutable_saved_state();
      saved->set_state(FormatResourceName(kSessionStates, result.state_id));
      saved->set_steps(result.result.steps);
      break;
    }
    case SessionOp::Kind::kLoadState:
      proto->mutable_loaded_state()->set_steps(result.result.steps);
      break;
    case SessionOp::Kind::kClose:
      break;
  }
}

SessionServiceImpl::SessionServiceImpl(const ServiceContext* context)
    : context_(context) {}

grpc::ServerUnaryReactor* SessionServiceImpl::CreateSession(
    grpc::CallbackServerContext* call, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  absl::StatusOr<std::string> tenant = Authenticate(*context_, call);
  auto spec = [&]() -> absl::StatusOr<SessionSpec> {
    if (!request->base_model().empty() &&
        request->base_model() != context_->base_model_name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "base_model: this server trains on \"", context_->base_model_name,
          "\" (", request->base_model().size(), " bytes given)"));
    }
    LORAPLEX_RETURN_IF_ERROR(
        CheckDisplayName(request->display_name(), "display_name"));
    if (!request->from_state().empty()) {
      if (request->has_lora() || request->has_optimizer() ||
          request->seed() != 0) {
        return absl::InvalidArgumentError(
            "lora, optimizer and seed come from from_state: leave them unset");
      }
      LORAPLEX_ASSIGN_OR_RETURN(
          std::string state_id,
          ParseResourceName(request->from_state(), kSessionStates,
                            "from_state"));
      LORAPLEX_ASSIGN_OR_RETURN(
          SessionSpec spec, context_->sessions->StateSpec(*tenant, state_id));
      spec.display_name = request->display_name();
      spec.with_optimizer = request->with_optimizer();
      return spec;
    }
    if (request->with_optimizer()) {
      return absl::InvalidArgumentError(
          "with_optimizer is for a session from_state");
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        JobSpec job, JobSpecFromProto(request->lora(), request->optimizer(),
                                      v1::LrSchedule(), v1::TrainingConfig()));
    if (job.lora.rank > context_->limits.max_rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora.rank must be at most this server's max_rank ",
                       context_->limits.max_rank, ", got ", job.lora.rank));
    }
    // As at CreateJob: a fused layout adapts its parts together, adapted
    // experts take no dropout.
    LORAPLEX_RETURN_IF_ERROR(
        FitLoraTargets(context_->model, job.lora.targets, job.lora.dropout)
            .status());
    SessionSpec spec;
    spec.display_name = request->display_name();
    spec.lora = job.lora;
    spec.optimizer = job.optimizer;
    spec.seed = request->seed();
    return spec;
  };
  absl::StatusOr<SessionSpec> checked =
      tenant.ok() ? spec() : absl::StatusOr<SessionSpec>(tenant.status());
  if (!checked.ok()) {
    reactor->Finish(ToGrpcStatus(checked.status()));
    return reactor;
  }
  context_->sessions->Create(*tenant, *std::move(checked),
                             FinishWithSession(reactor, response));
  return reactor;
}

grpc::ServerUnaryReactor* SessionServiceImpl::GetSession(
    grpc::CallbackServerContext* call, const v1::GetSessionRequest* request,
    v1::Session* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    LORAPLEX_ASSIGN_OR_RETURN(std::string id, SessionId(request->name()));
    LORAPLEX_ASSIGN_OR_RETURN(SessionInfo info,
                              context_->sessions->Get(tenant, id));
    SessionToProto(info, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* SessionServiceImpl::ListSessions(
    grpc::CallbackServerContext* call,
    const v1::ListSessionsRequest* /*request*/,
    v1::ListSessionsResponse* response) {
  return FinishUnary(call, [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
                              Authenticate(*context_, call));
    for (const SessionInfo& info : context_->sessions->List(tenant)) {
      SessionToProto(info, response->add_sessions());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* SessionServiceImpl::Submit(
    grpc::CallbackServerContext* call, const std::string& session,
    int64_t seq_id, absl::StatusOr<SessionRequest> request,
    v1::SessionResult* response) {
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  absl::StatusOr<std::string> tenant = Authenticate(*context_, call);
  absl::StatusOr<std::string> id = SessionId(session);
  absl::Status status = !tenant.ok() ? tenant.status()
                        : !id.ok()   ? id.status()
                                     : request.status();
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  context_->sessions->Submit(
      *tenant, *id, seq_id, *std::move(request),
      [reactor, response](absl::StatusOr<SessionResult> result) {
        if (result.ok()) SessionResultToProto(*result, response);
        reactor->Finish(ToGrpcStatus(result.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* SessionServiceImpl::ForwardBackward(
    grpc::CallbackServerContext* call,
    const v1::ForwardBackwardRequest* request, v1::SessionResult* response) {
  return Submit(
      call, request->session(), request->seq_id(),
      SessionForwardBackwardOf(*context_, ForwardBackwardInputOf(*request)),
      response);
}

grpc::ServerUnaryReactor* SessionServiceImpl::OptimStep(
    grpc::CallbackServerContext* call, const v1::OptimStepRequest* request,
    v1::SessionResult* response) {
  SessionRequest native;
  native.kind = SessionOp::Kind::kOptimStep;
  OptimStepParams& step = native.step;
  if (request->has_lr()) step.lr = request->lr();
  if (request->has_beta1()) step.beta1 = request->beta1();
  if (request->has_beta2()) step.beta2 = request->beta2();
  if (request->has_eps()) step.eps = request->eps();
  if (request->has_weight_decay()) step.weight_decay = request->weight_decay();
  if (request->has_momentum()) step.momentum = request->momentum();
  if (request->has_lion_beta1()) step.lion_beta1 = request->lion_beta1();
  if (request->has_lion_beta2()) step.lion_beta2 = request->lion_beta2();
  if (request->has_soap_beta1()) step.soap_beta1 = request->soap_beta1();
  if (request->has_soap_beta2()) step.soap_beta2 = request->soap_beta2();
  if (request->has_shampoo_beta()) step.shampoo_beta = request->shampoo_beta();
  if (request->has_precondition_frequency()) {
    step.precondition_frequency = request->precondition_frequency();
  }
  if (request->has_power_iter_steps()) {
    step.power_iter_steps = request->power_iter_steps();
  }
  if (request->has_use_eigh()) step.use_eigh = request->use_eigh();
  if (request->has_max_update_rms()) {
    step.max_update_rms = request->max_update_rms();
  }
  if (request->has_max_precond_dim()) {
    step.max_precond_dim = request->max_precond_dim();
  }
  step.grad_clip = request->grad_clip_norm();
  return Submit(call, request->session(), request->seq_id(), std::move(native),
                response);
}

grpc::ServerUnaryReactor* SessionServiceImpl::SaveWeightsForSampler(
    grpc::CallbackServerContext* call,
    const v1::SaveWeightsForSamplerRequest* request,
    v1::SessionResult* response) {
  return Submit(
      call, request->session(), request->seq_id(),
      NamedSave(SessionOp::Kind::kSaveWeights, request->display_name()),
      response);
}

grpc::ServerUnaryReactor* SessionServiceImpl::SaveState(
    grpc::CallbackServerContext* call, const v1::SaveStateRequest* request,
    v1::SessionResult* response) {
  return Submit(call, request->session(), request->seq_id(),
                NamedSave(SessionOp::Kind::kSaveState, request->display_name()),
                response);
}

grpc::ServerUnaryReactor* SessionServiceImpl::LoadState(
    grpc::CallbackServerContext* call, const v1::LoadStateRequest* request,
    v1::SessionResult* response) {
  absl::StatusOr<SessionRequest> native =
      [&]() -> absl::StatusOr<SessionRequest> {
    SessionRequest load;
    load.kind = SessionOp::Kind::kLoadState;
    LORAPLEX_ASSIGN_OR_RETURN(
        load.state,
        ParseResourceName(request->state(), kSessionStates, "state"));
    load.with_optimizer = request->with_optimizer();
    return load;
  }();
  return Submit(call, request->session(), request->seq_id(), std::move(native),
                response);
}

grpc::ServerUnaryReactor* SessionServiceImpl::RetrieveResult(
    grpc::CallbackServerContext* call, const v1::RetrieveResultRequest* request,
    v1::RetrieveResultResponse* response) {
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  absl::StatusOr<std::string> tenant = Authenticate(*context_, call);
  absl::StatusOr<std::string> id = SessionId(request->session());
  absl::Status status = !tenant.ok() ? tenant.status() : id.status();
  if (status.ok() &&
      (request->timeout_ms() < 0 || request->timeout_ms() > 30000)) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "timeout_ms must be in [0, 30000], got ", request->timeout_ms()));
  }
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  const std::chrono::milliseconds wait(
      request->timeout_ms() == 0 ? 30000 : request->timeout_ms());
  context_->sessions->Retrieve(
      *tenant, *id, request->seq_id(), wait,
      [reactor, response](absl::StatusOr<std::optional<SessionResult>> result) {
        if (result.ok()) {
          response->set_done(result->has_value());
          if (result->has_value()) {
            SessionResultToProto(**result, response->mutable_result());
          }
        }
        reactor->Finish(ToGrpcStatus(result.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* SessionServiceImpl::CloseSession(
    grpc::CallbackServerContext* call, const v1::CloseSessionRequest* request,
    v1::Session* response) {
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  absl::StatusOr<std::string> tenant = Authenticate(*context_, call);
  absl::StatusOr<std::string> id = SessionId(request->name());
  absl::Status status = !tenant.ok() ? tenant.status() : id.status();
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  context_->sessions->Close(*tenant, *id, FinishWithSession(reactor, response));
  return reactor;
}

}  // namespace loraplex
