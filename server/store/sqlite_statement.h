// A thin RAII layer over the sqlite3 C API for the job store (internal to
// server/store/, included only by job_store.cc): prepared statements bound
// in column order, transactions that roll back unless committed, and
// sqlite errors as absl::Status.
//
//   LORAPLEX_ASSIGN_OR_RETURN(Statement select, Statement::Prepare(db, sql));
//   select.BindText(id);
//   LORAPLEX_ASSIGN_OR_RETURN(bool has_row, select.Step());
#ifndef LORAPLEX_SERVER_STORE_SQLITE_STATEMENT_H_
#define LORAPLEX_SERVER_STORE_SQLITE_STATEMENT_H_

#include <sqlite3.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace store_internal {

// "?, ?, ?" for a statement's values or IN list.
inline std::string Placeholders(size_t count) {
  std::vector<absl::string_view> marks(count, "?");
  return absl::StrJoin(marks, ", ");
}

inline absl::Status SqliteError(sqlite3* db, absl::string_view context) {
  return absl::InternalError(
      absl::StrCat("sqlite: ", context, ": ", sqlite3_errmsg(db)));
}

inline absl::Status Exec(sqlite3* db, const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &message) == SQLITE_OK) {
    return absl::OkStatus();
  }
  absl::Status status = absl::InternalError(
      absl::StrCat("sqlite: ", absl::string_view(sql).substr(0, 40), ": ",
                   message != nullptr ? message : sqlite3_errmsg(db)));
  sqlite3_free(message);
  return status;
}

// One prepared statement; values are bound in column order and read back
// by column index.
class Statement {
 public:
  static absl::StatusOr<Statement> Prepare(sqlite3* db, absl::string_view sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt,
                           nullptr) != SQLITE_OK) {
      sqlite3_finalize(stmt);
      return SqliteError(db, absl::StrCat("preparing ", sql.substr(0, 40)));
    }
    return Statement(db, stmt);
  }
  Statement(Statement&& other) noexcept
      : db_(other.db_),
        stmt_(std::exchange(other.stmt_, nullptr)),
        next_index_(other.next_index_),
        bind_result_(other.bind_result_) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  void BindInt(int64_t value) {
    Check(sqlite3_bind_int64(stmt_, next_index_++, value));
  }
  void BindText(absl::string_view value) {
    Check(sqlite3_bind_text64(stmt_, next_index_++, value.data(), value.size(),
                              SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  // SQLite stores a bound NaN as NULL, so NaN is kept as the text "NaN"
  // (REAL columns keep text that is not a number as text).
  void BindDouble(double value) {
    if (std::isnan(value)) {
      BindText("NaN");
    } else {
      Check(sqlite3_bind_double(stmt_, next_index_++, value));
    }
  }
  void BindOptionalDouble(const std::optional<double>& value) {
    if (value.has_value()) {
      BindDouble(*value);
    } else {
      BindNull();
    }
  }
  void BindBlob(absl::string_view value) {
    Check(sqlite3_bind_blob64(stmt_, next_index_++, value.data(), value.size(),
                              SQLITE_TRANSIENT));
  }
  void BindNull() { Check(sqlite3_bind_null(stmt_, next_index_++)); }

  // True while there is a row to read. A UNIQUE or PRIMARY KEY violation
  // is ALREADY_EXISTS (callers name the record); other errors INTERNAL.
  absl::StatusOr<bool> Step() {
    if (bind_result_ != SQLITE_OK) {
      return absl::InternalError(absl::StrCat("sqlite: binding a value of ",
                                              Sql(), ": ",
                                              sqlite3_errstr(bind_result_)));
    }
    const int result = sqlite3_step(stmt_);
    if (result == SQLITE_ROW) return true;
    if (result == SQLITE_DONE) return false;
    if (result == SQLITE_CONSTRAINT_UNIQUE ||
        result == SQLITE_CONSTRAINT_PRIMARYKEY) {
      return absl::AlreadyExistsError(sqlite3_errmsg(db_));
    }
    return SqliteError(db_, Sql());
  }
  // Runs a statement that returns no rows.
  absl::Status Run() { return Step().status(); }
  // Makes the statement ready to bind and run again.
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    next_index_ = 1;
    bind_result_ = SQLITE_OK;
  }

  int64_t Int(int column) const { return sqlite3_column_int64(stmt_, column); }
  double Double(int column) const {
    if (sqlite3_column_type(stmt_, column) == SQLITE_TEXT) {
      return std::numeric_limits<double>::quiet_NaN();
    }
    return sqlite3_column_double(stmt_, column);
  }
  std::optional<double> OptionalDouble(int column) const {
    if (IsNull(column)) return std::nullopt;
    return Double(column);
  }
  std::string Text(int column) const {
    const auto* text =
        reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    if (text == nullptr) return "";
    return std::string(text, sqlite3_column_bytes(stmt_, column));
  }
  std::string Blob(int column) const {
    const auto* bytes =
        static_cast<const char*>(sqlite3_column_blob(stmt_, column));
    if (bytes == nullptr) return "";
    return std::string(bytes, sqlite3_column_bytes(stmt_, column));
  }
  bool IsNull(int column) const {
    return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
  }

 private:
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}

  void Check(int result) {
    if (bind_result_ == SQLITE_OK) bind_result_ = result;
  }
  std::string Sql() const {
    return std::string(absl::string_view(sqlite3_sql(stmt_)).substr(0, 40));
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int next_index_ = 1;
  int bind_result_ = SQLITE_OK;
};

// BEGIN IMMEDIATE takes the write lock up front, so a transaction never
// fails half-way for want of it; the destructor rolls back unless
// Commit() succeeded.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }

  absl::Status Begin() {
    LORAPLEX_RETURN_IF_ERROR(Exec(db_, "BEGIN IMMEDIATE"));
    open_ = true;
    return absl::OkStatus();
  }
  absl::Status Commit() {
    LORAPLEX_RETURN_IF_ERROR(Exec(db_, "COMMIT"));
    open_ = false;
    return absl::OkStatus();
  }

 private:
  sqlite3* db_;
  bool open_ = false;
};

// Every row of `stmt`, converted by read_row(const Statement&), which
// returns absl::StatusOr<Record>.
template <typename Record, typename ReadRow>
absl::StatusOr<std::vector<Record>> ReadAllRows(Statement& stmt,
                                                ReadRow read_row) {
  std::vector<Record> records;
  while (true) {
    LORAPLEX_ASSIGN_OR_RETURN(bool has_row, stmt.Step());
    if (!has_row) break;
    LORAPLEX_ASSIGN_OR_RETURN(Record record, read_row(stmt));
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace store_internal
}  // namespace loraplex

#endif  // LORAPLEX_SERVER_STORE_SQLITE_STATEMENT_H_
