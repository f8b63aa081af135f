// Fuzz target: local_docker's reader of sbx-agent's frames (plugins/local_docker/frames.hpp), fed
// what a hostile root in a sandbox can send in the agent's place. The input is cut into pieces at
// the places its first byte chooses (a stream arrives in any chunking); every 'x' payload goes
// through parse_command_end. Errors are sdk::Error; anything else (a crash, an overflow, a leak,
// an exception of another type) is a finding.
#include "frames.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  sbx::local_docker::FrameParser parser;
  try {
    while (!input.empty()) {
      const size_t n = input.size() < piece ? input.size() : piece;
      parser.feed(input.substr(0, n), [](char kind, std::string_view payload) {
        if (kind != 'x') return;
        try {
          const auto end = sbx::local_docker::parse_command_end(payload);
          if (!end.status && !end.sandbox_expired && !end.not_started) __builtin_trap();
        } catch (const sbx::sdk::Error&) {
        }
      });
      input.remove_prefix(n);
    }
  } catch (const sbx::sdk::Error&) {
  }
  return 0;
}
