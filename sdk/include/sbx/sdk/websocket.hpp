// sbx::sdk::WebSocket: a small blocking WebSocket client (RFC 6455) for plugins (target
// sbx::sdk_http), for the routes a backend only serves that way, such as execd's terminals
// (`GET /pty/{id}/ws`). Over a Unix-domain socket or plain TCP; no TLS, no extensions, no
// fragmented messages (a fragment from the server is a protocol error, as for sbx-agent).
//
// The handshake (sdk::UpgradedStream) checks the status (101) and the Upgrade header;
// Sec-WebSocket-Accept is not checked (that would need SHA-1; the key guards against caching
// proxies, which a Unix socket or a loopback port has none of).
//
// THREADING: send_*() and close() are thread-safe (one frame at a time, whole); receive() is for
// one reader thread at a time. shutdown() may be called from any thread, at any time: it wakes a
// receive() blocked in the kernel, which then returns nullopt.
//
// ERRORS: open() throws Error::unavailable (no connection, the handshake refused: the status and
// body's first bytes in the message) or Error::timeout; send_*() throws Error::unavailable once
// the connection is gone, and Error::timeout when the peer has not read for open()'s `timeout`
// (the frame is then cut short, so the connection is shut down).
#pragma once

#include <sbx/sdk/error.hpp>
#include <sbx/sdk/upgraded_stream.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::sdk {

// The head of a frame from a server, as a client reads it (RFC 6455 section 5.2), at the start of
// `bytes`. Pure and bounded: for WebSocket::receive, and for its fuzz target.
struct ServerFrameHead {
  enum class Verdict {
    incomplete,      // more bytes are needed to know
    frame,           // a whole frame: opcode, payload at [header, header + length)
    protocol_error,  // reserved bits, a masked frame, a fragment, an unknown opcode, a control
                     // frame over 125 bytes: close 1002
    too_big,         // a payload over the limit: close 1009
  };
  Verdict verdict = Verdict::incomplete;
  uint8_t opcode = 0;
  size_t header = 0;
  uint64_t length = 0;
};
ServerFrameHead parse_server_frame(std::string_view bytes, size_t max_payload);

class WebSocket {
 public:
  using Endpoint = UpgradedStream::Endpoint;
  struct Message {
    enum class Kind { text, binary, close };
    Kind kind = Kind::binary;
    std::string payload;      // for close: the reason
    uint16_t close_code = 0;  // for close: 1005 when the frame had none
  };

  // Connects and upgrades `target` ("/pty/ID/ws?pty=1"), with `headers` added to the request.
  // `timeout` bounds the connection, the handshake, and later each send.
  static WebSocket open(const Endpoint& endpoint, const std::string& target,
                        const std::vector<std::pair<std::string, std::string>>& headers,
                        std::chrono::milliseconds timeout);

  WebSocket(WebSocket&& other) noexcept
      : stream_(std::move(other.stream_)), in_(std::move(other.in_)) {}
  WebSocket& operator=(WebSocket&&) = delete;
  WebSocket(const WebSocket&) = delete;
  ~WebSocket() = default;  // closes the socket (without a close frame)

  void send_text(std::string_view payload) { send(0x1, payload); }
  void send_binary(std::string_view payload) { send(0x2, payload); }
  // A close frame with `code`; the connection stays open until the peer's close arrives.
  void close(uint16_t code = 1000);

  // The next message; pings are answered and pongs dropped on the way. A close frame is
  // returned once (answered with one of ours); after it, or when the connection ended without
  // one or shutdown() was called: nullopt. A protocol error from the server (a fragment, a frame
  // over `max_message` bytes, reserved bits) closes with 1002 or 1009 and returns nullopt.
  std::optional<Message> receive(size_t max_message = size_t{16} << 20);

  void shutdown() noexcept;

 private:
  explicit WebSocket(UpgradedStream stream) : stream_(std::move(stream)) {}
  void send(uint8_t opcode, std::string_view payload);

  UpgradedStream stream_;
  std::string in_;  // bytes read and not yet parsed
  std::mutex send_mutex_;
  bool close_sent_ = false;  // guarded by send_mutex_
};

}  // namespace sbx::sdk
