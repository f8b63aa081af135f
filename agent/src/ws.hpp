// WebSocket (RFC 6455) pieces for the agent's PTY sessions: SHA-1 and base64 for the handshake's
// Sec-WebSocket-Accept, server frames, and a parser of client frames. No I/O here; every function
// is pure and reentrant (the parser is a value owned by its connection).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sbx::agent::ws {

/// SHA-1 of `data` (FIPS 180-4). Pure.
std::array<uint8_t, 20> sha1(std::string_view data);

/// Standard base64 (RFC 4648, with padding) of `data`. Pure.
std::string base64(std::string_view data);

/// Whether `key` is a valid Sec-WebSocket-Key: base64 of exactly 16 bytes (24 characters). Pure.
bool valid_key(std::string_view key);

/// Sec-WebSocket-Accept for `key`: base64(SHA-1(key + the RFC's GUID)). Pure.
std::string accept_key(std::string_view key);

enum Opcode : uint8_t {
  kContinuation = 0x0,
  kText = 0x1,
  kBinary = 0x2,
  kClose = 0x8,
  kPing = 0x9,
  kPong = 0xA,
};

/// A whole, unmasked server frame (FIN set) of `opcode` carrying `payload`. Pure.
std::string frame(uint8_t opcode, std::string_view payload);

/// A close frame's payload: the code (2 bytes, big-endian) and a reason (cut to 123 bytes). Pure.
std::string close_payload(uint16_t code, std::string_view reason);

/// One client frame, unmasked.
struct Frame {
  uint8_t opcode = 0;
  std::string payload;
};

/// Reads client frames from a connection's input. A value owned by its connection.
class Parser {
 public:
  enum class Result { need_more, frame, error };

  /// At most `max_payload` bytes in one frame's payload (a longer one is an error, 1009).
  explicit Parser(std::size_t max_payload) : max_payload_(max_payload) {}

  /// Takes one frame from the front of `in` into `out` (erasing its bytes from `in`). On error,
  /// `error_code` and `error_reason` say what to close the connection with: 1002 for an unmasked
  /// frame, reserved bits or opcodes, a fragmented message (not supported) or a bad control
  /// frame; 1009 for a frame above the cap.
  Result next(std::string& in, Frame& out);
  /// The same from `in` at `pos`, which advances past the frame taken: a reader of many frames
  /// erases what they took once, not frame by frame (that would be quadratic).
  Result next(std::string_view in, std::size_t& pos, Frame& out);

  uint16_t error_code = 0;
  std::string error_reason;

 private:
  std::size_t max_payload_;
};

}  // namespace sbx::agent::ws
