// Fuzz target: the opensandbox plugin's reader of execd's command event stream
// (plugins/opensandbox/events.hpp), fed what a sandbox's execd can send. The input is cut into
// pieces at the places its first byte chooses; every event goes through exit_status_of. Errors are
// sdk::Error; anything else is a finding.
#include "events.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 97;
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  sbx::opensandbox::EventStreamParser parser;
  try {
    while (!input.empty()) {
      const size_t n = input.size() < piece ? input.size() : piece;
      parser.feed(input.substr(0, n), [](const sbx::opensandbox::EventStreamParser::Event& e) {
        const auto status = sbx::opensandbox::exit_status_of(e, (e.text.size() & 1) != 0);
        if (status.return_code < 0 || status.return_code > 255) __builtin_trap();
      });
      input.remove_prefix(n);
    }
  } catch (const sbx::sdk::Error&) {
  }
  return 0;
}
