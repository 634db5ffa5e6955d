// The text of a sample as its tokens arrive, handed out in pieces that can
// no longer change: never an incomplete character, never what could still
// turn out to be the start of a stop string, nothing past a stop string.
// Both streaming edges (gRPC StreamSample, the OpenAI API's server-sent
// events) cut their deltas with it.
//
//   StreamText text(&tokenizer, request.stop);
//   for (int64_t token : drawn) send(text.Append(token));
//   send(text.Finish(final_text));  // What the stream has not shown yet.
#ifndef LORAPLEX_SERVER_EDGES_STREAM_TEXT_H_
#define LORAPLEX_SERVER_EDGES_STREAM_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace loraplex {

class Tokenizer;

class StreamText {
 public:
  // `tokenizer` must outlive this.
  StreamText(const Tokenizer* tokenizer, std::vector<std::string> stops);

  // Adds a drawn token; answers the text newly settled (often empty).
  std::string Append(int64_t token);
  // The rest of `final_text` (the sample's whole text, cut at its stop
  // string; bytes that are not UTF-8 become replacement characters, as in
  // Append's pieces) after what Append has handed out.
  std::string Finish(const std::string& final_text) const;

  // Bytes handed out so far.
  size_t sent_bytes() const { return sent_bytes_; }

 private:
  const Tokenizer* tokenizer_;
  std::vector<std::string> stops_;
  size_t holdback_ = 0;
  std::vector<int64_t> tokens_;
  size_t sent_bytes_ = 0;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_EDGES_STREAM_TEXT_H_
