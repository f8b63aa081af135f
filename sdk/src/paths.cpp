#include <sbx/sdk/error.hpp>
#include <sbx/sdk/paths.hpp>

#include <vector>

namespace sbx::sdk {

std::string resolve_sandbox_path(std::string_view path, const std::optional<std::string>& workdir) {
  if (path.empty()) throw Error::invalid_argument("the sandbox path is empty");
  if (path.find('\0') != std::string_view::npos) {
    throw Error::invalid_argument("the sandbox path contains a NUL byte");
  }
  const bool relative = path.front() != '/';
  std::string joined;
  if (relative && workdir) joined = *workdir + "/";
  joined += path;

  std::vector<std::string_view> parts;
  const std::string_view text(joined);
  for (size_t start = 0; start <= text.size();) {
    const size_t end = std::min(text.find('/', start), text.size());
    const std::string_view part = text.substr(start, end - start);
    start = end + 1;
    if (part.empty() || part == ".") continue;
    if (part != "..") {
      parts.push_back(part);
    } else if (!parts.empty()) {
      parts.pop_back();
    } else {
      throw Error::invalid_argument(
          "the sandbox path '" + std::string(path) +
          "' leaves the sandbox: its '..' climbs above " +
          (relative && !workdir ? "where it starts" : "the sandbox's '/'"));
    }
  }
  std::string out = relative && !workdir ? "" : "/";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += '/';
    out += parts[i];
  }
  return out.empty() ? "." : out;
}

}  // namespace sbx::sdk
