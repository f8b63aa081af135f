// The state directory (Options::state_dir): what a restarted server needs to serve the sandboxes
// of the one before. One JSON file per sandbox, `<id>.json` (the id hex-encoded when it is not a
// plain file name):
//   {"format": "sbx.serve.sandbox/1", "id", "descriptor" (sbx.connect/1, no secret), "image",
//    "entrypoint", "metadata"?, "createdAtUs", "expiresAtUs"?}
// written to a temporary name and renamed, so a crash leaves the old file or the new one. A
// `.lock` file, flock'ed while the server runs, keeps a second server off the directory.
//
// THREADING: store_save and store_remove may run on any thread (each file is written by the one
// request that changes it: create, renew, delete or the close of an expired sandbox); store_load
// runs in the constructor, before anything else.

#include "state.hpp"

#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace sbx::serve {

namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "sbx.serve.sandbox/1";

fs::path file_of(const fs::path& dir, const std::string& id) {
  bool plain = !id.empty() && id.size() <= 200 && id.front() != '.';
  for (const char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    plain = plain && ok;
  }
  if (plain) return dir / (id + ".json");
  static constexpr char hex[] = "0123456789abcdef";
  std::string name = "x-";
  for (const unsigned char c : id) {
    name += hex[c >> 4];
    name += hex[c & 0xf];
  }
  return dir / (name + ".json");
}

int64_t unix_us(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::chrono::system_clock::time_point from_unix_us(int64_t us) {
  return std::chrono::system_clock::time_point(std::chrono::microseconds(us));
}

json::object to_json(const Entry& entry, std::optional<std::chrono::system_clock::time_point> exp) {
  json::array entrypoint;
  for (const auto& word : entry.entrypoint)
    entrypoint.push_back(json::string(word));
  json::object out{{"format", kFormat},
                   {"id", entry.id},
                   {"descriptor", entry.descriptor},
                   {"image", entry.image},
                   {"entrypoint", std::move(entrypoint)},
                   {"createdAtUs", unix_us(entry.created_at)}};
  if (entry.metadata) out["metadata"] = *entry.metadata;
  if (exp) out["expiresAtUs"] = unix_us(*exp);
  return out;
}

// The entry a file describes, without its Sandbox; throws std::exception for a malformed file.
std::shared_ptr<Entry> from_json(const json::value& value) {
  const json::object& o = value.as_object();
  if (o.at("format").as_string() != kFormat) throw std::invalid_argument("unknown format");
  auto entry = std::make_shared<Entry>();
  entry->id = std::string(o.at("id").as_string());
  entry->descriptor = std::string(o.at("descriptor").as_string());
  entry->image = std::string(o.at("image").as_string());
  for (const auto& word : o.at("entrypoint").as_array())
    entry->entrypoint.emplace_back(word.as_string());
  if (const auto* m = o.if_contains("metadata")) entry->metadata = m->as_object();
  entry->created_at = from_unix_us(o.at("createdAtUs").to_number<int64_t>());
  if (const auto* e = o.if_contains("expiresAtUs")) {
    entry->expires_at = from_unix_us(e->to_number<int64_t>());
  }
  return entry;
}

}  // namespace

void store_save(Server::State& state, const Entry& entry) {
  if (!state.options.state_dir) return;
  std::optional<std::chrono::system_clock::time_point> expires_at;
  {
    std::lock_guard lock(state.mutex);
    expires_at = entry.expires_at;
  }
  const fs::path target = file_of(*state.options.state_dir, entry.id);
  const fs::path temporary = target.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << json::serialize(to_json(entry, expires_at));
    out.flush();
    if (!out) {
      spdlog::warn("sbx serve: cannot write {}: a restarted server will not find sandbox {}",
                   temporary.string(), entry.id);
      return;
    }
  }
  std::error_code ec;
  fs::rename(temporary, target, ec);
  if (ec) {
    spdlog::warn("sbx serve: cannot rename {} to {}: {}", temporary.string(), target.string(),
                 ec.message());
  }
}

void store_remove(const Server::State& state, const std::string& id) {
  if (!state.options.state_dir) return;
  std::error_code ec;
  fs::remove(file_of(*state.options.state_dir, id), ec);
  if (ec) spdlog::warn("sbx serve: cannot remove the state file of {}: {}", id, ec.message());
}

void store_load(Server::State& state) {
  const fs::path& dir = *state.options.state_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw std::runtime_error("cannot create the state directory " + dir.string() + ": " +
                             ec.message());
  }
  const fs::path lock_path = dir / ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw std::runtime_error("cannot open " + lock_path.string() + ": " + std::strerror(errno));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      throw std::runtime_error("the state directory " + dir.string() +
                               " is in use by another sbx serve");
    }
    throw std::runtime_error("cannot lock " + lock_path.string() + ": " + std::strerror(err));
  }
  state.state_dir_lock = fd;

  // Every file first, then every connect at once: they run in parallel on the provider.
  struct Found {
    fs::path file;
    std::shared_ptr<Entry> entry;
    sbx::Operation<sbx::Sandbox> op;
  };
  std::vector<Found> found;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    const fs::path& path = item.path();
    if (path.extension() != ".json" || !item.is_regular_file()) continue;
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      found.push_back({path, from_json(json::parse(text)), {}});
    } catch (const std::exception& e) {
      spdlog::warn("sbx serve: ignoring {}: not a sandbox record ({})", path.string(), e.what());
    }
  }
  if (ec) {
    throw std::runtime_error("cannot read the state directory " + dir.string() + ": " +
                             ec.message());
  }
  for (auto& f : found) {
    try {
      f.op = state.provider.connect_async(f.entry->descriptor);
    } catch (...) {
      f.op = {};
      spdlog::warn("sbx serve: cannot connect to sandbox {}: {}", f.entry->id,
                   sbx::to_error(std::current_exception()).what());
    }
  }
  std::size_t kept = 0;
  for (auto& f : found) {
    if (!f.op.valid()) continue;
    try {
      f.entry->set_box(std::make_shared<sbx::Sandbox>(f.op.get()));
    } catch (...) {
      const sbx::Error e = sbx::to_error(std::current_exception());
      if (e.status() == SBX_STATUS_NOT_FOUND) {
        spdlog::info("sbx serve: sandbox {} of the state directory is gone", f.entry->id);
        fs::remove(f.file, ec);
      } else {
        spdlog::warn("sbx serve: cannot connect to sandbox {} (its record is kept): {}",
                     f.entry->id, e.what());
      }
      continue;
    }
    std::lock_guard lock(state.mutex);
    state.sandboxes[f.entry->id] = f.entry;
    ++kept;
  }
  spdlog::info("sbx serve: found {} sandbox(es) again in {}", kept, dir.string());
}

}  // namespace sbx::serve
