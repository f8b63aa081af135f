// The state directory (Options::state_dir): what a restarted server needs to serve the sandboxes
// of the one before. One JSON file per sandbox, `<id>.json` (the id hex-encoded when it is not a
// plain file name):
//   {"format": "sbx.serve.sandbox/1", "id", "descriptor" (sbx.connect/1, no secret), "image",
//    "entrypoint", "metadata"?, "createdAtUs", "expiresAtUs"?}
// and one per create in flight, `.create-<token>.json` (a name no sandbox id gives):
//   {"format": "sbx.serve.create/1", "token", "provider", "label": {"sbx.serve.create": token},
//    "image", "createdAtUs"}
// written before the provider is asked and removed once the create ended (its sandbox then has
// its own record, or is gone). A file is written to a unique temporary name (mkstemp), fsync'ed,
// renamed over the old one and the directory fsync'ed, so a crash leaves the old file or the new
// one, never a mix. A `.lock` file, flock'ed while the server runs, keeps a second server off
// the directory.
//
// At start (store_load) the sandbox records are connected to, then each create record is
// reconciled: the sandbox its label finds is adopted when a sandbox record names it (the create
// finished, only the create record's removal was lost), else closed (reaped), since no client
// ever heard of its id; the create record is then dropped.
//
// THREADING: store_save and store_remove may run on any thread. The writes of one sandbox are
// serialised by its Entry::store_mutex, and once store_remove ran for an entry, store_save does
// nothing for it (a renew finishing after a delete does not write the record back). store_load
// runs in the constructor, before anything else.

#include "state.hpp"

#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>

namespace sbx::serve {

namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "sbx.serve.sandbox/1";
constexpr const char* kCreateFormat = "sbx.serve.create/1";

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

// A create token is 32 hex digits (new_request_id), so the name is always plain.
fs::path create_file_of(const fs::path& dir, const std::string& token) {
  return dir / (".create-" + token + ".json");
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
  if (auto metadata = entry.metadata()) out["metadata"] = std::move(*metadata);
  if (exp) out["expiresAtUs"] = unix_us(*exp);
  return out;
}

// The entry a file describes, without its Sandbox; throws std::exception for a malformed file.
std::shared_ptr<Entry> from_json(const json::object& o) {
  if (o.at("format").as_string() != kFormat) throw std::invalid_argument("unknown format");
  auto entry = std::make_shared<Entry>();
  entry->id = std::string(o.at("id").as_string());
  entry->descriptor = std::string(o.at("descriptor").as_string());
  entry->image = std::string(o.at("image").as_string());
  for (const auto& word : o.at("entrypoint").as_array())
    entry->entrypoint.emplace_back(word.as_string());
  if (const auto* m = o.if_contains("metadata")) entry->set_metadata(m->as_object());
  entry->created_at = from_unix_us(o.at("createdAtUs").to_number<int64_t>());
  if (const auto* e = o.if_contains("expiresAtUs")) {
    entry->expires_at = from_unix_us(e->to_number<int64_t>());
  }
  return entry;
}

// fsync of a directory: a rename or unlink in it survives a crash.
void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes `text` to `target` through a unique temporary file beside it: written, fsync'ed,
// renamed over `target`, the directory fsync'ed. The error, or "" on success.
std::string write_atomically(const fs::path& target, const std::string& text) {
  std::string temporary = target.string() + ".tmp-XXXXXX";
  const int fd = ::mkostemp(temporary.data(), O_CLOEXEC);
  if (fd < 0) return "cannot make a temporary file like " + temporary + ": " + std::strerror(errno);
  std::string error;
  std::size_t done = 0;
  while (error.empty() && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = "cannot write " + temporary + ": " + std::strerror(errno);
    if (n > 0) done += static_cast<std::size_t>(n);
  }
  if (error.empty() && ::fchmod(fd, 0600) != 0) {
    error = "cannot chmod " + temporary + ": " + std::strerror(errno);
  }
  if (error.empty() && ::fsync(fd) != 0) {
    error = "cannot fsync " + temporary + ": " + std::strerror(errno);
  }
  ::close(fd);
  if (error.empty() && ::rename(temporary.c_str(), target.c_str()) != 0) {
    error = "cannot rename " + temporary + " to " + target.string() + ": " + std::strerror(errno);
  }
  if (!error.empty()) {
    ::unlink(temporary.c_str());
    return error;
  }
  sync_directory(target.parent_path());
  return "";
}

void remove_file(const fs::path& file, const std::string& what) {
  if (::unlink(file.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("sbx serve: cannot remove the state file of {}: {}", what, std::strerror(errno));
    return;
  }
  sync_directory(file.parent_path());
}

}  // namespace

void store_save(Server::State& state, Entry& entry) {
  if (!state.options.state_dir) return;
  std::lock_guard store_lock(entry.store_mutex);
  if (entry.store_removed) return;  // deleted (or closed) meanwhile: its record stays gone
  // The registry's lock under store_mutex (registry.hpp).
  const auto expires_at = state.registry.expires_at(entry);
  const fs::path target = file_of(*state.options.state_dir, entry.id);
  if (const std::string error =
          write_atomically(target, json::serialize(to_json(entry, expires_at)));
      !error.empty()) {
    spdlog::warn("sbx serve: {}: a restarted server will not find sandbox {}", error, entry.id);
  }
}

void store_remove(const Server::State& state, Entry& entry) {
  if (!state.options.state_dir) return;
  std::lock_guard store_lock(entry.store_mutex);
  entry.store_removed = true;
  remove_file(file_of(*state.options.state_dir, entry.id), entry.id);
}

std::string store_begin_create(const Server::State& state, const std::string& token,
                               const std::string& image,
                               std::chrono::system_clock::time_point created_at) {
  if (!state.options.state_dir) return "";
  const json::object record{{"format", kCreateFormat},
                            {"token", token},
                            {"provider", state.current_provider().name()},
                            {"label", json::object{{kCreateLabel, token}}},
                            {"image", image},
                            {"createdAtUs", unix_us(created_at)}};
  return write_atomically(create_file_of(*state.options.state_dir, token), json::serialize(record));
}

void store_end_create(const Server::State& state, const std::string& token) {
  if (!state.options.state_dir || token.empty()) return;
  remove_file(create_file_of(*state.options.state_dir, token), "create " + token);
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
  struct Create {
    fs::path file;
    std::string token;
  };
  std::vector<Found> found;
  std::vector<Create> creates;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    const fs::path& path = item.path();
    const std::string name = path.filename().string();
    if (name.find(".json.tmp-") != std::string::npos && item.is_regular_file()) {
      // A write a crash interrupted (write_atomically's temporary): the record it was replacing,
      // if any, is whole beside it.
      fs::remove(path, ec);
      continue;
    }
    if (path.extension() != ".json" || !item.is_regular_file()) continue;
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      const json::object o = json::parse(text).as_object();
      if (o.at("format").as_string() == kCreateFormat) {
        creates.push_back({path, std::string(o.at("token").as_string())});
      } else {
        found.push_back({path, from_json(o), {}});
      }
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
  std::set<std::string> recorded;  // ids with a record, found again or not (kept for later)
  for (auto& f : found) {
    recorded.insert(f.entry->id);
    if (!f.op.valid()) continue;
    try {
      f.entry->set_box(std::make_shared<sbx::Sandbox>(f.op.get()));
    } catch (...) {
      const sbx::Error e = sbx::to_error(std::current_exception());
      if (e.status() == SBX_STATUS_NOT_FOUND) {
        spdlog::info("sbx serve: sandbox {} of the state directory is gone", f.entry->id);
        remove_file(f.file, f.entry->id);
      } else {
        spdlog::warn("sbx serve: cannot connect to sandbox {} (its record is kept): {}",
                     f.entry->id, e.what());
      }
      continue;
    }
    state.registry.insert(f.entry);
    ++kept;
  }
  spdlog::info("sbx serve: found {} sandbox(es) again in {}", kept, dir.string());

  // Creates a kill interrupted: their sandbox (if the provider made one) is closed, unless a
  // sandbox record names it.
  for (const auto& c : creates) {
    const sbx::StringMap selector{{kCreateLabel, c.token}};
    if (!state.provider.supports("sbx.list-reap/1")) {
      spdlog::warn(
          "sbx serve: a create was interrupted and provider '{}' cannot list sandboxes "
          "(sbx.list-reap/1): a sandbox labelled {}={} may be left; dropping {}",
          state.provider.name(), kCreateLabel, c.token, c.file.string());
      remove_file(c.file, "create " + c.token);
      continue;
    }
    try {
      bool adopted = false;
      for (const auto& info : state.provider.list(selector))
        adopted = adopted || recorded.count(info.id) != 0;
      if (adopted) {
        spdlog::info("sbx serve: the interrupted create {} had finished; its sandbox is served",
                     c.token);
      } else {
        const auto reaped = state.provider.reap(selector);
        for (const auto& info : reaped) {
          spdlog::info("sbx serve: closed sandbox {} of a create interrupted by a crash", info.id);
        }
      }
      remove_file(c.file, "create " + c.token);
    } catch (...) {
      spdlog::warn("sbx serve: cannot reconcile the interrupted create {} (its record is kept): {}",
                   c.token, sbx::to_error(std::current_exception()).what());
    }
  }
}

}  // namespace sbx::serve
