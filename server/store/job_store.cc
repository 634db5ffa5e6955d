#include "server/store/job_store.h"

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "server/store/record_rows.h"
#include "server/store/sqlite_statement.h"

namespace loraplex {
namespace {

using store_internal::BindAdapter;
using store_internal::BindDataset;
using store_internal::BindEvent;
using store_internal::BindJob;
using store_internal::EventColumns;
using store_internal::Exec;
using store_internal::JobColumns;
using store_internal::kAdapterColumns;
using store_internal::kDatasetColumns;
using store_internal::kNumAdapterColumns;
using store_internal::kNumDatasetColumns;
using store_internal::kNumEventColumns;
using store_internal::kNumJobColumns;
using store_internal::Placeholders;
using store_internal::ReadAdapter;
using store_internal::ReadAllRows;
using store_internal::ReadDataset;
using store_internal::ReadEvent;
using store_internal::ReadJob;
using store_internal::SqliteError;
using store_internal::Statement;
using store_internal::Transaction;

// Stored in PRAGMA user_version; a database with a higher one was written by
// a newer loraplex whose tables this one may misread.
// 2: requests. 3: sessions, tinker_names, results. 4: expert_tokens in
// jobs and job_events.
constexpr int kSchemaVersion = 4;
constexpr int kMaxPageSize = 1000;

constexpr int kBusyTimeoutMs = 5000;

// row_id orders every listing: AUTOINCREMENT never reuses the id of a
// deleted row, so a page token never skips a row inserted after it.
constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS datasets (
  row_id INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  tenant TEXT NOT NULL,
  display_name TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  num_examples INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  create_time_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS datasets_by_tenant ON datasets (tenant, row_id);

CREATE TABLE IF NOT EXISTS jobs (
  row_id INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  tenant TEXT NOT NULL,
  display_name TEXT NOT NULL,
  base_model TEXT NOT NULL,
  training_dataset_id TEXT NOT NULL,
  validation_dataset_id TEXT NOT NULL,
  initial_adapter_id TEXT NOT NULL,
  spec TEXT NOT NULL,
  status TEXT NOT NULL,
  slot INTEGER NOT NULL,
  total_steps INTEGER NOT NULL,
  step INTEGER NOT NULL,
  loss REAL NOT NULL,
  lr REAL NOT NULL,
  grad_norm REAL NOT NULL,
  tokens_per_second REAL NOT NULL,
  tokens INTEGER NOT NULL,
  skipped_steps INTEGER NOT NULL,
  validation_loss REAL,
  expert_tokens TEXT NOT NULL DEFAULT '',
  error_code TEXT NOT NULL,
  error_message TEXT NOT NULL,
  adapter_id TEXT NOT NULL,
  create_time_ms INTEGER NOT NULL,
  start_time_ms INTEGER NOT NULL,
  end_time_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, row_id);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, row_id);

CREATE TABLE IF NOT EXISTS job_events (
  row_id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL REFERENCES jobs (id),
  sequence INTEGER NOT NULL,
  time_ms INTEGER NOT NULL,
  status TEXT,
  message TEXT NOT NULL,
  error_code TEXT NOT NULL,
  error_message TEXT NOT NULL,
  step INTEGER NOT NULL,
  loss REAL NOT NULL,
  lr REAL NOT NULL,
  grad_norm REAL NOT NULL,
  tokens_per_second REAL NOT NULL,
  tokens INTEGER NOT NULL,
  skipped_steps INTEGER NOT NULL,
  validation_loss REAL,
  expert_tokens TEXT NOT NULL DEFAULT '',
  UNIQUE (job_id, sequence));

CREATE TABLE IF NOT EXISTS adapters (
  row_id INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  tenant TEXT NOT NULL,
  display_name TEXT NOT NULL,
  job_id TEXT NOT NULL,
  base_model TEXT NOT NULL,
  lora TEXT NOT NULL,
  create_time_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS adapters_by_tenant ON adapters (tenant, row_id);

CREATE TABLE IF NOT EXISTS requests (
  tenant TEXT NOT NULL,
  method TEXT NOT NULL,
  request_id TEXT NOT NULL,
  resource_id TEXT NOT NULL,
  time_ms INTEGER NOT NULL,
  PRIMARY KEY (tenant, method, request_id));
CREATE INDEX IF NOT EXISTS requests_by_time ON requests (time_ms);

CREATE TABLE IF NOT EXISTS sessions (
  row_id INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  tenant TEXT NOT NULL,
  display_name TEXT NOT NULL,
  spec TEXT NOT NULL,
  state TEXT NOT NULL,
  reason TEXT NOT NULL,
  steps INTEGER NOT NULL,
  slot INTEGER NOT NULL,
  next_seq_id INTEGER NOT NULL,
  idle_state TEXT NOT NULL,
  create_time_ms INTEGER NOT NULL,
  last_activity_ms INTEGER NOT NULL);

CREATE TABLE IF NOT EXISTS tinker_names (
  name TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  tenant TEXT NOT NULL,
  value TEXT NOT NULL);

CREATE TABLE IF NOT EXISTS results (
  owner TEXT NOT NULL,
  seq INTEGER NOT NULL,
  code INTEGER NOT NULL,
  message TEXT NOT NULL,
  body BLOB NOT NULL,
  content_type TEXT NOT NULL,
  time_ms INTEGER NOT NULL,
  PRIMARY KEY (owner, seq));
CREATE INDEX IF NOT EXISTS results_by_time ON results (time_ms);
)sql";

absl::Status NotFound(absl::string_view kind, absl::string_view id) {
  return absl::NotFoundError(absl::StrCat(kind, " \"", id, "\" not found"));
}

absl::Status CheckPageSize(int page_size) {
  if (page_size < 1 || page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size must be in [1, ", kMaxPageSize, "], got ", page_size));
  }
  return absl::OkStatus();
}

// A token names its listing (kind, tenant and filter) and the row_id of
// the last row returned; the tenant is length-prefixed so no two listings
// share a prefix.
std::string ListingName(absl::string_view kind, absl::string_view tenant,
                        absl::string_view filter = "") {
  return absl::StrCat(kind, "|", tenant.size(), ":", tenant, "|", filter);
}

std::string EncodePageToken(absl::string_view listing, int64_t row_id) {
  return absl::WebSafeBase64Escape(absl::StrCat(listing, "|", row_id));
}

// The row_id to continue after; 0 for the first page.
absl::StatusOr<int64_t> DecodePageToken(absl::string_view token,
                                        absl::string_view listing) {
  if (token.empty()) return 0;
  const absl::Status invalid = absl::InvalidArgumentError(
      "page_token does not belong to this listing (a token only continues "
      "the listing, with the same filter, that returned it)");
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) return invalid;
  const size_t bar = raw.rfind('|');
  int64_t row_id = 0;
  if (bar == std::string::npos ||
      absl::string_view(raw).substr(0, bar) != listing ||
      !absl::SimpleAtoi(absl::string_view(raw).substr(bar + 1), &row_id) ||
      row_id < 1) {
    return invalid;
  }
  return row_id;
}

// Reads the rows of a query run with LIMIT page_size + 1: the extra row
// only tells that there is a next page.
template <typename Record, typename ReadRow>
absl::StatusOr<Page<Record>> ReadPage(Statement& stmt, int page_size,
                                      int row_id_column,
                                      absl::string_view listing,
                                      ReadRow read_row) {
  Page<Record> page;
  int64_t last_row_id = 0;
  while (true) {
    LORAPLEX_ASSIGN_OR_RETURN(bool has_row, stmt.Step());
    if (!has_row) break;
    if (page.items.size() == static_cast<size_t>(page_size)) {
      page.next_page_token = EncodePageToken(listing, last_row_id);
      break;
    }
    LORAPLEX_ASSIGN_OR_RETURN(Record record, read_row(stmt));
    page.items.push_back(std::move(record));
    last_row_id = stmt.Int(row_id_column);
  }
  return page;
}

// A table of records a tenant owns, looked up by id and listed in
// creation order: datasets and adapters.
template <typename Record>
struct OwnedTable {
  const char* table;  // "datasets"
  const char* kind;   // "dataset", for messages.
  const char* columns;
  int num_columns;
  absl::Status (*bind)(Statement&, const Record&);
  absl::StatusOr<Record> (*read)(const Statement&);
};

const OwnedTable<DatasetRecord> kDatasets = {
    "datasets",
    "dataset",
    kDatasetColumns,
    kNumDatasetColumns,
    [](Statement& stmt, const DatasetRecord& dataset) {
      BindDataset(stmt, dataset);
      return absl::OkStatus();
    },
    ReadDataset};

const OwnedTable<AdapterRecord> kAdapters = {
    "adapters",         "adapter",   kAdapterColumns,
    kNumAdapterColumns, BindAdapter, ReadAdapter};

template <typename Record>
absl::Status InsertOwned(sqlite3* db, const OwnedTable<Record>& table,
                         const Record& record) {
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement insert,
      Statement::Prepare(
          db,
          absl::StrCat("INSERT INTO ", table.table, " (", table.columns,
                       ") VALUES (", Placeholders(table.num_columns), ")")));
  LORAPLEX_RETURN_IF_ERROR(table.bind(insert, record));
  absl::Status status = insert.Run();
  if (absl::IsAlreadyExists(status)) {
    return absl::AlreadyExistsError(
        absl::StrCat(table.kind, " \"", record.id, "\" already exists"));
  }
  return status;
}

template <typename Record>
absl::StatusOr<Record> GetOwned(sqlite3* db, const OwnedTable<Record>& table,
                                const std::string& tenant,
                                const std::string& id) {
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(
          db, absl::StrCat("SELECT ", table.columns, " FROM ", table.table,
                           " WHERE id = ? AND tenant = ?")));
  select.BindText(id);
  select.BindText(tenant);
  LORAPLEX_ASSIGN_OR_RETURN(bool found, select.Step());
  if (!found) return NotFound(table.kind, id);
  return table.read(select);
}

template <typename Record>
absl::StatusOr<Page<Record>> ListOwned(sqlite3* db,
                                       const OwnedTable<Record>& table,
                                       const std::string& tenant, int page_size,
                                       const std::string& page_token) {
  LORAPLEX_RETURN_IF_ERROR(CheckPageSize(page_size));
  const std::string listing = ListingName(table.table, tenant);
  LORAPLEX_ASSIGN_OR_RETURN(int64_t after,
                            DecodePageToken(page_token, listing));
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(
          db,
          absl::StrCat("SELECT ", table.columns, ", row_id FROM ", table.table,
                       " WHERE tenant = ? AND row_id > ? ORDER BY row_id "
                       "LIMIT ?")));
  select.BindText(tenant);
  select.BindInt(after);
  select.BindInt(page_size + 1);
  return ReadPage<Record>(select, page_size, table.num_columns, listing,
                          table.read);
}

// Appends `events` to the log of `job_id` after its last sequence; call
// inside a transaction.
absl::StatusOr<std::vector<JobEventRecord>> AppendEvents(
    sqlite3* db, const std::string& job_id,
    std::vector<JobEventRecord> events) {
  if (events.empty()) return events;
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement last,
      Statement::Prepare(db,
                         "SELECT COALESCE(MAX(sequence), 0) FROM job_events "
                         "WHERE job_id = ?"));
  last.BindText(job_id);
  LORAPLEX_ASSIGN_OR_RETURN(bool has_last, last.Step());
  int64_t sequence = has_last ? last.Int(0) : 0;
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement insert,
      Statement::Prepare(
          db, absl::StrCat("INSERT INTO job_events (", EventColumns(),
                           ") VALUES (", Placeholders(kNumEventColumns), ")")));
  for (JobEventRecord& event : events) {
    event.job_id = job_id;
    event.sequence = ++sequence;
    insert.Reset();
    BindEvent(insert, event);
    LORAPLEX_RETURN_IF_ERROR(insert.Run());
  }
  return events;
}

// One UpdateJob inside the caller's transaction.
absl::StatusOr<std::vector<JobEventRecord>> UpdateJobRow(
    sqlite3* db, const JobRecord& job, std::vector<JobEventRecord> events) {
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement update,
      Statement::Prepare(
          db, absl::StrCat("UPDATE jobs SET (", JobColumns(), ") = (",
                           Placeholders(kNumJobColumns), ") WHERE id = ?")));
  LORAPLEX_RETURN_IF_ERROR(BindJob(update, job));
  update.BindText(job.id);
  LORAPLEX_RETURN_IF_ERROR(update.Run());
  if (sqlite3_changes(db) == 0) return NotFound("job", job.id);
  return AppendEvents(db, job.id, std::move(events));
}

// The first column of the first row of `sql`. The statement is finalized
// on return: a pending one would hold a read transaction, in which SQLite
// refuses to change the journal mode.
absl::StatusOr<std::string> QueryText(sqlite3* db, const char* sql) {
  LORAPLEX_ASSIGN_OR_RETURN(Statement query, Statement::Prepare(db, sql));
  LORAPLEX_ASSIGN_OR_RETURN(bool has_row, query.Step());
  return has_row ? query.Text(0) : std::string();
}

// Records that `key` created `resource_id` (dropping requests past their
// keep time first); call inside a transaction. ALREADY_EXISTS when the key
// is recorded.
absl::Status RecordRequest(sqlite3* db, const RequestKey& key,
                           const std::string& resource_id) {
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement expire,
      Statement::Prepare(db, "DELETE FROM requests WHERE time_ms < ?"));
  expire.BindInt(now_ms - kRequestIdKeepMs);
  LORAPLEX_RETURN_IF_ERROR(expire.Run());
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement insert,
      Statement::Prepare(db,
                         "INSERT INTO requests (tenant, method, request_id, "
                         "resource_id, time_ms) VALUES (?, ?, ?, ?, ?)"));
  insert.BindText(key.tenant);
  insert.BindText(key.method);
  insert.BindText(key.request_id);
  insert.BindText(resource_id);
  insert.BindInt(now_ms);
  absl::Status status = insert.Run();
  if (absl::IsAlreadyExists(status)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id \"", key.request_id, "\" of ", key.method,
                     " is already recorded"));
  }
  return status;
}

// Deletes `id` of `tenant` from `table` (and the request that created it)
// in one transaction: NOT_FOUND when missing, FAILED_PRECONDITION naming
// the job when a job that is not terminal refers to it (`uses`: an SQL
// condition on jobs, ?1 the id).
template <typename Record>
absl::Status DeleteUnlessUsed(sqlite3* db, const OwnedTable<Record>& table,
                              const std::string& tenant, const std::string& id,
                              const char* uses, const char* relation) {
  Transaction transaction(db);
  LORAPLEX_RETURN_IF_ERROR(transaction.Begin());
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement exists,
      Statement::Prepare(db, absl::StrCat("SELECT 1 FROM ", table.table,
                                          " WHERE id = ? AND tenant = ?")));
  exists.BindText(id);
  exists.BindText(tenant);
  LORAPLEX_ASSIGN_OR_RETURN(bool found, exists.Step());
  if (!found) return NotFound(table.kind, id);
  std::vector<std::string> terminal;
  for (JobStatus status : kAllJobStatuses) {
    if (IsTerminal(status)) {
      terminal.push_back(absl::StrCat("'", JobStatusName(status), "'"));
    }
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement users,
      Statement::Prepare(db, absl::StrCat("SELECT id, status FROM jobs WHERE (",
                                          uses, ") AND status NOT IN (",
                                          absl::StrJoin(terminal, ", "),
                                          ") ORDER BY row_id LIMIT 1")));
  users.BindText(id);
  LORAPLEX_ASSIGN_OR_RETURN(bool in_use, users.Step());
  if (in_use) {
    return absl::FailedPreconditionError(absl::StrCat(
        table.kind, " \"", id, "\" ", relation, " job \"", users.Text(0),
        "\" (", users.Text(1),
        "); cancel the job or wait for it to finish before deleting it"));
  }
  for (const std::string& sql :
       {absl::StrCat("DELETE FROM ", table.table, " WHERE id = ?1"),
        // A repeat of the request that created it creates it anew.
        std::string("DELETE FROM requests WHERE resource_id = ?1")}) {
    LORAPLEX_ASSIGN_OR_RETURN(Statement erase, Statement::Prepare(db, sql));
    erase.BindText(id);
    LORAPLEX_RETURN_IF_ERROR(erase.Run());
  }
  return transaction.Commit();
}

// Applies the pragmas and creates or checks the schema.
absl::Status InitializeDatabase(sqlite3* db, const std::string& path) {
  const std::string context = absl::StrCat("database \"", path, "\"");
  LORAPLEX_ASSIGN_OR_RETURN(std::string version_text,
                            QueryText(db, "PRAGMA user_version"));
  int64_t schema_version = 0;
  if (!absl::SimpleAtoi(version_text, &schema_version)) {
    return absl::InternalError(
        absl::StrCat(context, " reports user_version \"", version_text, "\""));
  }
  if (schema_version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        context, " has schema version ", schema_version,
        ", written by a newer loraplex (this one reads up to version ",
        kSchemaVersion, ")"));
  }

  LORAPLEX_ASSIGN_OR_RETURN(std::string mode,
                            QueryText(db, "PRAGMA journal_mode=WAL"));
  if (mode != "wal") {
    return absl::InternalError(
        absl::StrCat(context, " does not accept journal_mode=WAL (it stays \"",
                     mode, "\")"));
  }
  LORAPLEX_RETURN_IF_ERROR(Exec(db, "PRAGMA synchronous=FULL"));
  LORAPLEX_RETURN_IF_ERROR(Exec(db, "PRAGMA foreign_keys=ON"));
  if (schema_version == kSchemaVersion) return absl::OkStatus();

  Transaction transaction(db);
  LORAPLEX_RETURN_IF_ERROR(transaction.Begin());
  LORAPLEX_RETURN_IF_ERROR(Exec(db, kSchema));
  // Tables of versions before 4 gain the columns they lack.
  for (const char* table : {"jobs", "job_events"}) {
    LORAPLEX_ASSIGN_OR_RETURN(
        std::string has,
        QueryText(db, absl::StrCat("SELECT COUNT(*) FROM pragma_table_info('",
                                   table, "') WHERE name = 'expert_tokens'")
                          .c_str()));
    if (has == "0") {
      LORAPLEX_RETURN_IF_ERROR(Exec(
          db, absl::StrCat("ALTER TABLE ", table,
                           " ADD COLUMN expert_tokens TEXT NOT NULL DEFAULT ''")
                  .c_str()));
    }
  }
  LORAPLEX_RETURN_IF_ERROR(
      Exec(db, absl::StrCat("PRAGMA user_version = ", kSchemaVersion).c_str()));
  return transaction.Commit();
}

}  // namespace

JobStore::JobStore(sqlite3* db) : db_(db) {}

JobStore::~JobStore() { sqlite3_close_v2(db_); }

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(
    const std::string& path) {
  sqlite3* db = nullptr;
  // The store serialises every call on mu_, so SQLite's own mutexes are
  // not needed.
  const int result = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      nullptr);
  // Owns the connection from here on, also when opening failed.
  std::unique_ptr<JobStore> store(new JobStore(db));
  if (result != SQLITE_OK) {
    return SqliteError(db, absl::StrCat("opening database \"", path, "\""));
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  LORAPLEX_RETURN_IF_ERROR(InitializeDatabase(db, path));
  return store;
}

absl::Status JobStore::InsertDataset(const DatasetRecord& dataset,
                                     const RequestKey* request) {
  LORAPLEX_RETURN_IF_ERROR(StoreWriteFault("insert_dataset"));
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  LORAPLEX_RETURN_IF_ERROR(transaction.Begin());
  LORAPLEX_RETURN_IF_ERROR(InsertOwned(db_, kDatasets, dataset));
  if (request != nullptr) {
    LORAPLEX_RETURN_IF_ERROR(RecordRequest(db_, *request, dataset.id));
  }
  return transaction.Commit();
}

absl::StatusOr<std::string> JobStore::FindRequest(const RequestKey& key,
                                                  int64_t now_ms) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(db_,
                         "SELECT resource_id FROM requests WHERE tenant = ? "
                         "AND method = ? AND request_id = ? AND time_ms >= ?"));
  select.BindText(key.tenant);
  select.BindText(key.method);
  select.BindText(key.request_id);
  select.BindInt(now_ms - kRequestIdKeepMs);
  LORAPLEX_ASSIGN_OR_RETURN(bool found, select.Step());
  if (!found) return NotFound("request", key.request_id);
  return select.Text(0);
}

absl::StatusOr<DatasetRecord> JobStore::GetDataset(const std::string& tenant,
                                                   const std::string& id) {
  absl::MutexLock lock(&mu_);
  return GetOwned(db_, kDatasets, tenant, id);
}

absl::StatusOr<Page<DatasetRecord>> JobStore::ListDatasets(
    const std::string& tenant, int page_size, const std::string& page_token) {
  absl::MutexLock lock(&mu_);
  return ListOwned(db_, kDatasets, tenant, page_size, page_token);
}

absl::Status JobStore::DeleteDataset(const std::string& tenant,
                                     const std::string& id) {
  absl::MutexLock lock(&mu_);
  // Every tenant's jobs are checked: a job must never lose its data, even
  // one that refers to the dataset against the rules.
  return DeleteUnlessUsed(db_, kDatasets, tenant, id,
                          "training_dataset_id = ?1 OR "
                          "validation_dataset_id = ?1",
                          "is used by");
}

absl::StatusOr<std::vector<JobEventRecord>> JobStore::InsertJob(
    const JobRecord& job, std::vector<JobEventRecord> events,
    const RequestKey* request) {
  LORAPLEX_RETURN_IF_ERROR(StoreWriteFault("insert_job"));
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  LORAPLEX_RETURN_IF_ERROR(transaction.Begin());
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement insert,
      Statement::Prepare(
          db_, absl::StrCat("INSERT INTO jobs (", JobColumns(), ") VALUES (",
                            Placeholders(kNumJobColumns), ")")));
  LORAPLEX_RETURN_IF_ERROR(BindJob(insert, job));
  absl::Status status = insert.Run();
  if (absl::IsAlreadyExists(status)) {
    return absl::AlreadyExistsError(
        absl::StrCat("job \"", job.id, "\" already exists"));
  }
  LORAPLEX_RETURN_IF_ERROR(status);
  LORAPLEX_ASSIGN_OR_RETURN(events,
                            AppendEvents(db_, job.id, std::move(events)));
  if (request != nullptr) {
    LORAPLEX_RETURN_IF_ERROR(RecordRequest(db_, *request, job.id));
  }
  LORAPLEX_RETURN_IF_ERROR(transaction.Commit());
  return events;
}

absl::StatusOr<std::vector<JobEventRecord>> JobStore::UpdateJob(
    const JobRecord& job, std::vector<JobEventRecord> events) {
  // Named by the status written: a test fault can pick one change.
  LORAPLEX_RETURN_IF_ERROR(
      StoreWriteFault(absl::StrCat("update_job_", JobStatusName(job.status))));
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  LORAPLEX_RETURN_IF_ERROR(transaction.Begin());
  LORAPLEX_ASSIGN_OR_RETURN(events, UpdateJobRow(db_, job, std::move(events)));
  LORAPLEX_RETURN_IF_ERROR(transaction.Commit());
  return events;
}

absl::StatusOr<std::vector<std::vector<JobEventRecord>>> JobStore::UpdateJobs(
    std::vector<JobUpdate> updates) {
  LORAPLEX_RETURN_IF_ERROR(StoreWriteFault("update_jobs"));
  absl::MutexLock lock(&mu_);
  std::vector<std::vector<JobEventRecord>> stored;
  if (updates.empty()) return stored;
  Transaction transaction(db_);
  LORAPLEX_RETURN_IF_ERROR(transaction.Begin());
  for (JobUpdate& update : updates) {
    LORAPLEX_ASSIGN_OR_RETURN(
        std::vector<JobEventRecord> events,
        UpdateJobRow(db_, update.job, std::move(update.events)));
    stored.push_back(std::move(events));
  }
  LORAPLEX_RETURN_IF_ERROR(transaction.Commit());
  return stored;
}

absl::StatusOr<JobRecord> JobStore::GetJob(const std::string& tenant,
                                           const std::string& id) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(db_, absl::StrCat("SELECT ", JobColumns(),
                                           " FROM jobs WHERE id = ? AND "
                                           "(? = '' OR tenant = ?)")));
  select.BindText(id);
  select.BindText(tenant);
  select.BindText(tenant);
  LORAPLEX_ASSIGN_OR_RETURN(bool found, select.Step());
  if (!found) return NotFound("job", id);
  return ReadJob(select);
}

absl::StatusOr<Page<JobRecord>> JobStore::ListJobs(
    const std::string& tenant, const std::vector<JobStatus>& statuses,
    int page_size, const std::string& page_token) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_RETURN_IF_ERROR(CheckPageSize(page_size));
  // In enum order without repeats, so equal filters name the same listing.
  std::vector<absl::string_view> filter;
  for (JobStatus status : kAllJobStatuses) {
    for (JobStatus wanted : statuses) {
      if (wanted == status) {
        filter.push_back(JobStatusName(status));
        break;
      }
    }
  }
  const std::string listing =
      ListingName("jobs", tenant, absl::StrJoin(filter, ","));
  LORAPLEX_ASSIGN_OR_RETURN(int64_t after,
                            DecodePageToken(page_token, listing));
  std::string sql = absl::StrCat("SELECT ", JobColumns(),
                                 ", row_id FROM jobs WHERE tenant = ? AND "
                                 "row_id > ?");
  if (!filter.empty()) {
    absl::StrAppend(&sql, " AND status IN (", Placeholders(filter.size()), ")");
  }
  absl::StrAppend(&sql, " ORDER BY row_id LIMIT ?");
  LORAPLEX_ASSIGN_OR_RETURN(Statement select, Statement::Prepare(db_, sql));
  select.BindText(tenant);
  select.BindInt(after);
  for (absl::string_view name : filter) select.BindText(name);
  select.BindInt(page_size + 1);
  return ReadPage<JobRecord>(select, page_size, kNumJobColumns, listing,
                             ReadJob);
}

absl::StatusOr<std::vector<JobRecord>> JobStore::JobsWithStatus(
    const std::vector<JobStatus>& statuses) {
  absl::MutexLock lock(&mu_);
  if (statuses.empty()) return std::vector<JobRecord>();
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(
          db_,
          absl::StrCat("SELECT ", JobColumns(), " FROM jobs WHERE status IN (",
                       Placeholders(statuses.size()), ") ORDER BY row_id")));
  for (JobStatus status : statuses) select.BindText(JobStatusName(status));
  return ReadAllRows<JobRecord>(select, ReadJob);
}

absl::StatusOr<std::vector<JobEventRecord>> JobStore::ListJobEvents(
    const std::string& job_id, int64_t after_sequence, int limit) {
  absl::MutexLock lock(&mu_);
  if (limit < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit must be at least 1, got ", limit));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(db_, absl::StrCat("SELECT ", EventColumns(),
                                           " FROM job_events WHERE job_id = ? "
                                           "AND sequence > ? ORDER BY "
                                           "sequence LIMIT ?")));
  select.BindText(job_id);
  select.BindInt(after_sequence);
  select.BindInt(limit);
  return ReadAllRows<JobEventRecord>(select, ReadEvent);
}

absl::Status JobStore::DeleteJob(const std::string& tenant,
                                 const std::string& id) {
  absl::MutexLock lock(&mu_);
  Transaction transaction(db_);
  LORAPLEX_RETURN_IF_ERROR(transaction.Begin());
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(
          db_, "SELECT status FROM jobs WHERE id = ? AND tenant = ?"));
  select.BindText(id);
  select.BindText(tenant);
  LORAPLEX_ASSIGN_OR_RETURN(bool found, select.Step());
  if (!found) return NotFound("job", id);
  const std::string status = select.Text(0);
  bool terminal = false;
  for (JobStatus candidate : kAllJobStatuses) {
    if (JobStatusName(candidate) == status) terminal = IsTerminal(candidate);
  }
  if (!terminal) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", id, "\" is ", status,
                     "; cancel it (or let it finish) before deleting it"));
  }
  for (const char* sql : {"DELETE FROM job_events WHERE job_id = ?",
                          "DELETE FROM jobs WHERE id = ?",
                          "DELETE FROM requests WHERE resource_id = ?"}) {
    LORAPLEX_ASSIGN_OR_RETURN(Statement erase, Statement::Prepare(db_, sql));
    erase.BindText(id);
    LORAPLEX_RETURN_IF_ERROR(erase.Run());
  }
  return transaction.Commit();
}

absl::Status JobStore::DeleteAdapter(const std::string& tenant,
                                     const std::string& id) {
  absl::MutexLock lock(&mu_);
  return DeleteUnlessUsed(db_, kAdapters, tenant, id, "initial_adapter_id = ?1",
                          "is the starting point of");
}

absl::StatusOr<std::vector<std::string>> JobStore::AllIds(Table table) {
  const char* name = table == Table::kDatasets ? "datasets"
                     : table == Table::kJobs   ? "jobs"
                                               : "adapters";
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(db_, absl::StrCat("SELECT id FROM ", name)));
  std::vector<std::string> ids;
  for (;;) {
    LORAPLEX_ASSIGN_OR_RETURN(bool row, select.Step());
    if (!row) return ids;
    ids.push_back(select.Text(0));
  }
}

absl::Status JobStore::InsertAdapter(const AdapterRecord& adapter) {
  LORAPLEX_RETURN_IF_ERROR(StoreWriteFault("insert_adapter"));
  absl::MutexLock lock(&mu_);
  return InsertOwned(db_, kAdapters, adapter);
}

absl::StatusOr<AdapterRecord> JobStore::GetAdapter(const std::string& tenant,
                                                   const std::string& id) {
  absl::MutexLock lock(&mu_);
  return GetOwned(db_, kAdapters, tenant, id);
}

absl::StatusOr<Page<AdapterRecord>> JobStore::ListAdapters(
    const std::string& tenant, int page_size, const std::string& page_token) {
  absl::MutexLock lock(&mu_);
  return ListOwned(db_, kAdapters, tenant, page_size, page_token);
}

}  // namespace loraplex
