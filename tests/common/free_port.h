// A TCP port on 127.0.0.1 that nothing listens on right now (for a
// rendezvous of test processes; another program may still take it first).
#ifndef LORAPLEX_TESTS_COMMON_FREE_PORT_H_
#define LORAPLEX_TESTS_COMMON_FREE_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace loraplex {

// -1 when no socket could be bound.
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_FREE_PORT_H_
