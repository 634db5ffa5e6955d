#include "client/text_table.h"

#include <algorithm>

namespace loraplex {

TextTable::TextTable(std::vector<std::string> header)
    : header_(std::move(header)) {}

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(std::max(cells.size(), header_.size()));
  rows_.push_back(std::move(cells));
}

void TextTable::Print(std::ostream& out) const {
  std::vector<size_t> widths(header_.size(), 0);
  auto measure = [&widths](const std::vector<std::string>& row) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  };
  measure(header_);
  for (const auto& row : rows_) measure(row);
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) line += "  ";
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size(), ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  };
  print_row(header_);
  for (const auto& row : rows_) print_row(row);
}

void PrintKeyValues(
    std::ostream& out,
    const std::vector<std::pair<std::string, std::string>>& fields) {
  size_t key_width = 0;
  for (const auto& [key, value] : fields) {
    if (!value.empty()) key_width = std::max(key_width, key.size());
  }
  for (const auto& [key, value] : fields) {
    if (value.empty()) continue;
    out << key << ":" << std::string(key_width - key.size() + 2, ' ') << value
        << "\n";
  }
}

}  // namespace loraplex
