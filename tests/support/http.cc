#include "tests/support/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace cloister::testing {

std::string HttpGet(const std::string& host_port, const std::string& path) {
  size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port))
    return "";
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &address.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return "";
  }
  std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  if (::write(fd, request.data(), request.size()) < 0) {
    ::close(fd);
    return "";
  }
  std::string response;
  char buffer[8192];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  ::close(fd);
  return response;
}

}  // namespace cloister::testing
