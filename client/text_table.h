// Plain-text tables and "Key: value" blocks for the CLI's human-readable
// output, aligned in columns.
//
//   TextTable table({"JOB", "STATUS"});
//   table.AddRow({"jobs/abc", "RUNNING"});
//   table.Print(std::cout);
//
//   PrintKeyValues(std::cout, {{"Version", "0.1.0"}, {"Slots", "4"}});
#ifndef LORAPLEX_CLIENT_TEXT_TABLE_H_
#define LORAPLEX_CLIENT_TEXT_TABLE_H_

#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace loraplex {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);

  // Rows shorter than the header are padded with empty cells.
  void AddRow(std::vector<std::string> cells);
  size_t num_rows() const { return rows_.size(); }

  // Header and rows, columns two spaces apart, each line without trailing
  // spaces.
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// "Key:   value" lines with the values aligned; pairs with an empty value
// are skipped.
void PrintKeyValues(
    std::ostream& out,
    const std::vector<std::pair<std::string, std::string>>& fields);

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_TEXT_TABLE_H_
