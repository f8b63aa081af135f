// Sandbox paths, resolved as docs/sandbox-semantics.md ("Paths") says every provider resolves
// them. THREADING: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sbx::sdk {

// Resolves a sandbox path lexically: a relative `path` is joined to `workdir` (the spec's, itself
// absolute), repeated "/" and "." are dropped and each ".." takes off the component before it.
// Returns the absolute path ("/" for the root itself). With no workdir a relative path stays
// relative (the backend resolves it against its own default directory).
//
// Throws Error::invalid_argument, naming the path, when it is empty, holds a NUL byte, or has a
// ".." that climbs above the sandbox's "/" (or, relative with no workdir, above where it starts):
// such a path is refused, never clamped at "/".
std::string resolve_sandbox_path(std::string_view path, const std::optional<std::string>& workdir);

}  // namespace sbx::sdk
