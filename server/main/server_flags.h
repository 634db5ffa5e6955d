// loraplex-server's command line: the flags as one plain struct, the CLI11
// options that fill it, and the checks that need several flags at once.
//
//   ServerFlags flags;
//   CLI::App app{"loraplex-server: ..."};
//   AddServerFlags(app, flags);
//   CLI11_PARSE(app, argc, argv);
//   ...
//   LORAPLEX_RETURN_IF_ERROR(CheckFlags(flags, auth));
//
// Ranges and choices of single flags are CLI11 checks (a bad value exits
// before the server starts); CheckFlags is for what only holds together.
#ifndef LORAPLEX_SERVER_MAIN_SERVER_FLAGS_H_
#define LORAPLEX_SERVER_MAIN_SERVER_FLAGS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "server/edges/tenant_auth.h"

namespace loraplex {

// Every flag of loraplex-server; the defaults are those of the command line.
struct ServerFlags {
  // --model: the base model's directory (config.json + safetensors); empty:
  // the built-in tiny model, written to the state dir.
  std::string model_dir;
  // --model-name: what jobs name the base and exports write as
  // base_model_name_or_path; empty: derived from the directory.
  std::string model_name;
  // --state-dir: datasets, adapters, checkpoints and the job database.
  std::string state_dir = "./loraplex-state";
  // --listen: the gRPC address (port 0: any free port).
  std::string listen = "127.0.0.1:50051";
  // --http-listen: HOST:PORT of the Tinker API and /metrics.
  std::string http_listen;  // Off.
  // --tinker-poll-seconds: longest a Tinker retrieve_future waits.
  int tinker_poll_seconds = 30;
  // --tinker-max-samples: Tinker samples one key may have queued or running.
  int64_t tinker_max_samples = 1024;
  // --slots: adapter slots that train together.
  int slots = 8;
  // --slots-per-tenant: slots one tenant's jobs may hold (0: all).
  int slots_per_tenant = 0;
  // --max-rank: the largest LoRA rank accepted.
  int64_t max_rank = 64;
  // --tokens-file: "<tenant> <token>" lines; empty: one tenant, no tokens.
  std::string tokens_file;
  // --tls-cert and --tls-key: PEM files for TLS (both or neither).
  std::string tls_cert;
  std::string tls_key;
  // --insecure-allow-remote: a non-loopback listener without --tokens-file.
  bool insecure_allow_remote = false;
  // --log-level: debug, info, warning or error.
  std::string log_level = "info";
  // --device: cpu, cuda or cuda:N.
  std::string device = "cpu";
  // --dtype: the base's compute dtype (auto: the checkpoint's).
  std::string dtype = "auto";
  // --threads: CPU threads for tensor work (0: one per core).
  int threads = 0;
  // --shard-base: each rank of a data-parallel run keeps 1/N of the base's
  // layers (docs/DESIGN.md §18). Rank 0's flag decides for every rank.
  bool shard_base = false;
  // --max-dataset-mb: the largest dataset upload, in MiB.
  int64_t max_dataset_mb = 256;
  // --token-budget: most padded tokens per micro-batch (0: no limit).
  int64_t token_budget = -1;  // The device's default (DefaultTokenBudget).
  // --activation-checkpointing: off, all, every:K or auto.
  std::string activation_checkpointing = "auto";
  // --activation-memory-mb: what one micro-batch's activations may take.
  int64_t activation_memory_mb = -1;  // -1: from the device's memory.
  // --throughput-log-seconds: seconds between throughput lines (0: none).
  double throughput_log_seconds = 30.0;
  // --ready-file: where the bound address is written once serving.
  std::string ready_file;
  // --checkpoint-interval: steps between checkpoints of jobs that set none.
  int64_t checkpoint_interval = 100;
  // --min-checkpoint-interval: the smallest interval a job may ask for.
  int64_t min_checkpoint_interval = 10;
  // --keep-checkpoints: newest checkpoints kept per job.
  int keep_checkpoints = 3;
  // --keep-finished-checkpoints: those kept once a job has finished.
  int keep_finished_checkpoints = 1;
  // --sample-share: share of the trainer's time decoding takes.
  double sample_share = 0.5;
  // --session-idle-seconds: idle training sessions are saved and closed
  // after this long (0: never).
  double session_idle_seconds = 1800;
  // --session-checkpoint-interval: optimizer steps between a training
  // session's checkpoints (0: only at shutdown and after a load).
  int64_t session_checkpoint_interval = 1;
  // --test-faults (hidden): test-only (core/common/test_faults.h).
  std::string test_faults;
};

// Adds every loraplex-server option to `app`, --version included, each
// writing into `flags` (which must outlive parsing).
void AddServerFlags(CLI::App& app, ServerFlags& flags);

// INVALID_ARGUMENT, naming the flags, when they do not fit together: a
// listener reachable from other hosts that anyone could use (no tokens and
// no --insecure-allow-remote), or half of a TLS key pair.
absl::Status CheckFlags(const ServerFlags& flags,
                        const TenantAuthenticator& auth);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_MAIN_SERVER_FLAGS_H_
