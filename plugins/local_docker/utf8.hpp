// UTF-8 validity for strings that cross Docker's JSON. The daemon (Go's encoding/json) replaces
// every invalid byte sequence with U+FFFD without complaint, so a path, environment value or label
// that is not valid UTF-8 would silently reach the container as another string. They are refused
// instead (INVALID_ARGUMENT), before the daemon sees anything.
#pragma once

#include <string>
#include <string_view>

namespace sbx::local_docker {

// Whether `text` is valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past
// U+10FFFF), as Go's unicode/utf8.Valid judges it.
bool is_valid_utf8(std::string_view text) noexcept;

// `text` with every byte that is not part of a valid UTF-8 sequence written as \xNN, shortened:
// safe to put into a message (which is itself UTF-8 and may be JSON later).
std::string printable(std::string_view text, size_t limit = 200);

// Throws INVALID_ARGUMENT "<what> is not valid UTF-8: '<printable text>' (...)" unless it is.
void require_utf8(std::string_view text, std::string_view what);

}  // namespace sbx::local_docker
