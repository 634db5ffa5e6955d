// Durable storage of the service's datasets, jobs, job events, adapters,
// training sessions and the Tinker API's names and answers in one SQLite
// database (WAL journal, synchronous=FULL): when a call returns OK its
// change survives a crash or power cut.
//
//   LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
//                             JobStore::Open(state_dir + "/loraplex.db"));
//   LORAPLEX_RETURN_IF_ERROR(store->InsertJob(job, {queued_event}));
//
// Tenancy: every lookup by id takes the caller's tenant and answers
// NOT_FOUND for another tenant's record, exactly as for a missing one.
// Listings are oldest first and paged with opaque tokens; a token that did
// not come from the same listing is INVALID_ARGUMENT naming page_token.
//
// Thread-safe: calls are serialised on one connection.
#ifndef LORAPLEX_SERVER_STORE_JOB_STORE_H_
#define LORAPLEX_SERVER_STORE_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/store/records.h"

struct sqlite3;

namespace loraplex {

// A client's request_id: a repeat of the request it names (same tenant,
// same method) answers with what the first one created, for
// kRequestIdKeepMs after it.
struct RequestKey {
  std::string tenant;
  std::string method;  // "CreateJob", "UploadDataset", "AttachAdapter".
  std::string request_id;
};
inline constexpr int64_t kRequestIdKeepMs = int64_t{24} * 3600 * 1000;

class JobStore {
 public:
  // Creates the database and its tables when missing; checks the schema
  // version of an existing one (FAILED_PRECONDITION for a newer one).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(
      const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // ALREADY_EXISTS for a repeated id. With `request`, the request is
  // recorded as having created the dataset, in the same transaction
  // (ALREADY_EXISTS, and nothing stored, when it already is).
  absl::Status InsertDataset(const DatasetRecord& dataset,
                             const RequestKey* request = nullptr);
  absl::StatusOr<DatasetRecord> GetDataset(const std::string& tenant,
                                           const std::string& id);
  // page_size in [1, 1000] (the service maps 0 to its default).
  absl::StatusOr<Page<DatasetRecord>> ListDatasets(
      const std::string& tenant, int page_size, const std::string& page_token);
  // NOT_FOUND when missing; FAILED_PRECONDITION naming the job when a job
  // that is not terminal refers to it. The request that stored it is
  // forgotten with it.
  absl::Status DeleteDataset(const std::string& tenant, const std::string& id);

  // Inserts the job and appends `events` to its log (sequences assigned
  // from 1) in one transaction. ALREADY_EXISTS for a repeated id.
  // With `request`, as InsertDataset.
  absl::StatusOr<std::vector<JobEventRecord>> InsertJob(
      const JobRecord& job, std::vector<JobEventRecord> events,
      const RequestKey* request = nullptr);
  // The id of what the request `key` created, if it was recorded within
  // kRequestIdKeepMs before `now_ms`; else NOT_FOUND.
  absl::StatusOr<std::string> FindRequest(const RequestKey& key,
                                          int64_t now_ms);
  // Replaces every column of the stored job with `job` (matched by id) and
  // appends `events` (sequences assigned after the last one), in one
  // transaction. Returns the events as stored. NOT_FOUND for a missing job.
  absl::StatusOr<std::vector<JobEventRecord>> UpdateJob(
      const JobRecord& job, std::vector<JobEventRecord> events);
  // Several UpdateJob calls in one transaction (one fsync for a whole
  // training step). All or nothing.
  struct JobUpdate {
    JobRecord job;
    std::vector<JobEventRecord> events;
  };
  absl::StatusOr<std::vector<std::vector<JobEventRecord>>> UpdateJobs(
      std::vector<JobUpdate> updates);
  // An empty tenant matches every tenant (for the server's own use).
  absl::StatusOr<JobRecord> GetJob(const std::string& tenant,
                                   const std::string& id);
  // Jobs whose status is in `statuses` (all when empty).
  absl::StatusOr<Page<JobRecord>> ListJobs(
      const std::string& tenant, const std::vector<JobStatus>& statuses,
      int page_size, const std::string& page_token);
  // Every tenant's jobs with one of `statuses`, in creation order (for
  // recovery at start-up and the scheduler's queue).
  absl::StatusOr<std::vector<JobRecord>> JobsWithStatus(
      const std::vector<JobStatus>& statuses);

  // Events of `job_id` with sequence > after_sequence, ascending, at most
  // `limit`. The job's tenancy is checked by the caller.
  absl::StatusOr<std::vector<JobEventRecord>> ListJobEvents(
      const std::string& job_id, int64_t after_sequence, int limit);

  // ALREADY_EXISTS for a repeated id.
  absl::Status InsertAdapter(const AdapterRecord& adapter);
  absl::StatusOr<AdapterRecord> GetAdapter(const std::string& tenant,
                                           const std::string& id);
  absl::StatusOr<Page<AdapterRecord>> ListAdapters(
      const std::string& tenant, int page_size, const std::string& page_token);

  // Deletes a finished job with its events (and the request that created
  // it). NOT_FOUND when missing; FAILED_PRECONDITION when not terminal.
  absl::Status DeleteJob(const std::string& tenant, const std::string& id);
  // NOT_FOUND when missing; FAILED_PRECONDITION naming the job when a job
  // that is not terminal starts from it.
  absl::Status DeleteAdapter(const std::string& tenant, const std::string& id);

  // The ids of every tenant's datasets, jobs or adapters (for the server's
  // own use: finding files no record refers to).
  // Training sessions (session_store.cc): `session` inserted, or replacing
  // the stored one of its id.
  absl::Status PutSession(const SessionRecord& session);
  // Every session, oldest first.
  absl::StatusOr<std::vector<SessionRecord>> ListSessions();
  // The Tinker API's names (session_store.cc), inserted or replaced.
  absl::Status PutTinkerName(const TinkerNameRecord& name);
  absl::StatusOr<std::vector<TinkerNameRecord>> ListTinkerNames();
  absl::Status DeleteTinkerName(const std::string& name);
  // Finished calls' answers kept for late reads (session_store.cc).
  absl::Status PutResult(const StoredResultRecord& result);
  // Those stored at or after `since_ms`, oldest first.
  absl::StatusOr<std::vector<StoredResultRecord>> ListResults(int64_t since_ms);
  // Deletes those stored before `time_ms`.
  absl::Status DeleteResultsBefore(int64_t time_ms);

  enum class Table { kDatasets, kJobs, kAdapters };
  absl::StatusOr<std::vector<std::string>> AllIds(Table table);

 private:
  explicit JobStore(sqlite3* db);

  absl::Mutex mu_;  // One statement at a time on the connection.
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);  // Owned; closed on destruction.
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_STORE_JOB_STORE_H_
