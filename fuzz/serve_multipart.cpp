// Fuzz target: sbx serve's multipart reader (serve/multipart.hpp), over a POST /files/upload body
// as a client sends it. The input's first byte chooses the boundary (a short one that random bytes
// meet often, or a long one) and how the rest is split into pieces (sizes cycling through three
// lengths, some above twice the delimiter, so that both the reader's copy-free path and its
// byte-by-byte path cross piece edges); what the reader finds piece by piece (each part's headers,
// its body joined, its end; whether the body ended; the error) must be what it finds in the body
// given whole, and it must never keep more than its bounds.
#include "multipart.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

class Record final : public sbx::serve::MultipartReader::Handler {
 public:
  bool begin_part(std::string_view headers) override {
    if (open_) __builtin_trap();  // a part begins inside another
    if (headers.size() > sbx::serve::MultipartReader::kMaxPartHeaders) __builtin_trap();
    events.push_back("begin:" + std::string(headers));
    events.emplace_back("body:");
    open_ = true;
    return true;
  }
  bool part_bytes(std::string_view bytes) override {
    if (!open_ || bytes.empty()) __builtin_trap();
    events.back().append(bytes);
    return true;
  }
  bool end_part() override {
    if (!open_) __builtin_trap();
    open_ = false;
    events.emplace_back("end");
    return true;
  }
  std::vector<std::string> events;

 private:
  bool open_ = false;
};

std::vector<std::string> read(std::string_view boundary, std::string_view body,
                              const std::vector<std::size_t>& pieces) {
  sbx::serve::MultipartReader reader(boundary);
  Record record;
  std::size_t at = 0;
  for (std::size_t i = 0; at < body.size(); ++i) {
    const std::size_t n = pieces.empty() ? body.size() : pieces[i % pieces.size()];
    if (!reader.feed(body.substr(at, n), record)) break;
    at += n;
  }
  record.events.push_back(reader.ended() ? "ended" : "open");
  record.events.push_back("error:" + reader.error());
  return record.events;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string boundary = data[0] & 1 ? "b" : "----sbxFuzzBoundary0123456789";
  const std::size_t p = 1 + (data[0] >> 1);  // 1..128
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto whole = read(boundary, body, {});
  if (read(boundary, body, {p, 2 * p + 37, 1}) != whole) __builtin_trap();
  if (read(boundary, body, {1}) != whole) __builtin_trap();
  return 0;
}
