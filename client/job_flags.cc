#include "client/job_flags.h"

#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/common/resource_names.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

// Accepted spellings of each enum flag (the CLI11 check lowercases them).
const std::map<std::string, v1::OptimizerFamily>& OptimizerFamilies() {
  static const auto* families = new std::map<std::string, v1::OptimizerFamily>{
      {"adamw", v1::OPTIMIZER_FAMILY_ADAMW},
      {"adam", v1::OPTIMIZER_FAMILY_ADAM},
      {"muon", v1::OPTIMIZER_FAMILY_MUON},
      {"lion", v1::OPTIMIZER_FAMILY_LION},
      {"soap", v1::OPTIMIZER_FAMILY_SOAP}};
  return *families;
}

const std::map<std::string, v1::ScalarOptimizer>& ScalarOptimizers() {
  static const auto* scalars = new std::map<std::string, v1::ScalarOptimizer>{
      {"adamw", v1::SCALAR_OPTIMIZER_ADAMW},
      {"lion", v1::SCALAR_OPTIMIZER_LION}};
  return *scalars;
}

// "B1,B2" as two numbers, else INVALID_ARGUMENT naming `flag`.
absl::Status ParseBetas(const std::string& flag, const std::string& text,
                        const char* example, double* beta1, double* beta2) {
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  if (parts.size() != 2 ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(parts[0]), beta1) ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(parts[1]), beta2)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " must be two comma-separated numbers like ",
                     example, ", got \"", text, "\""));
  }
  return absl::OkStatus();
}

const std::map<std::string, v1::MuonWeightDecayMode>& WeightDecayModes() {
  static const auto* modes = new std::map<std::string, v1::MuonWeightDecayMode>{
      {"decoupled", v1::MUON_WEIGHT_DECAY_MODE_DECOUPLED},
      {"independent", v1::MUON_WEIGHT_DECAY_MODE_INDEPENDENT},
      {"l2", v1::MUON_WEIGHT_DECAY_MODE_L2}};
  return *modes;
}

const std::map<std::string, v1::NsCoefficientSet>& CoefficientSets() {
  static const auto* sets = new std::map<std::string, v1::NsCoefficientSet>{
      {"simple", v1::NS_COEFFICIENT_SET_SIMPLE},
      {"quintic", v1::NS_COEFFICIENT_SET_QUINTIC},
      {"polar_express", v1::NS_COEFFICIENT_SET_POLAR_EXPRESS},
      {"aol", v1::NS_COEFFICIENT_SET_AOL},
      {"custom", v1::NS_COEFFICIENT_SET_CUSTOM}};
  return *sets;
}

const std::map<std::string, v1::MuonScaleMode>& ScaleModes() {
  static const auto* modes = new std::map<std::string, v1::MuonScaleMode>{
      {"spectral", v1::MUON_SCALE_MODE_SPECTRAL},
      {"unit_rms_norm", v1::MUON_SCALE_MODE_UNIT_RMS_NORM},
      {"shape_scaling", v1::MUON_SCALE_MODE_SHAPE_SCALING}};
  return *modes;
}

const std::map<std::string, v1::NsPrecision>& NsPrecisions() {
  static const auto* precisions = new std::map<std::string, v1::NsPrecision>{
      {"fp32", v1::NS_PRECISION_FP32}, {"bf16", v1::NS_PRECISION_BF16}};
  return *precisions;
}

const std::map<std::string, v1::LrScheduleKind>& ScheduleKinds() {
  static const auto* kinds = new std::map<std::string, v1::LrScheduleKind>{
      {"constant", v1::LR_SCHEDULE_KIND_CONSTANT},
      {"linear", v1::LR_SCHEDULE_KIND_LINEAR},
      {"cosine", v1::LR_SCHEDULE_KIND_COSINE},
      {"wsd", v1::LR_SCHEDULE_KIND_WSD}};
  return *kinds;
}

template <typename Enum>
std::vector<std::string> Keys(const std::map<std::string, Enum>& values) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : values) keys.push_back(key);
  return keys;
}

// Adds an option to `command` in `group` and remembers it in `flags`.
template <typename T>
CLI::Option* AddFlagOption(CLI::App* command, JobFlags* flags,
                           const std::string& group, const std::string& name,
                           T* value, const std::string& help) {
  CLI::Option* option = command->add_option(name, *value, help);
  option->group(group);
  flags->options.push_back(option);
  return option;
}

// An enum-valued option limited to the keys of `values`.
template <typename Enum>
CLI::Option* AddEnumOption(CLI::App* command, JobFlags* flags,
                           const std::string& group, const std::string& name,
                           std::string* value, const std::string& help,
                           const std::map<std::string, Enum>& values) {
  CLI::Option* option = AddFlagOption(command, flags, group, name, value, help);
  option->check(CLI::IsMember(Keys(values), CLI::ignore_case));
  return option;
}

CLI::Option* AddBoolFlag(CLI::App* command, JobFlags* flags,
                         const std::string& group, const std::string& name,
                         bool* value, const std::string& help) {
  CLI::Option* option = command->add_flag(name, *value, help);
  option->group(group);
  flags->options.push_back(option);
  return option;
}

// The enum value for a flag the CLI11 check accepted.
template <typename Enum>
absl::StatusOr<Enum> LookUp(const std::map<std::string, Enum>& values,
                            const std::string& flag, const std::string& text) {
  auto it = values.find(absl::AsciiStrToLower(text));
  if (it == values.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": unknown value \"", text, "\""));
  }
  return it->second;
}

}  // namespace

void AddJobFlags(CLI::App* command, JobFlags* flags, const JobFlagSet& which) {
  const std::string data = "Data";
  if (which.datasets) {
    AddFlagOption(command, flags, data, "--dataset", &flags->dataset,
                  "Training dataset (ID or datasets/ID)");
    AddFlagOption(command, flags, data, "--validation-dataset",
                  &flags->validation_dataset,
                  "Validation dataset (ID or datasets/ID)");
  }
  if (which.initial_adapter) {
    AddFlagOption(command, flags, data, "--initial-adapter",
                  &flags->initial_adapter,
                  "Continue training this adapter (ID or adapters/ID)");
  }
  if (which.initial_checkpoint) {
    AddFlagOption(command, flags, data, "--initial-checkpoint",
                  &flags->initial_checkpoint,
                  "Continue from a checkpoint's adapter weights "
                  "(jobs/ID/checkpoints/STEP; not with --initial-adapter)");
  }
  AddFlagOption(command, flags, data, "--name", &flags->display_name,
                "Display name of the job");

  const std::string lora = "LoRA";
  AddFlagOption(command, flags, lora, "--rank", &flags->rank,
                "LoRA rank r (server default 8)");
  AddFlagOption(command, flags, lora, "--alpha", &flags->alpha,
                "LoRA alpha (default 16)");
  AddFlagOption(command, flags, lora, "--dropout", &flags->dropout,
                "Dropout on the LoRA input, in [0, 1) (default 0)");
  AddBoolFlag(command, flags, lora, "--rslora", &flags->rslora,
              "Rank-stabilised scaling alpha / sqrt(r)");
  AddFlagOption(command, flags, lora, "--targets", &flags->targets,
                "Adapted modules, e.g. q_proj,v_proj; lm_head adds LoRA on "
                "the LM head (default: the seven projections)");

  const std::string optim = "Optimizer";
  AddEnumOption(command, flags, optim, "--optimizer", &flags->optimizer,
                "adamw (default), adam, muon, lion or soap",
                OptimizerFamilies());
  AddFlagOption(command, flags, optim, "--lr", &flags->lr,
                "Peak learning rate (default 1e-4)");
  AddFlagOption(command, flags, optim, "--weight-decay", &flags->weight_decay,
                "Weight decay (default 0)");
  AddFlagOption(command, flags, optim, "--betas", &flags->betas,
                "Adam betas B1,B2 (default 0.9,0.999)");
  AddFlagOption(command, flags, optim, "--eps", &flags->eps,
                "Adam epsilon (default 1e-8)");
  AddFlagOption(command, flags, optim, "--momentum", &flags->momentum,
                "Muon momentum (default 0.95)");
  AddBoolFlag(command, flags, optim, "--nesterov", &flags->nesterov,
              "Muon Nesterov momentum");
  AddEnumOption(command, flags, optim, "--weight-decay-mode",
                &flags->weight_decay_mode,
                "Muon weight decay: decoupled (default), independent or l2",
                WeightDecayModes());
  AddFlagOption(command, flags, optim, "--ns-steps", &flags->ns_steps,
                "Muon Newton-Schulz iterations (default 5)");
  AddEnumOption(command, flags, optim, "--coefficient-set",
                &flags->coefficient_set,
                "Newton-Schulz coefficients: simple, quintic (default), "
                "polar_express, aol or custom",
                CoefficientSets());
  AddFlagOption(command, flags, optim, "--custom-coefficients",
                &flags->custom_coefficients,
                "Newton-Schulz steps' coefficients A,B,C;A,B,C;... (implies "
                "--coefficient-set custom)");
  AddEnumOption(command, flags, optim, "--scale-mode", &flags->scale_mode,
                "Muon update scale: spectral (default), unit_rms_norm or "
                "shape_scaling",
                ScaleModes());
  AddFlagOption(command, flags, optim, "--extra-scale-factor",
                &flags->extra_scale_factor,
                "Multiplies Muon's update (default 0.2)");
  AddEnumOption(command, flags, optim, "--ns-precision", &flags->ns_precision,
                "Newton-Schulz precision: fp32 (default) or bf16",
                NsPrecisions());
  AddEnumOption(command, flags, optim, "--scalar-optimizer",
                &flags->scalar_optimizer,
                "Muon's and SOAP's optimizer for what is not a matrix: adamw "
                "(default) or lion",
                ScalarOptimizers());
  AddFlagOption(command, flags, optim, "--lion-betas", &flags->lion_betas,
                "Lion betas B1,B2 (default 0.9,0.99)");
  AddFlagOption(command, flags, optim, "--soap-betas", &flags->soap_betas,
                "SOAP betas B1,B2 (default 0.9,0.95)");
  AddFlagOption(command, flags, optim, "--shampoo-beta", &flags->shampoo_beta,
                "SOAP Kronecker factors' decay (default 0.95)");
  AddFlagOption(command, flags, optim, "--precondition-frequency",
                &flags->precondition_frequency,
                "SOAP: refresh the eigenbases every N steps (default 1)");
  AddFlagOption(command, flags, optim, "--max-precond-dim",
                &flags->max_precond_dim,
                "SOAP: sides longer than this are not preconditioned "
                "(default 1024; 0: no limit)");
  AddFlagOption(command, flags, optim, "--power-iter-steps",
                &flags->power_iter_steps,
                "SOAP: orthogonal iteration rounds per refresh (default 1)");
  AddBoolFlag(command, flags, optim, "--use-eigh", &flags->use_eigh,
              "SOAP: a full eigendecomposition at each refresh");
  AddFlagOption(command, flags, optim, "--max-update-rms",
                &flags->max_update_rms,
                "SOAP: clip the update's RMS to this (default 0: no clipping)");

  const std::string schedule = "Schedule";
  AddEnumOption(command, flags, schedule, "--schedule", &flags->schedule,
                "constant, linear, cosine (default) or wsd", ScheduleKinds());
  AddFlagOption(command, flags, schedule, "--warmup-steps",
                &flags->warmup_steps, "Linear warmup steps (default 0)");
  AddFlagOption(command, flags, schedule, "--init-lr", &flags->init_lr,
                "Learning rate warmup starts from (default 0)");
  AddFlagOption(command, flags, schedule, "--min-lr", &flags->min_lr,
                "Learning rate at the end of the schedule (default 0)");
  AddFlagOption(command, flags, schedule, "--total-steps", &flags->total_steps,
                "Steps the schedule spans (default: the job's steps)");
  AddFlagOption(command, flags, schedule, "--decay-fraction",
                &flags->decay_fraction,
                "wsd: decaying fraction of the steps (default 0.1)");

  const std::string training = "Training";
  AddFlagOption(command, flags, training, "--batch-size", &flags->batch_size,
                "Sequences per step (default 4)");
  AddFlagOption(command, flags, training, "--seq-len", &flags->seq_len,
                "Tokens per sequence (default 512, or the model's "
                "max_position_embeddings when smaller)");
  AddBoolFlag(command, flags, training, "--pack", &flags->pack,
              "Pack examples into seq_len pieces");
  AddFlagOption(command, flags, training, "--max-steps", &flags->max_steps,
                "Steps to train; 0 trains --epochs passes (default 0)");
  AddFlagOption(command, flags, training, "--epochs", &flags->epochs,
                "Passes over the data when --max-steps is 0 (default 1)");
  AddFlagOption(command, flags, training, "--grad-clip", &flags->grad_clip,
                "Gradient L2-norm cap; 0 measures only (default 1)");
  AddFlagOption(command, flags, training, "--seed", &flags->seed,
                "Seed of the init, data order and dropout (default 0)");
  AddFlagOption(command, flags, training, "--eval-interval",
                &flags->eval_interval,
                "Steps between validation evaluations; 0: at the end only");
  AddFlagOption(command, flags, training, "--checkpoint-interval",
                &flags->checkpoint_interval,
                "Steps between checkpoints; 0: the server's "
                "--checkpoint-interval (default 0)");
}

absl::Status ApplyJobFlags(const JobFlags& flags,
                           v1::CreateJobRequest* request) {
  auto given = [&flags](absl::string_view name) {
    for (const CLI::Option* option : flags.options) {
      if (option->get_name() == name) return option->count() > 0;
    }
    return false;
  };

  if (given("--dataset")) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string name,
                              ResourceName(kDatasets, flags.dataset));
    request->set_training_dataset(name);
  }
  if (given("--validation-dataset")) {
    LORAPLEX_ASSIGN_OR_RETURN(
        std::string name, ResourceName(kDatasets, flags.validation_dataset));
    request->set_validation_dataset(name);
  }
  if (given("--initial-adapter")) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string name,
                              ResourceName(kAdapters, flags.initial_adapter));
    request->set_initial_adapter(name);
  }
  if (given("--initial-checkpoint")) {
    if (given("--initial-adapter")) {
      return absl::InvalidArgumentError(
          "--initial-adapter and --initial-checkpoint are exclusive: a job "
          "starts from one adapter or one checkpoint");
    }
    LORAPLEX_ASSIGN_OR_RETURN(std::string name,
                              CheckpointName(flags.initial_checkpoint));
    request->set_initial_checkpoint(name);
  }
  if (given("--name")) request->set_display_name(flags.display_name);

  v1::LoraConfig* lora = request->mutable_lora();
  if (given("--rank")) lora->set_rank(flags.rank);
  if (given("--alpha")) lora->set_alpha(flags.alpha);
  if (given("--dropout")) lora->set_dropout(flags.dropout);
  if (given("--rslora")) lora->set_use_rslora(flags.rslora);
  if (given("--targets")) {
    for (absl::string_view target :
         absl::StrSplit(flags.targets, ',', absl::SkipWhitespace())) {
      lora->add_target_modules(std::string(absl::StripAsciiWhitespace(target)));
    }
    if (lora->target_modules().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--targets must list modules like q_proj,v_proj, got \"",
                       flags.targets, "\""));
    }
  }

  v1::OptimizerConfig* optimizer = request->mutable_optimizer();
  if (given("--optimizer")) {
    LORAPLEX_ASSIGN_OR_RETURN(
        v1::OptimizerFamily family,
        LookUp(OptimizerFamilies(), "--optimizer", flags.optimizer));
    optimizer->set_family(family);
  }
  if (given("--lr")) optimizer->set_lr(flags.lr);
  if (given("--weight-decay")) optimizer->set_weight_decay(flags.weight_decay);
  if (given("--betas")) {
    double beta1 = 0;
    double beta2 = 0;
    LORAPLEX_RETURN_IF_ERROR(
        ParseBetas("--betas", flags.betas, "0.9,0.999", &beta1, &beta2));
    optimizer->add_betas(beta1);
    optimizer->add_betas(beta2);
  }
  if (given("--eps")) optimizer->set_eps(flags.eps);
  if (given("--momentum")) optimizer->set_momentum(flags.momentum);
  if (given("--nesterov")) optimizer->set_nesterov(flags.nesterov);
  if (given("--weight-decay-mode")) {
    LORAPLEX_ASSIGN_OR_RETURN(v1::MuonWeightDecayMode mode,
                              LookUp(WeightDecayModes(), "--weight-decay-mode",
                                     flags.weight_decay_mode));
    optimizer->set_weight_decay_mode(mode);
  }
  if (given("--ns-steps")) optimizer->set_ns_steps(flags.ns_steps);
  if (given("--coefficient-set")) {
    LORAPLEX_ASSIGN_OR_RETURN(
        v1::NsCoefficientSet set,
        LookUp(CoefficientSets(), "--coefficient-set", flags.coefficient_set));
    optimizer->set_coefficient_set(set);
  }
  if (given("--custom-coefficients")) {
    for (absl::string_view step :
         absl::StrSplit(flags.custom_coefficients, ';', absl::SkipEmpty())) {
      std::vector<std::string> parts = absl::StrSplit(step, ',');
      double abc[3] = {0, 0, 0};
      bool ok = parts.size() == 3;
      for (size_t i = 0; ok && i < 3; ++i) {
        ok = absl::SimpleAtod(absl::StripAsciiWhitespace(parts[i]), &abc[i]);
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--custom-coefficients must be ';'-separated A,B,C number "
            "triples like 3.4445,-4.775,2.0315, got \"",
            step, "\""));
      }
      v1::NsCoefficients* coefficients = optimizer->add_custom_coefficients();
      coefficients->set_a(abc[0]);
      coefficients->set_b(abc[1]);
      coefficients->set_c(abc[2]);
    }
    if (!given("--coefficient-set")) {
      optimizer->set_coefficient_set(v1::NS_COEFFICIENT_SET_CUSTOM);
    }
  }
  if (given("--scale-mode")) {
    LORAPLEX_ASSIGN_OR_RETURN(
        v1::MuonScaleMode mode,
        LookUp(ScaleModes(), "--scale-mode", flags.scale_mode));
    optimizer->set_scale_mode(mode);
  }
  if (given("--extra-scale-factor")) {
    optimizer->set_extra_scale_factor(flags.extra_scale_factor);
  }
  if (given("--ns-precision")) {
    LORAPLEX_ASSIGN_OR_RETURN(
        v1::NsPrecision precision,
        LookUp(NsPrecisions(), "--ns-precision", flags.ns_precision));
    optimizer->set_ns_precision(precision);
  }
  if (given("--scalar-optimizer")) {
    LORAPLEX_ASSIGN_OR_RETURN(v1::ScalarOptimizer scalar,
                              LookUp(ScalarOptimizers(), "--scalar-optimizer",
                                     flags.scalar_optimizer));
    optimizer->set_scalar_optimizer(scalar);
  }
  if (given("--lion-betas")) {
    double beta1 = 0;
    double beta2 = 0;
    LORAPLEX_RETURN_IF_ERROR(ParseBetas("--lion-betas", flags.lion_betas,
                                        "0.9,0.99", &beta1, &beta2));
    optimizer->add_lion_betas(beta1);
    optimizer->add_lion_betas(beta2);
  }
  if (given("--soap-betas")) {
    double beta1 = 0;
    double beta2 = 0;
    LORAPLEX_RETURN_IF_ERROR(ParseBetas("--soap-betas", flags.soap_betas,
                                        "0.9,0.95", &beta1, &beta2));
    optimizer->add_soap_betas(beta1);
    optimizer->add_soap_betas(beta2);
  }
  if (given("--shampoo-beta")) optimizer->set_shampoo_beta(flags.shampoo_beta);
  if (given("--precondition-frequency")) {
    optimizer->set_precondition_frequency(flags.precondition_frequency);
  }
  if (given("--max-precond-dim")) {
    optimizer->set_max_precond_dim(flags.max_precond_dim);
  }
  if (given("--power-iter-steps")) {
    optimizer->set_power_iter_steps(flags.power_iter_steps);
  }
  if (given("--use-eigh")) optimizer->set_use_eigh(flags.use_eigh);
  if (given("--max-update-rms")) {
    optimizer->set_max_update_rms(flags.max_update_rms);
  }

  v1::LrSchedule* schedule = request->mutable_schedule();
  if (given("--schedule")) {
    LORAPLEX_ASSIGN_OR_RETURN(
        v1::LrScheduleKind kind,
        LookUp(ScheduleKinds(), "--schedule", flags.schedule));
    schedule->set_kind(kind);
  }
  if (given("--warmup-steps")) schedule->set_warmup_steps(flags.warmup_steps);
  if (given("--init-lr")) schedule->set_init_lr(flags.init_lr);
  if (given("--min-lr")) schedule->set_min_lr(flags.min_lr);
  if (given("--total-steps")) schedule->set_total_steps(flags.total_steps);
  if (given("--decay-fraction")) {
    schedule->set_decay_fraction(flags.decay_fraction);
  }

  v1::TrainingConfig* training = request->mutable_training();
  if (given("--batch-size")) training->set_batch_size(flags.batch_size);
  if (given("--seq-len")) training->set_seq_len(flags.seq_len);
  if (given("--pack")) training->set_pack(flags.pack);
  if (given("--max-steps")) training->set_max_steps(flags.max_steps);
  if (given("--epochs")) training->set_epochs(flags.epochs);
  if (given("--grad-clip")) training->set_grad_clip(flags.grad_clip);
  if (given("--seed")) training->set_seed(flags.seed);
  if (given("--eval-interval")) {
    training->set_eval_interval(flags.eval_interval);
  }
  if (given("--checkpoint-interval")) {
    training->set_checkpoint_interval(flags.checkpoint_interval);
  }

  // Leave untouched sub-messages unset, so the request says only what the
  // user gave.
  if (lora->ByteSizeLong() == 0) request->clear_lora();
  if (optimizer->ByteSizeLong() == 0) request->clear_optimizer();
  if (schedule->ByteSizeLong() == 0) request->clear_schedule();
  if (training->ByteSizeLong() == 0) request->clear_training();
  return absl::OkStatus();
}

absl::StatusOr<v1::JobStatus> ParseJobStatus(absl::string_view text) {
  std::string upper = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  if (!absl::StartsWith(upper, "JOB_STATUS_")) {
    upper = absl::StrCat("JOB_STATUS_", upper);
  }
  v1::JobStatus status = v1::JOB_STATUS_UNSPECIFIED;
  if (!v1::JobStatus_Parse(upper, &status) ||
      status == v1::JOB_STATUS_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--status: unknown job status \"", text,
        "\" (one of validating, queued, running, succeeded, failed, "
        "cancelled, paused)"));
  }
  return status;
}

}  // namespace loraplex
