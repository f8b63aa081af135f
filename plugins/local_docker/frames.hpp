// The agent's frames as local_docker reads them (agent/README.md, "Frames"): what a command's
// stream through sbx-agent carries. Every byte here comes from inside a sandbox, whose root can put
// a program of its own in the agent's place: the parser keeps at most one frame's bounded payload,
// and the end of a command is read strictly. No dependency beyond the SDK's error and Boost.JSON,
// so the fuzz target (fuzz/local_docker_frames.cpp) builds it alone.
//
// THREADING: not thread-safe; one parser per stream.
#pragma once

#include <sbx/sdk/error.hpp>
#include <sbx/sdk/types.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::local_docker {

// Incremental parser of the frames: a kind byte, the payload's length (4 bytes, big-endian), the
// payload. The agent's frames carry at most 64 KiB; one longer than kMaxFramePayload is refused
// before its bytes are kept, so what the parser keeps is at most that and one read.
class FrameParser {
 public:
  static constexpr uint32_t kMaxFramePayload = 1024 * 1024;

  // Feeds bytes; calls `on_frame(kind, payload)` for every complete frame. Throws
  // sdk::Error::internal ("the sandbox's agent sent a frame of N bytes...") for a frame whose
  // payload is longer than kMaxFramePayload; the parser is then unusable.
  void feed(std::string_view bytes, const std::function<void(char, std::string_view)>& on_frame);

 private:
  std::string pending_;
};

// How a command ended, as its 'x' frame (a JSON object) says: exactly one of the fields is set.
struct CommandEnd {
  std::optional<sdk::ExitStatus> status;   // exit_code 0-255, 128 + signal 1-127, or timed out
  std::optional<int64_t> sandbox_expired;  // killed at the sandbox's expiry (Unix seconds)
  std::optional<std::string> not_started;  // it could not start: why ("error")
};
// Reads an 'x' payload. Throws sdk::Error::internal ("the sandbox's agent sent a bad end of
// command: ...") for anything else: not a JSON object, a value out of range, no known field.
CommandEnd parse_command_end(std::string_view payload);

}  // namespace sbx::local_docker
