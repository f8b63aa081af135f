// Fuzz target: the SDK's WebSocket client's reading of a server's frames
// (sbx::sdk::parse_server_frame, sbx/sdk/websocket.hpp), what a sandbox's agent (or a program in
// its place) sends on a terminal's socket. The input is read as WebSocket::receive reads it: a
// frame at a time from the start, with a small limit so that "too big" is reached too. A verdict
// that does not hold for the bytes (a frame that does not fit, a header past the input) is a
// finding.
#include <sbx/sdk/websocket.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  using Verdict = sbx::sdk::ServerFrameHead::Verdict;
  for (;;) {
    const auto head = sbx::sdk::parse_server_frame(input, 4096);
    if (head.verdict != Verdict::frame) break;
    if (head.header > input.size() || head.length > input.size() - head.header) __builtin_trap();
    if (head.opcode >= 0x8 && head.length > 125) __builtin_trap();
    input.remove_prefix(head.header + static_cast<size_t>(head.length));
  }
  return 0;
}
