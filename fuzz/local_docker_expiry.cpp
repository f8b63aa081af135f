// Fuzz target: local_docker's expiry file parsers (plugins/local_docker/reaper/expiry_file.hpp),
// shared by the plugin and the static reaper: the file's text, and the tar the reaper reads
// through Docker's archive API. Header-only and without dependencies.
#include "reaper/expiry_file.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  namespace expiry = sbx::local_docker::expiry;
  if (const auto value = expiry::parse_file(input); value && *value < 0) __builtin_trap();
  if (const auto value = expiry::parse_archive(input); value && *value < 0) __builtin_trap();
  return 0;
}
