// The small synthetic dataset `loraplex quickstart` trains on: reversing
// short lowercase words, as JSONL prompt/completion lines
// ({"prompt": "reverse: lamp\n", "completion": "pmal"}). Generated in code,
// the same on every run and platform, so nothing needs downloading.
//
//   std::string jsonl = QuickstartDatasetJsonl();
//   client->UploadDatasetContents(jsonl, "quickstart-reverse");
#ifndef LORAPLEX_CLIENT_QUICKSTART_DATA_H_
#define LORAPLEX_CLIENT_QUICKSTART_DATA_H_

#include <string>
#include <vector>

namespace loraplex {

inline constexpr int kQuickstartExampleCount = 64;
// The prompt each trained adapter answers at the end of the quickstart.
inline constexpr char kQuickstartSamplePrompt[] = "reverse: lamp\n";

struct QuickstartExample {
  std::string prompt;
  std::string completion;
};

// `count` examples (negative counts as 0); the first n of a longer list
// equal the list of n.
std::vector<QuickstartExample> QuickstartExamples(
    int count = kQuickstartExampleCount);

// The examples as JSONL, one {"prompt", "completion"} object per line, each
// line ending in '\n'.
std::string QuickstartDatasetJsonl(int count = kQuickstartExampleCount);

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_QUICKSTART_DATA_H_
