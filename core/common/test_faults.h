// Test-only fault injection: makes a chosen job's slot, or a chosen rank,
// fail at a chosen point, so the isolation, agreement and durability paths
// that real failures take can be tested end to end. Nothing is armed
// unless the server is started with --test-faults=SPEC (undocumented in
// --help; see server/README.md); with nothing armed every check is one
// relaxed atomic load.
//
// SPEC is one or more faults separated by ';', each
//
//   POINT[:KEY=VALUE[,KEY=VALUE]...]
//
// POINT: attach, forward, optimizer (a slot's optimizer step, after the
// gradient sum), pause_checkpoint, validation, store_write; hold, which
// fails nothing: the job stops training once it has trained `step` steps,
// until the next command naming it (pause, cancel, export) reaches the
// trainer, so a test can act on a running job at a known step; and meet,
// which fails nothing either: the first `count` new jobs submitted with a
// request_id (after the id was looked up, before anything is stored) wait
// for each other (at most 30 s), so a test runs repeats of one request
// side by side; and slow_checkpoint, which fails nothing: the checkpoint
// writer holds each matching pool checkpoint write for `ms` milliseconds
// before writing it (saying so on stderr first), so a test can act while a
// write is under way.
// KEY:   seed  — only for the job whose training.seed is VALUE;
//        rank  — only in the process of that data-parallel rank;
//        op    — store_write only: the store operation (insert_dataset,
//                insert_job, insert_adapter, update_jobs — the step
//                metrics — or update_job_STATUS, e.g. update_job_CANCELLED);
//        times — fire at most VALUE times (default: every time);
//        step  — hold only, and required there: the step count to hold at;
//        count — meet only, and required there: how many submissions meet;
//        ms    — slow_checkpoint only, and required there: how long.
//
//   ConfigureTestFaults("forward:seed=7;store_write:op=update_jobs,times=1");
//   LORAPLEX_RETURN_IF_ERROR(TestFault(TestFaultPoint::kForward, seed));
#ifndef LORAPLEX_CORE_COMMON_TEST_FAULTS_H_
#define LORAPLEX_CORE_COMMON_TEST_FAULTS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace loraplex {

enum class TestFaultPoint {
  kAttach,
  kForward,
  kOptimizer,
  kPauseCheckpoint,
  kValidation,
  kStoreWrite,
  kHold,            // Asked with TestHold(), never with TestFault().
  kMeet,            // Asked with TestMeet(), never with TestFault().
  kSlowCheckpoint,  // Asked with TestSlowCheckpoint().
};

// Arms the faults of `spec` for this process, which is data-parallel rank
// `rank` (replacing any armed before; "" disarms). INVALID_ARGUMENT naming
// the bad part of a malformed spec (what was armed before stays armed).
absl::Status ConfigureTestFaults(absl::string_view spec, int rank = 0);

// OK, or the injected error (INTERNAL, "injected fault at POINT") when an
// armed fault matches `point`, the job's training `seed` (where known) and
// the store operation `op` (kStoreWrite), counting one firing.
absl::Status TestFault(TestFaultPoint point,
                       std::optional<uint64_t> seed = std::nullopt,
                       absl::string_view op = "");

// Whether an armed `hold` fault matches the job's training `seed` and the
// `step` count its slot has just reached, counting one firing.
bool TestHold(uint64_t seed, int64_t step);

// Waits, while an armed `meet` fault has fewer than `count` arrivals, until
// that many calls have arrived (or 30 s passed); returns at once otherwise.
void TestMeet();

// Sleeps `ms` when an armed slow_checkpoint fault matches the job's
// training `seed` (where known), counting one firing.
void TestSlowCheckpoint(std::optional<uint64_t> seed = std::nullopt);

// TestFault(kStoreWrite) for the store operation `op`.
inline absl::Status StoreWriteFault(absl::string_view op) {
  return TestFault(TestFaultPoint::kStoreWrite, std::nullopt, op);
}

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_TEST_FAULTS_H_
