// SHA-256 digests (lowercase hex) of byte strings, for stored datasets and
// adapters, through OpenSSL's EVP interface.
//
//   Sha256 digest;
//   digest.Update(chunk1);
//   digest.Update(chunk2);
//   std::string hex = digest.HexDigest();
#ifndef LORAPLEX_CORE_COMMON_SHA256_H_
#define LORAPLEX_CORE_COMMON_SHA256_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace loraplex {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view bytes);
  // The digest of everything passed to Update; call once.
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string Sha256Hex(absl::string_view bytes);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_SHA256_H_
