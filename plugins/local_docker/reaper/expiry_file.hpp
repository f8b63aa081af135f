// The expiry file of a local_docker sandbox with a TTL: `/.sbx/ttl/expires_at` in the container,
// Unix seconds as decimal text and a newline. It lives on the host (host_dirs.hpp: agent_dir's
// sandboxes/NAME/ttl/, bind-mounted read-only at /.sbx/ttl), where no sandbox can write it:
// written there at create and by sbx.renew/1 (a temp file renamed over it), read there by the
// provider (connect, renew), inside the container by the agent or the keep-alive (relative to
// the directory each opened at its start, so a /.sbx renamed or replaced later changes nothing),
// and by the reaper (sbx_reaper.cpp) through the archive API, which reads the container's mounts
// as Docker configured them. Header-only and without dependencies, so that the static reaper
// program and the plugin parse it the same way.
//
// THREADING: pure functions, any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::local_docker::expiry {

// Where the file lives in the container, its name in its directory, and the label that says a
// container has one (its value is the path). A container without the label (no TTL), or whose
// label names another path (created by a local_docker before decision 251, whose expiry file its
// sandbox could rewrite), has only its sbx.expires_at label.
inline constexpr std::string_view kPath = "/.sbx/ttl/expires_at";
inline constexpr std::string_view kFileName = "expires_at";
inline constexpr std::string_view kFileLabel = "sbx.expiry_file";

// The file's text for `expires_at`.
inline std::string file_text(int64_t expires_at) {
  return std::to_string(expires_at) + "\n";
}

// Unix seconds as all digits (at most 18, so no overflow); nothing otherwise.
inline std::optional<int64_t> parse_seconds(std::string_view text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

// The expiry in the file's text: digits, then optional whitespace (the newline).
inline std::optional<int64_t> parse_file(std::string_view text) {
  size_t end = 0;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9')
    ++end;
  for (size_t i = end; i < text.size(); ++i) {
    if (text[i] != '\n' && text[i] != ' ' && text[i] != '\r' && text[i] != '\t') {
      return std::nullopt;
    }
  }
  return parse_seconds(text.substr(0, end));
}

// The expiry in the tar archive that GET /containers/{id}/archive?path=<kPath> answers: the first
// regular file entry (pax headers are skipped). Nothing when the archive holds no such entry or
// the file's text is not an expiry (e.g. a half-written file).
inline std::optional<int64_t> parse_archive(std::string_view tar) {
  constexpr size_t kBlock = 512;
  size_t at = 0;
  while (at + kBlock <= tar.size()) {
    const std::string_view header = tar.substr(at, kBlock);
    if (header[0] == '\0') return std::nullopt;  // the end-of-archive blocks
    uint64_t size = 0;
    for (size_t i = 124; i < 136 && header[i] >= '0' && header[i] <= '7'; ++i)
      size = size * 8 + static_cast<uint64_t>(header[i] - '0');
    const char type = header[156];
    at += kBlock;
    if (size > tar.size() - at) return std::nullopt;
    if (type == '0' || type == '\0') return parse_file(tar.substr(at, size));
    at += (size + kBlock - 1) / kBlock * kBlock;
  }
  return std::nullopt;
}

}  // namespace sbx::local_docker::expiry
