// What the ranks of a data-parallel server agree on before training
// (docs/DESIGN.md §6): rank 0's pool settings, and that every rank loaded the
// same base model. Called once at start-up, after the process group forms.
//
//   RankSetup mine{.model = ModelFingerprint(*model), .slots = 8, ...};
//   LORAPLEX_ASSIGN_OR_RETURN(RankSetup setup, AgreeOnSetup(dist, mine));
//   ... every rank builds its trainer from `setup` ...
#ifndef LORAPLEX_SERVER_TRAINER_RANK_SETUP_H_
#define LORAPLEX_SERVER_TRAINER_RANK_SETUP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/dist/process_group.h"
#include "core/model/llama_model.h"

namespace loraplex {

struct RankSetup {
  std::string model;  // ModelFingerprint of the rank's base model.
  int slots = 0;
  int64_t max_rank = 0;
  int64_t token_budget = 0;
  bool checkpoints = false;  // Rank 0 writes checkpoints.
};

// SHA-256 (hex) over the model's config and 1024 evenly spaced values of
// each of its tensors (embeddings, norms, projections, LM head): equal for
// the same checkpoint loaded in the same dtype, different for another model
// or another fine-tune.
std::string ModelFingerprint(const LlamaModel& model);

// The same for a base sharded over the ranks (sharded_base.h), equal to
// ModelFingerprint of the base loaded whole; collective: every rank gathers
// every layer, and compares each gathered layer with its own checkpoint in
// `dir` (ShardedBase::CheckGathered). FAILED_PRECONDITION when they differ
// (only the ranks that see the difference fail: agree on the outcome after).
// Without a sharded base, ModelFingerprint.
absl::StatusOr<std::string> ShardedModelFingerprint(const LlamaModel& model,
                                                    const std::string& dir);

// Collective, before ShardedModelFingerprint: FAILED_PRECONDITION on every
// rank unless every rank's sharded base has rank 0's config, dtype and
// shard sizes (else their gathers would pair tensors of other sizes). OK
// without a sharded base.
absl::Status AgreeOnShardLayout(DistContext& dist, const LlamaModel& model);

// Collective, before the base loads: rank 0's `shard_base` on every rank,
// so that every rank loads the base as rank 0 does.
absl::StatusOr<bool> AgreeOnShardBase(DistContext& dist, bool shard_base);

// Collective: OK on every rank when `mine` is OK on every rank; otherwise
// this rank's error, or on the ranks that succeeded FAILED_PRECONDITION
// counting the ranks that failed `what` (their logs say why).
absl::Status AgreeAllOk(DistContext& dist, const absl::Status& mine,
                        const std::string& what);

// Collective. Returns rank 0's setup on every rank. FAILED_PRECONDITION on
// every rank when some rank's model differs from rank 0's (that rank's
// message names both fingerprints; rank 0's counts the ranks).
absl::StatusOr<RankSetup> AgreeOnSetup(DistContext& dist,
                                       const RankSetup& mine);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_RANK_SETUP_H_
