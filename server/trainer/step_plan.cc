#include "server/trainer/step_plan.h"

#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/optim/config_json.h"

namespace loraplex {
namespace {

using Json = nlohmann::json;

// json as a T, or std::invalid_argument naming `what` (a float or an
// integer out of T's range would be undefined behaviour to convert).
template <typename T>
T Integer(const Json& json, const char* what) {
  if (json.is_number_unsigned()) {
    const uint64_t value = json.get<uint64_t>();
    if (value <= static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return static_cast<T>(value);
    }
  } else if (json.is_number_integer()) {
    const int64_t value = json.get<int64_t>();
    if (value >= 0 || std::numeric_limits<T>::is_signed) {
      if (static_cast<int64_t>(std::numeric_limits<T>::min()) <= value &&
          (value < 0 ||
           static_cast<uint64_t>(value) <=
               static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
        return static_cast<T>(value);
      }
    }
  }
  throw std::invalid_argument(
      absl::StrCat(what, " must be an integer in range, got ", json.dump()));
}

template <typename T>
Json Bytes(const T* data, size_t count) {
  Json::binary_t bytes(std::vector<uint8_t>(count * sizeof(T)));
  if (count > 0) std::memcpy(bytes.data(), data, count * sizeof(T));
  return Json::binary(std::move(bytes));
}

template <typename T>
std::vector<T> FromBytes(const Json& json, const char* what) {
  const Json::binary_t& bytes = json.get_binary();
  if (bytes.size() % sizeof(T) != 0) {
    throw std::invalid_argument(absl::StrCat(
        what, " has ", bytes.size(), " bytes, not a multiple of ", sizeof(T)));
  }
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// The sequences as three byte strings: lengths, token ids, loss masks.
Json SequencesToJson(const SequenceSet& data) {
  std::vector<int64_t> lengths;
  std::vector<int64_t> ids;
  std::vector<uint8_t> masks;
  for (const Sequence& sequence : data.sequences) {
    lengths.push_back(static_cast<int64_t>(sequence.input_ids.size()));
    ids.insert(ids.end(), sequence.input_ids.begin(), sequence.input_ids.end());
    masks.insert(masks.end(), sequence.loss_mask.begin(),
                 sequence.loss_mask.end());
  }
  return {{"lengths", Bytes(lengths.data(), lengths.size())},
          {"ids", Bytes(ids.data(), ids.size())},
          {"masks", Bytes(masks.data(), masks.size())},
          {"truncated", data.truncated_examples},
          {"dropped", data.dropped_examples},
          {"targets", data.num_target_tokens}};
}

SequenceSet SequencesFromJson(const Json& json) {
  const std::vector<int64_t> lengths =
      FromBytes<int64_t>(json.at("lengths"), "lengths");
  const std::vector<int64_t> ids = FromBytes<int64_t>(json.at("ids"), "ids");
  const std::vector<uint8_t> masks =
      FromBytes<uint8_t>(json.at("masks"), "masks");
  if (ids.size() != masks.size()) {
    throw std::invalid_argument("token ids and loss masks differ in length");
  }
  SequenceSet data;
  size_t at = 0;
  for (int64_t length : lengths) {
    if (length < 0 || static_cast<size_t>(length) > ids.size() - at) {
      throw std::invalid_argument("sequence lengths exceed the token ids");
    }
    Sequence sequence;
    sequence.input_ids.assign(ids.begin() + at, ids.begin() + at + length);
    sequence.loss_mask.assign(masks.begin() + at, masks.begin() + at + length);
    data.sequences.push_back(std::move(sequence));
    at += static_cast<size_t>(length);
  }
  if (at != ids.size()) {
    throw std::invalid_argument("token ids left over after the sequences");
  }
  data.truncated_examples = Integer<int64_t>(json.at("truncated"), "truncated");
  data.dropped_examples = Integer<int64_t>(json.at("dropped"), "dropped");
  data.num_target_tokens = Integer<int64_t>(json.at("targets"), "targets");
  return data;
}

// A state's parts that travel (session_state_files.h): its optimizer state
// and meta.
Json SavedStateToJson(const SavedSessionState& state) {
  return {{"optimizer", Bytes(state.optimizer.data(), state.optimizer.size())},
          {"meta", state.meta}};
}

SavedSessionState SavedStateFromJson(const Json& json) {
  SavedSessionState state;
  const Json::binary_t& optimizer = json.at("optimizer").get_binary();
  state.optimizer.assign(optimizer.begin(), optimizer.end());
  state.meta = json.at("meta").get<std::string>();
  return state;
}

Json DataToJson(const std::vector<Datum>& data) {
  Json json = Json::array();
  for (const Datum& datum : data) {
    json.push_back(
        {{"input_ids", Bytes(datum.input_ids.data(), datum.input_ids.size())},
         {"target_tokens",
          Bytes(datum.target_tokens.data(), datum.target_tokens.size())},
         {"k", datum.targets_per_position},
         {"weights", Bytes(datum.weights.data(), datum.weights.size())},
         {"sampler_logprobs",
          Bytes(datum.sampler_logprobs.data(), datum.sampler_logprobs.size())},
         {"advantages",
          Bytes(datum.advantages.data(), datum.advantages.size())}});
  }
  return json;
}

std::vector<Datum> DataFromJson(const Json& json) {
  std::vector<Datum> data;
  for (const Json& item : json) {
    Datum datum;
    datum.input_ids = FromBytes<int64_t>(item.at("input_ids"), "input_ids");
    datum.target_tokens =
        FromBytes<int64_t>(item.at("target_tokens"), "target_tokens");
    datum.targets_per_position = Integer<int64_t>(item.at("k"), "k");
    datum.weights = FromBytes<double>(item.at("weights"), "weights");
    datum.sampler_logprobs =
        FromBytes<double>(item.at("sampler_logprobs"), "sampler_logprobs");
    datum.advantages = FromBytes<double>(item.at("advantages"), "advantages");
    data.push_back(std::move(datum));
  }
  return data;
}

Json SessionStepToJson(const StepPlan::SessionStep& step) {
  const SessionOp& op = step.op;
  Json json = {{"slot", step.slot},
               {"kind", static_cast<int>(op.kind)},
               {"session_id", op.session_id},
               {"seq_id", op.seq_id},
               {"loss",
                {static_cast<int>(op.loss.fn), op.loss.clip_low,
                 op.loss.clip_high, op.loss.beta}},
               {"step", OptimizerConfigToJson(op.step)},
               {"grad_clip", op.grad_clip},
               {"with_optimizer", op.with_optimizer}};
  json["data"] = op.data ? DataToJson(*op.data) : Json();
  if (step.state) json["state"] = SavedStateToJson(*step.state);
  return json;
}

// Throws for a malformed step (caught by DecodeStepPlan).
absl::StatusOr<StepPlan::SessionStep> SessionStepFromJson(const Json& json) {
  StepPlan::SessionStep step;
  step.slot = Integer<int>(json.at("slot"), "slot");
  SessionOp& op = step.op;
  const int kind = Integer<int>(json.at("kind"), "kind");
  if (kind < 0 || kind > static_cast<int>(SessionOp::Kind::kClose)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown session operation ", kind));
  }
  op.kind = static_cast<SessionOp::Kind>(kind);
  op.session_id = json.at("session_id").get<std::string>();
  op.seq_id = Integer<int64_t>(json.at("seq_id"), "seq_id");
  const Json& loss = json.at("loss");
  const int fn = Integer<int>(loss.at(0), "loss");
  if (fn < 0 || fn >= static_cast<int>(kAllLossFns.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown loss ", fn));
  }
  op.loss.fn = static_cast<LossFn>(fn);
  op.loss.clip_low = loss.at(1).get<double>();
  op.loss.clip_high = loss.at(2).get<double>();
  op.loss.beta = loss.at(3).get<double>();
  LORAPLEX_ASSIGN_OR_RETURN(op.step, OptimizerConfigFromJson(json.at("step")));
  op.grad_clip = json.at("grad_clip").get<double>();
  op.with_optimizer = json.at("with_optimizer").get<bool>();
  if (!json.at("data").is_null()) {
    op.data =
        std::make_shared<const std::vector<Datum>>(DataFromJson(json["data"]));
  }
  if (json.contains("state")) step.state = SavedStateFromJson(json["state"]);
  return step;
}

bool CarriesRequest(StepPlan::Entry::Kind kind) {
  return kind == StepPlan::Entry::Kind::kAttach ||
         kind == StepPlan::Entry::Kind::kOpenSession;
}

Json EntryToJson(const StepPlan::Entry& entry) {
  Json json = {{"kind", static_cast<int>(entry.kind)},
               {"job_id", entry.job_id}};
  if (!CarriesRequest(entry.kind)) return json;
  if (entry.session_state) {
    json["session_state"] = SavedStateToJson(*entry.session_state);
  }
  const SlotAttachRequest& request = entry.request;
  json["lora"] = LoraConfigToJson(request.lora);
  json["optimizer"] = OptimizerConfigToJson(request.optimizer);
  json["schedule"] = LrScheduleConfigToJson(request.schedule);
  if (entry.kind == StepPlan::Entry::Kind::kOpenSession) {
    // A session's seed is any 64-bit value; a job's config keeps its own
    // range.
    TrainingConfig training = request.training;
    training.seed = 0;
    json["training"] = TrainingConfigToJson(training);
    json["seed"] = request.training.seed;
  } else {
    json["training"] = TrainingConfigToJson(request.training);
  }
  json["preferred_slot"] = request.preferred_slot;
  json["data"] = request.data ? SequencesToJson(*request.data) : Json();
  if (entry.restore) {
    json["restore"] = CheckpointInfoToJson(*entry.restore);
    json["training_state"] =
        Bytes(entry.training_state.data(), entry.training_state.size());
  }
  return json;
}

// Throws for a malformed entry (caught by DecodeStepPlan).
absl::StatusOr<StepPlan::Entry> EntryFromJson(const Json& json) {
  StepPlan::Entry entry;
  const int kind = Integer<int>(json.at("kind"), "kind");
  if (kind < 0 ||
      kind > static_cast<int>(StepPlan::Entry::Kind::kOpenSession)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown entry kind ", kind));
  }
  entry.kind = static_cast<StepPlan::Entry::Kind>(kind);
  entry.job_id = json.at("job_id").get<std::string>();
  if (!CarriesRequest(entry.kind)) return entry;
  SlotAttachRequest& request = entry.request;
  request.job_id = entry.job_id;
  request.session = entry.kind == StepPlan::Entry::Kind::kOpenSession;
  if (json.contains("session_state")) {
    entry.session_state = SavedStateFromJson(json["session_state"]);
  }
  LORAPLEX_ASSIGN_OR_RETURN(request.lora, LoraConfigFromJson(json.at("lora")));
  LORAPLEX_ASSIGN_OR_RETURN(request.optimizer,
                            OptimizerConfigFromJson(json.at("optimizer")));
  LORAPLEX_ASSIGN_OR_RETURN(request.schedule,
                            LrScheduleConfigFromJson(json.at("schedule")));
  LORAPLEX_ASSIGN_OR_RETURN(request.training,
                            TrainingConfigFromJson(json.at("training")));
  if (request.session) {
    request.training.seed = Integer<uint64_t>(json.at("seed"), "seed");
  }
  request.preferred_slot =
      Integer<int>(json.at("preferred_slot"), "preferred_slot");
  if (!json.at("data").is_null()) {
    request.data =
        std::make_shared<const SequenceSet>(SequencesFromJson(json["data"]));
  }
  if (json.contains("restore")) {
    LORAPLEX_ASSIGN_OR_RETURN(entry.restore,
                              CheckpointInfoFromJson(json["restore"]));
    const Json::binary_t& state = json.at("training_state").get_binary();
    entry.training_state.assign(state.begin(), state.end());
  }
  return entry;
}

}  // namespace

std::string EncodeStepPlan(const StepPlan& plan) {
  Json active = Json::array();
  for (const auto& [slot, held] : plan.active) {
    Json entry = {{"slot", slot}, {"job_id", held.job_id}, {"step", held.step}};
    if (held.cursor) {
      entry["cursor"] = {held.cursor->seed, held.cursor->epoch,
                         held.cursor->position};
    }
    active.push_back(std::move(entry));
  }
  Json entries = Json::array();
  for (const StepPlan::Entry& entry : plan.entries) {
    entries.push_back(EntryToJson(entry));
  }
  Json sessions = Json::array();
  for (const StepPlan::SessionStep& step : plan.sessions) {
    sessions.push_back(SessionStepToJson(step));
  }
  const Json json = {{"stop", plan.stop},
                     {"checkpoint", plan.checkpoint},
                     {"active", std::move(active)},
                     {"entries", std::move(entries)},
                     {"sessions", std::move(sessions)}};
  const std::vector<uint8_t> bytes = Json::to_cbor(json);
  return std::string(bytes.begin(), bytes.end());
}

absl::StatusOr<StepPlan> DecodeStepPlan(const std::string& bytes) {
  StepPlan plan;
  absl::Status status;
  try {
    const Json json = Json::from_cbor(bytes);
    plan.stop = json.at("stop").get<bool>();
    plan.checkpoint = json.at("checkpoint").get<bool>();
    for (const Json& entry : json.at("active")) {
      StepPlan::Active& held =
          plan.active[Integer<int>(entry.at("slot"), "slot")];
      held.job_id = entry.at("job_id").get<std::string>();
      held.step = Integer<int64_t>(entry.at("step"), "step");
      if (entry.contains("cursor")) {
        const Json& cursor = entry["cursor"];
        held.cursor =
            DataCursorState{Integer<uint64_t>(cursor.at(0), "cursor seed"),
                            Integer<int64_t>(cursor.at(1), "cursor epoch"),
                            Integer<int64_t>(cursor.at(2), "cursor position")};
      }
    }
    for (const Json& entry : json.at("entries")) {
      absl::StatusOr<StepPlan::Entry> decoded = EntryFromJson(entry);
      if (!decoded.ok()) {
        status = decoded.status();
        break;
      }
      plan.entries.push_back(*std::move(decoded));
    }
    for (const Json& step : json.at("sessions")) {
      if (!status.ok()) break;
      absl::StatusOr<StepPlan::SessionStep> decoded = SessionStepFromJson(step);
      if (!decoded.ok()) {
        status = decoded.status();
        break;
      }
      plan.sessions.push_back(*std::move(decoded));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a step plan: ", e.what()));
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a step plan: ", status.message()));
  }
  return plan;
}

}  // namespace loraplex
