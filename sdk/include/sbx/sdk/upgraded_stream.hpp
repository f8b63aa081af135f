// sbx::sdk::UpgradedStream: an HTTP/1.1 connection its server switched to another protocol by
// answering 101 Switching Protocols, then a plain byte stream both ways (target sbx::sdk_http).
// Under sdk::WebSocket (`Upgrade: websocket`), and for Docker's hijacked exec streams
// (`Upgrade: tcp` on POST /exec/{id}/start), which libcurl does not hand over. Blocking, over a
// Unix-domain socket or plain TCP; no TLS.
//
// THREADING: send() is for one sender at a time (the caller serialises), read_some() for one
// reader thread at a time; shutdown() may be called from any thread, at any time: it wakes a
// read_some() blocked in the kernel, which then returns false.
//
// ERRORS: open() throws Error::unavailable (no connection; the server answered without switching:
// "POST /x on /run/docker.sock was not upgraded: HTTP/1.1 404 Not Found: <body's first bytes>")
// or Error::timeout (the connection or the answer took longer than `timeout`). send() throws
// Error::timeout when the peer has not read for `timeout` and Error::unavailable once the
// connection is gone; either way the stream is shut down (a write cut short cannot be resumed).
#pragma once

#include <sbx/sdk/error.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::sdk {

class UpgradedStream {
 public:
  struct Endpoint {
    std::string unix_socket;  // when set, host and port are not used
    // false: the unix socket is reached without following a symbolic link anywhere in its path
    // (sbx/sdk/unix_socket.hpp), for a socket in a directory a sandbox can write to.
    bool follow_links = true;
    std::string host = "127.0.0.1";
    uint16_t port = 0;
  };
  struct Request {
    std::string method = "GET";
    std::string target;    // "/pty/ID/ws", "/v1.41/exec/ID/start"
    std::string protocol;  // the Upgrade header's value: "websocket", "tcp"
    std::vector<std::pair<std::string, std::string>> headers;  // added as they are (never logged)
    std::string body;  // sent with its Content-Length when not empty
  };

  // Connects, sends `request` with `Connection: Upgrade` and `Upgrade: <protocol>`, and reads the
  // answer's head: 101 with that Upgrade header, or the error above. `timeout` bounds the
  // connection and the answer, and later each send().
  static UpgradedStream open(const Endpoint& endpoint, const Request& request,
                             std::chrono::milliseconds timeout);

  UpgradedStream(UpgradedStream&& other) noexcept;
  UpgradedStream& operator=(UpgradedStream&&) = delete;
  UpgradedStream(const UpgradedStream&) = delete;
  ~UpgradedStream();  // closes the socket

  // Where it is connected ("/run/docker.sock", "127.0.0.1:8080"), for messages.
  const std::string& where() const noexcept { return where_; }

  void send(std::string_view bytes);
  // Appends what arrives next to `into` (first the bytes that came with the answer's head); false
  // at the end of the stream, on an error, or after shutdown().
  bool read_some(std::string& into);
  // Says the end of what this side sends (the peer reads an end of file); reading goes on.
  void shutdown_write() noexcept;
  void shutdown() noexcept;

 private:
  UpgradedStream(int fd, std::string where, std::string pending)
      : fd_(fd), where_(std::move(where)), pending_(std::move(pending)) {}

  int fd_ = -1;
  std::string where_;
  std::string pending_;  // read with the answer's head, not yet returned
};

}  // namespace sbx::sdk
