// loraplex-server's flags: the CLI11 options and the checks across flags.
#include "server/main/server_flags.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/model/model_family.h"
#include "core/runtime/runtime_info.h"
#include "core/runtime/runtime_text.h"

namespace loraplex {
namespace {

bool IsLoopback(absl::string_view address) {
  return absl::StartsWith(address, "127.") ||
         absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]:") ||
         absl::StartsWith(address, "unix:");
}

// What --version prints: the version, then what it runs on.
std::string VersionText() {
  std::string text = absl::StrCat("loraplex-server ", LORAPLEX_VERSION,
                                  "\nmodel families: ", SupportedModelTypes());
  for (const std::string& line : RuntimeLines(InspectRuntime())) {
    absl::StrAppend(&text, "\n", line);
  }
  return text;
}

}  // namespace

void AddServerFlags(CLI::App& app, ServerFlags& flags) {
  app.set_version_flag("--version", VersionText,
                       "Print the version and what the server runs on "
                       "(LibTorch, BLAS, threads, CUDA devices)");
  app.add_option("--model", flags.model_dir,
                 "Base model directory (config.json + safetensors); default: "
                 "the built-in tiny model, written to the state dir");
  app.add_option("--model-name", flags.model_name,
                 "The base model's name: clients' jobs name it, and exported "
                 "adapters write it as base_model_name_or_path (default: "
                 "the directory's name; exports then write config.json's "
                 "_name_or_path, else the directory's absolute path)");
  app.add_option("--state-dir", flags.state_dir,
                 "Where datasets, adapters and the job database live")
      ->capture_default_str();
  app.add_option("--listen", flags.listen,
                 "Address to serve on (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--http-listen", flags.http_listen,
                 "HOST:PORT of the HTTP listener: the Tinker REST API and "
                 "/metrics (off by default)");
  app.add_option("--tinker-poll-seconds", flags.tinker_poll_seconds,
                 "Longest a Tinker retrieve_future waits for its result "
                 "before answering try_again (the SDK gives up after 45 s)")
      ->check(CLI::Range(1, 40))
      ->capture_default_str();
  app.add_option("--tinker-max-samples", flags.tinker_max_samples,
                 "Tinker samples one key may have queued or running "
                 "(beyond: HTTP 429, which the SDK retries)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--slots", flags.slots, "Adapter slots that train together")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--slots-per-tenant", flags.slots_per_tenant,
                 "Slots one tenant's jobs may hold at once (default: all)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--max-rank", flags.max_rank, "Largest LoRA rank accepted")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--tokens-file", flags.tokens_file,
                 "File of \"<tenant> <token>\" lines; every call then needs "
                 "\"authorization: Bearer <token>\"");
  app.add_option("--tls-cert", flags.tls_cert, "PEM certificate chain for TLS");
  app.add_option("--tls-key", flags.tls_key, "PEM private key for TLS");
  app.add_flag("--insecure-allow-remote", flags.insecure_allow_remote,
               "Allow a non-loopback --listen without --tokens-file");
  app.add_option("--log-level", flags.log_level, "debug, info, warning, error")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}))
      ->capture_default_str();
  app.add_option("--device", flags.device, "cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--dtype", flags.dtype,
                 "Compute dtype of the base model: auto (the checkpoint's; "
                 "float16 computes in float32), float32, bfloat16, or "
                 "float64 (LoRA in float64 too: slow, for checking results "
                 "beyond float32 rounding)")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float64"}))
      ->capture_default_str();
  app.add_option("--threads", flags.threads,
                 "CPU threads for tensor work (0: one per core)")
      ->check(CLI::Range(0, 1024));
  app.add_flag("--shard-base", flags.shard_base,
               "Data parallel: each rank keeps 1/N of every decoder layer's "
               "frozen weights and gathers a layer before it runs (for a "
               "base larger than one device; rank 0's flag decides)");
  app.add_option("--max-dataset-mb", flags.max_dataset_mb,
                 "Largest dataset upload in MiB")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--token-budget", flags.token_budget,
                 "Most padded tokens per micro-batch (0: no limit; default: "
                 "2048 on the CPU, on a GPU as many as half its memory "
                 "beside the base's weights holds activations for, up to "
                 "65536)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--activation-checkpointing", flags.activation_checkpointing,
                 "Recompute decoder layers in the backward pass instead of "
                 "keeping their activations: off, all, every:K (layers 0, K, "
                 "2K, ...) or auto (only a micro-batch that would not fit "
                 "the activation memory otherwise, as few layers as fit)")
      ->capture_default_str();
  app.add_option(
         "--activation-memory-mb", flags.activation_memory_mb,
         "MiB one micro-batch's saved activations may take: what auto "
         "checkpointing plans for and what bounds a trained row's "
         "length (default: three quarters of the device's memory beside the "
         "base's weights)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--sample-share", flags.sample_share,
                 "Share of the trainer's time decoding takes while jobs train")
      ->check(CLI::Range(0.05, 0.95))
      ->capture_default_str();
  app.add_option("--session-idle-seconds", flags.session_idle_seconds,
                 "A training session without a call for this long is saved "
                 "(SaveState) and closed, freeing its slot (0: never)")
      ->check(CLI::Range(0.0, 30.0 * 86400))
      ->capture_default_str();
  app.add_option("--session-checkpoint-interval",
                 flags.session_checkpoint_interval,
                 "Optimizer steps between checkpoints of a training session, "
                 "from which it continues after a restart (0: only at "
                 "shutdown; a crash then loses its steps since its start or "
                 "its last load). An optim_step is answered once its "
                 "checkpoint is on disk")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--throughput-log-seconds", flags.throughput_log_seconds,
                 "Seconds between throughput log lines (0: none)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--checkpoint-interval", flags.checkpoint_interval,
                 "Steps between checkpoints of jobs that do not set "
                 "training.checkpoint_interval (0: only on pause, cancel "
                 "and shutdown)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--min-checkpoint-interval", flags.min_checkpoint_interval,
                 "Smallest training.checkpoint_interval a job may ask for "
                 "(a due job checkpoints every slot)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--keep-checkpoints", flags.keep_checkpoints,
                 "Newest checkpoints kept per job")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--keep-finished-checkpoints", flags.keep_finished_checkpoints,
                 "Newest checkpoints kept once a job has finished (0: none; "
                 "its final adapter is kept either way)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--ready-file", flags.ready_file,
                 "Once serving, write the bound address here");
  // Test-only and so not in --help: makes chosen jobs or ranks fail at
  // chosen points (core/common/test_faults.h).
  app.add_option("--test-faults", flags.test_faults)->group("");
}

absl::Status CheckFlags(const ServerFlags& flags,
                        const TenantAuthenticator& auth) {
  const std::pair<const char*, const std::string*> listeners[] = {
      {"--listen", &flags.listen}, {"--http-listen", &flags.http_listen}};
  for (const auto& [flag, address] : listeners) {
    if (!address->empty() && !IsLoopback(*address) && !auth.requires_tokens() &&
        !flags.insecure_allow_remote) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " ", *address,
          " is not a loopback address and there is no --tokens-file: anyone "
          "who can reach it could use the server. Give --tokens-file, or "
          "--insecure-allow-remote to accept that."));
    }
  }
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key must be given together");
  }
  return absl::OkStatus();
}

}  // namespace loraplex
