// A self-signed certificate for the loopback address (127.0.0.1 and
// localhost), made by the openssl tool for one test: `dir`/cert.pem and
// `dir`/key.pem.
#ifndef LORAPLEX_TESTS_COMMON_TLS_FILES_H_
#define LORAPLEX_TESTS_COMMON_TLS_FILES_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"

namespace loraplex {

inline absl::Status MakeLoopbackCertificate(const std::string& dir) {
  const std::string log = dir + "/openssl.log";
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
      dir + "/key.pem -out " + dir + "/cert.pem 2> " + log;
  if (std::system(command.c_str()) == 0) return absl::OkStatus();
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return absl::InternalError("openssl req failed: " + text.str());
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_TLS_FILES_H_
