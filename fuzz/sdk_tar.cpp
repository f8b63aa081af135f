// Fuzz target: the SDK's tar reader (sbx/sdk/tar.hpp), which reads Docker's archive of a file a
// sandbox wrote (local_docker's downloads without the agent): names, sizes, PAX records and data
// are the sandbox's. The input is cut into pieces at the places its first byte chooses. Errors are
// sdk::Error; anything else, or data delivered past an entry's size, is a finding.
#include <sbx/sdk/error.hpp>
#include <sbx/sdk/tar.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace {

struct Handler final : sbx::sdk::tar::Reader::Handler {
  uint64_t size = 0, delivered = 0;
  bool open = false;
  void on_entry(const sbx::sdk::tar::Entry& entry) override {
    if (open) __builtin_trap();
    open = true;
    size = entry.size;
    delivered = 0;
  }
  void on_data(std::string_view bytes) override {
    if (!open) __builtin_trap();
    delivered += bytes.size();
    if (delivered > size) __builtin_trap();
  }
  void on_entry_end() override {
    if (!open || delivered != size) __builtin_trap();
    open = false;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] * 8;
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  Handler handler;
  sbx::sdk::tar::Reader reader(handler);
  try {
    while (!input.empty()) {
      const size_t n = input.size() < piece ? input.size() : piece;
      reader.feed(input.substr(0, n));
      input.remove_prefix(n);
    }
    reader.finish();
  } catch (const sbx::sdk::Error&) {
  }
  return 0;
}
