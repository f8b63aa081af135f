#include <sbx/base/utf8.hpp>

#include <cstdint>

namespace sbx::base::utf8 {
namespace {

// The length of the well-formed sequence at `i`, or 0 when it is ill-formed (Unicode 15, table
// 3-7: well-formed byte sequences).
size_t sequence_at(std::string_view text, size_t i) noexcept {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return len;
}

}  // namespace

size_t first_invalid(std::string_view text) noexcept {
  size_t i = 0;
  while (i < text.size()) {
    // ASCII runs are the common case.
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = sequence_at(text, i);
    if (len == 0) return i;
    i += len;
  }
  return text.size();
}

bool valid(std::string_view text) noexcept {
  return first_invalid(text) == text.size();
}

std::string sanitize(std::string_view text) {
  if (valid(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  size_t i = 0;
  while (i < text.size()) {
    const size_t len = sequence_at(text, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace sbx::base::utf8
