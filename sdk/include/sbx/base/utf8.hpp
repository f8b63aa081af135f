// UTF-8 checks for text that crosses the ABI (docs/abi/strings.md: every sbx_str is UTF-8).
// THREADING: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace sbx::base::utf8 {

// True when `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF). NUL bytes are valid UTF-8.
bool valid(std::string_view text) noexcept;

// The byte offset of the first ill-formed sequence, or text.size() when there is none.
size_t first_invalid(std::string_view text) noexcept;

// `text` with every ill-formed sequence replaced by U+FFFD, for messages and logs.
std::string sanitize(std::string_view text);

}  // namespace sbx::base::utf8
