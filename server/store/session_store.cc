// The job store's tables of training sessions, the Tinker API's names and
// the answers kept for late reads (job_store.h).
#include <sqlite3.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "server/store/job_store.h"
#include "server/store/sqlite_statement.h"

namespace loraplex {
namespace {

using store_internal::ReadAllRows;
using store_internal::Statement;

constexpr char kSessionColumns[] =
    "id, tenant, display_name, spec, state, reason, steps, slot, "
    "next_seq_id, idle_state, create_time_ms, last_activity_ms";

absl::StatusOr<nlohmann::json> ParseStoredJson(const std::string& text,
                                               absl::string_view what) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded()) {
    return absl::DataLossError(absl::StrCat("stored ", what, " is not JSON"));
  }
  return json;
}

absl::StatusOr<SessionRecord> ReadSession(const Statement& row) {
  SessionRecord session;
  session.id = row.Text(0);
  session.tenant = row.Text(1);
  session.display_name = row.Text(2);
  LORAPLEX_ASSIGN_OR_RETURN(
      session.spec,
      ParseStoredJson(row.Text(3), absl::StrCat("session ", session.id)));
  const std::optional<SessionState> state = SessionStateFromName(row.Text(4));
  if (!state.has_value()) {
    return absl::DataLossError(absl::StrCat(
        "session ", session.id, " has the state \"", row.Text(4), "\""));
  }
  session.state = *state;
  session.reason = row.Text(5);
  session.steps = row.Int(6);
  session.slot = static_cast<int>(row.Int(7));
  session.next_seq_id = row.Int(8);
  session.idle_state = row.Text(9);
  session.create_time_ms = row.Int(10);
  session.last_activity_ms = row.Int(11);
  return session;
}

}  // namespace

absl::Status JobStore::PutSession(const SessionRecord& session) {
  LORAPLEX_RETURN_IF_ERROR(StoreWriteFault("put_session"));
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement upsert,
      Statement::Prepare(
          db_,
          absl::StrCat("INSERT INTO sessions (", kSessionColumns,
                       ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                       "ON CONFLICT (id) DO UPDATE SET state = excluded.state, "
                       "reason = excluded.reason, steps = excluded.steps, "
                       "slot = excluded.slot, "
                       "next_seq_id = excluded.next_seq_id, "
                       "idle_state = excluded.idle_state, "
                       "last_activity_ms = excluded.last_activity_ms")));
  upsert.BindText(session.id);
  upsert.BindText(session.tenant);
  upsert.BindText(session.display_name);
  upsert.BindText(session.spec.dump());
  upsert.BindText(SessionStateName(session.state));
  upsert.BindText(session.reason);
  upsert.BindInt(session.steps);
  upsert.BindInt(session.slot);
  upsert.BindInt(session.next_seq_id);
  upsert.BindText(session.idle_state);
  upsert.BindInt(session.create_time_ms);
  upsert.BindInt(session.last_activity_ms);
  return upsert.Run();
}

absl::StatusOr<std::vector<SessionRecord>> JobStore::ListSessions() {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(db_, absl::StrCat("SELECT ", kSessionColumns,
                                           " FROM sessions ORDER BY row_id")));
  return ReadAllRows<SessionRecord>(select, ReadSession);
}

absl::Status JobStore::PutTinkerName(const TinkerNameRecord& name) {
  LORAPLEX_RETURN_IF_ERROR(StoreWriteFault("put_tinker_name"));
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement upsert,
      Statement::Prepare(db_,
                         "INSERT OR REPLACE INTO tinker_names (name, kind, "
                         "tenant, value) VALUES (?, ?, ?, ?)"));
  upsert.BindText(name.name);
  upsert.BindText(name.kind);
  upsert.BindText(name.tenant);
  upsert.BindText(name.value.dump());
  return upsert.Run();
}

absl::StatusOr<std::vector<TinkerNameRecord>> JobStore::ListTinkerNames() {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(db_,
                         "SELECT name, kind, tenant, value FROM tinker_names "
                         "ORDER BY rowid"));
  return ReadAllRows<TinkerNameRecord>(
      select, [](const Statement& row) -> absl::StatusOr<TinkerNameRecord> {
        TinkerNameRecord name;
        name.name = row.Text(0);
        name.kind = row.Text(1);
        name.tenant = row.Text(2);
        LORAPLEX_ASSIGN_OR_RETURN(
            name.value,
            ParseStoredJson(row.Text(3), absl::StrCat("name ", name.name)));
        return name;
      });
}

absl::Status JobStore::DeleteTinkerName(const std::string& name) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement erase,
      Statement::Prepare(db_, "DELETE FROM tinker_names WHERE name = ?"));
  erase.BindText(name);
  return erase.Run();
}

absl::Status JobStore::PutResult(const StoredResultRecord& result) {
  LORAPLEX_RETURN_IF_ERROR(StoreWriteFault("put_result"));
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement insert,
      Statement::Prepare(db_,
                         "INSERT OR REPLACE INTO results (owner, seq, code, "
                         "message, body, content_type, time_ms) VALUES (?, ?, "
                         "?, ?, ?, ?, ?)"));
  insert.BindText(result.owner);
  insert.BindInt(result.seq);
  insert.BindInt(result.code);
  insert.BindText(result.message);
  insert.BindBlob(result.body);
  insert.BindText(result.content_type);
  insert.BindInt(result.time_ms);
  return insert.Run();
}

absl::StatusOr<std::vector<StoredResultRecord>> JobStore::ListResults(
    int64_t since_ms) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement select,
      Statement::Prepare(db_,
                         "SELECT owner, seq, code, message, body, "
                         "content_type, time_ms FROM results WHERE time_ms "
                         ">= ? ORDER BY time_ms"));
  select.BindInt(since_ms);
  return ReadAllRows<StoredResultRecord>(
      select, [](const Statement& row) -> absl::StatusOr<StoredResultRecord> {
        StoredResultRecord result;
        result.owner = row.Text(0);
        result.seq = row.Int(1);
        result.code = static_cast<int>(row.Int(2));
        result.message = row.Text(3);
        result.body = row.Blob(4);
        result.content_type = row.Text(5);
        result.time_ms = row.Int(6);
        return result;
      });
}

absl::Status JobStore::DeleteResultsBefore(int64_t time_ms) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(
      Statement erase,
      Statement::Prepare(db_, "DELETE FROM results WHERE time_ms < ?"));
  erase.BindInt(time_ms);
  return erase.Run();
}

}  // namespace loraplex
