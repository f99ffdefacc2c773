// The side channel of the two-process test and bench programs
// (write_check, bench/qp_sweep): one TCP connection over which the two ends
// swap what their QPs need (QPNs, GIDs, rkeys), with Nagle off.
#pragma once

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <string>

// Listens on 127.0.0.1:port (every address with TCP_PAIR_ANY=1: a peer in
// a VM or namespace, as the interop suite's) and accepts one connection;
// the fd, or -1.
inline int TcpAcceptOne(int port) {
  const int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0) return -1;
  const int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  const char* any = std::getenv("TCP_PAIR_ANY");
  sa.sin_addr.s_addr = htonl(any != nullptr && any[0] == '1' ? INADDR_ANY : INADDR_LOOPBACK);
  int fd = -1;
  if (bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 && listen(ls, 1) == 0) {
    fd = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  }
  close(ls);
  if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Connects to host:port (IPv4); the fd, or -1.
inline int TcpConnect(const char* host, int port) {
  addrinfo hints{}, *ai = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, std::to_string(port).c_str(), &hints, &ai) != 0) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  const int one = 1;
  if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Writes all n bytes; false on an error.
inline bool TcpWriteAll(int fd, const void* p, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t k = write(fd, static_cast<const char*>(p) + done, n - done);
    if (k <= 0) return false;
    done += static_cast<size_t>(k);
  }
  return true;
}

// Reads n bytes: 1 when they came, 0 at end of file before the first one,
// -1 on an error or an end of file in mid-message.
inline int TcpReadAll(int fd, void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t k = read(fd, static_cast<char*>(p) + got, n - got);
    if (k == 0 && got == 0) return 0;
    if (k <= 0) return -1;
    got += static_cast<size_t>(k);
  }
  return 1;
}
