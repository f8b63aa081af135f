#include "utf8.hpp"

#include <sbx/sdk/error.hpp>

#include <cstdint>

namespace sbx::local_docker {
namespace {

// The length of the valid UTF-8 sequence at the start of `text`, or 0 when it is not one.
size_t sequence_length(std::string_view text) noexcept {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t first = byte(0);
  if (first < 0x80) return 1;
  size_t length = 0;
  uint8_t low = 0x80;  // the range of the second byte (tighter after E0, ED, F0, F4)
  uint8_t high = 0xBF;
  if (first >= 0xC2 && first <= 0xDF) {
    length = 2;
  } else if (first >= 0xE0 && first <= 0xEF) {
    length = 3;
    if (first == 0xE0) low = 0xA0;   // overlong
    if (first == 0xED) high = 0x9F;  // surrogates U+D800..U+DFFF
  } else if (first >= 0xF0 && first <= 0xF4) {
    length = 4;
    if (first == 0xF0) low = 0x90;   // overlong
    if (first == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return 0;  // a continuation byte, C0/C1 (overlong) or F5..FF
  }
  if (text.size() < length) return 0;
  if (byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

bool is_valid_utf8(std::string_view text) noexcept {
  while (!text.empty()) {
    const size_t n = sequence_length(text);
    if (n == 0) return false;
    text.remove_prefix(n);
  }
  return true;
}

std::string printable(std::string_view text, size_t limit) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  while (!text.empty() && out.size() < limit) {
    const size_t n = sequence_length(text);
    if (n == 0) {
      const auto byte = static_cast<uint8_t>(text.front());
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xF];
      text.remove_prefix(1);
    } else {
      out.append(text.substr(0, n));
      text.remove_prefix(n);
    }
  }
  if (!text.empty()) out += "...";
  return out;
}

void require_utf8(std::string_view text, std::string_view what) {
  if (is_valid_utf8(text)) return;
  throw sdk::Error::invalid_argument(std::string(what) + " is not valid UTF-8: '" +
                                     printable(text) +
                                     "' (the Docker API would replace the invalid bytes, shown as "
                                     "\\xNN, with U+FFFD)");
}

}  // namespace sbx::local_docker
