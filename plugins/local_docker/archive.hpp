// Files through the Engine API: startup files, and (without the agent: "agent": false, a paused
// handle, an agent not run as root; decision 209) uploads, as tar archives streamed into
// PUT /containers/{id}/archive, and downloads streamed out of GET /containers/{id}/archive, one
// regular file only.
#pragma once

#include "docker_api.hpp"

#include <sbx/sdk/log.hpp>
#include <sbx/sdk/provider.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::local_docker {

// The absolute, normalized path in the container for `path`: a relative path resolves against
// `workdir` (the spec's), else "/" (sdk::resolve_sandbox_path). Throws INVALID_ARGUMENT for an
// empty path, one whose ".." climbs above "/", or one that names the root.
std::string container_path(std::string_view path, const std::optional<std::string>& workdir);

// Streams `source` into the running container as `path` (absolute, normalized) with `mode`;
// missing parent directories are created (0755, root). Memory stays bounded whatever the size.
// All or nothing: the file streams under a temporary name in the target's directory, and one exec
// renames it over the target once the daemon has all of it; any failure (daemon error, source
// error, cancellation) removes it again and leaves a previous file untouched. A directory at `path`
// is INVALID_ARGUMENT, a read-only file system there (the read-only root outside volumes, a
// read-only volume) FAILED_PRECONDITION. The rename needs `sh` in the sandbox.
void upload_file(DockerApi& api, const std::string& container, const std::string& path,
                 uint32_t mode, sdk::ByteSource& source, const sdk::Logger& log,
                 const sdk::CancelToken& cancel);

// Writes several small files (absolute paths -> contents) with one archive, e.g. startup files
// before the container starts.
void upload_files(DockerApi& api, const std::string& container,
                  const std::vector<std::pair<std::string, std::string>>& files,
                  const sdk::CancelToken& cancel);

// Streams the regular file at `path` into `sink`. A directory, a link, or an archive entry that
// is not exactly that file fails (INVALID_ARGUMENT); a missing file is NOT_FOUND.
void download_file(DockerApi& api, const std::string& container, const std::string& path,
                   sdk::ByteSink& sink, const sdk::CancelToken& cancel);

}  // namespace sbx::local_docker
