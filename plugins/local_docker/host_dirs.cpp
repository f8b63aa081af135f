#include "host_dirs.hpp"

#include "agent.hpp"
#include "reaper/expiry_file.hpp"

#include <sbx/sdk/error.hpp>
#include <sbx/sdk/unix_socket.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

namespace sbx::local_docker {
namespace {

sdk::Error io_error(const std::string& what, int error) {
  return sdk::Error::unavailable("local_docker: " + what + ": " + std::strerror(error));
}

// Makes `dir` and its missing parents (parents 0755, `dir` itself `mode`).
void make_dirs(const std::string& dir, mode_t mode) {
  const std::filesystem::path path(dir);
  std::error_code ec;
  if (path.has_parent_path() && path.parent_path() != path) {
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) {
      throw sdk::Error::unavailable("local_docker: cannot make " + path.parent_path().string() +
                                    ": " + ec.message());
    }
  }
  if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) throw io_error("mkdir " + dir, errno);
}

// A sandbox name is one path component: what create makes (the prefix and hex digits) and what
// Docker takes as a container name.
void check_name(const std::string& name) {
  if (name.empty() || name.size() > 128 || name.front() == '.' ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
          std::string::npos) {
    throw sdk::Error::invalid_argument("'" + name + "' is not a local_docker sandbox name");
  }
}

// Writes `text` to a new file `path` (mode 0644) and renames it over `target`.
void replace_file(const std::string& path, const std::string& target, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) throw io_error("create " + path, errno);
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(path.c_str());
      throw io_error("write " + path, error);
    }
    off += static_cast<size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0 || ::close(fd) != 0 || ::rename(path.c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::unlink(path.c_str());
    throw io_error("install " + target, error);
  }
}

std::string random_suffix() {
  static thread_local std::mt19937_64 random{std::random_device{}()};
  return std::to_string(random());
}

}  // namespace

HostDirs::HostDirs(const std::string& dir) {
  std::error_code ec;
  const auto canonical = std::filesystem::weakly_canonical(dir, ec);
  dir_ = ec ? dir : canonical.string();
  while (dir_.size() > 1 && dir_.back() == '/')
    dir_.pop_back();
}

std::string HostDirs::binary() {
  std::lock_guard lock(mutex_);
  if (!binary_.empty()) return binary_;
  make_dirs(dir_, 0700);
  struct stat st {};
  if (::lstat(dir_.c_str(), &st) != 0) throw io_error("stat " + dir_, errno);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
    throw sdk::Error::unavailable("local_docker: " + dir_ +
                                  " (agent_dir) must be a directory owned by this user");
  }
  // Only this user enters it: the sandboxes' directories are below.
  if ((st.st_mode & 077) != 0 && ::chmod(dir_.c_str(), 0700) != 0) {
    throw io_error("chmod 0700 " + dir_, errno);
  }
  make_dirs(dir_ + "/sandboxes", 0700);

  const std::string path = dir_ + "/sbx-agent-" + std::string(agent_hash());
  const std::string_view program = agent_program();
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<size_t>(st.st_size) == program.size()) {
    binary_ = path;
    return binary_;
  }
  const std::string temp = path + ".tmp-" + random_suffix();
  replace_file(temp, path, program);
  if (::chmod(path.c_str(), 0755) != 0) throw io_error("chmod " + path, errno);
  binary_ = path;
  return binary_;
}

std::string HostDirs::sandbox_dir(const std::string& name) const {
  check_name(name);
  return dir_ + "/sandboxes/" + name;
}

std::string HostDirs::run_dir(const std::string& name) const {
  return sandbox_dir(name) + "/run";
}

std::string HostDirs::socket(const std::string& name) const {
  return run_dir(name) + "/agent.sock";
}

std::string HostDirs::ttl_dir(const std::string& name) const {
  return sandbox_dir(name) + "/ttl";
}

void HostDirs::make(const std::string& name, bool agent, std::optional<int64_t> expires_at) {
  const std::string dir = sandbox_dir(name);
  binary();  // agent_dir and its sandboxes/ exist, checked
  if (::mkdir(dir.c_str(), 0700) != 0) throw io_error("mkdir " + dir, errno);
  try {
    if (agent) {
      const std::string run = run_dir(name);
      if (::mkdir(run.c_str(), 0700) != 0) throw io_error("mkdir " + run, errno);
      // The agent makes its socket there; sticky, so no other user of the sandbox replaces it.
      if (::chmod(run.c_str(), 01777) != 0) throw io_error("chmod " + run, errno);
    }
    if (expires_at) {
      const std::string ttl = ttl_dir(name);
      if (::mkdir(ttl.c_str(), 0755) != 0) throw io_error("mkdir " + ttl, errno);
      write_expiry(name, *expires_at);
    }
  } catch (...) {
    remove(name);
    throw;
  }
}

void HostDirs::remove(const std::string& name) noexcept {
  try {
    // Renamed away first, in one step: a connection made meanwhile finds no sandbox directory
    // (the sandbox is gone), never a run/ without its socket (which would say "tampered with").
    const std::string dir = sandbox_dir(name);
    const std::string doomed = dir_ + "/sandboxes/.gone-" + name + "-" + random_suffix();
    std::error_code ec;
    std::filesystem::remove_all(::rename(dir.c_str(), doomed.c_str()) == 0 ? doomed : dir, ec);
  } catch (...) {  // not a name of ours: nothing of ours to remove
  }
}

std::optional<int64_t> HostDirs::read_expiry(const std::string& name) const {
  const std::string path = ttl_dir(name) + "/" + std::string(expiry::kFileName);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char text[64];
  const ssize_t n = ::read(fd, text, sizeof text);
  ::close(fd);
  if (n <= 0 || static_cast<size_t>(n) == sizeof text) return std::nullopt;
  return expiry::parse_file({text, static_cast<size_t>(n)});
}

void HostDirs::write_expiry(const std::string& name, int64_t expires_at) {
  const std::string ttl = ttl_dir(name);
  struct stat st {};
  if (::lstat(ttl.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw sdk::Error::failed_precondition(
        "sandbox " + name + " has no expiry directory on this host (" + ttl +
        "): it was created without a TTL, by another host or an older local_docker, or its "
        "directory was removed, so its expiry cannot move");
  }
  const std::string target = ttl + "/" + std::string(expiry::kFileName);
  replace_file(ttl + "/.expires_at.tmp-" + random_suffix(), target, expiry::file_text(expires_at));
}

size_t HostDirs::sweep() {
  size_t removed = 0;
  const auto now = std::filesystem::file_time_type::clock::now();
  const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ + "/sandboxes", ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code entry_ec;
    if (name.starts_with(".gone-")) {  // a removal that did not finish (its process died)
      std::filesystem::remove_all(entry.path(), entry_ec);
      continue;
    }
    if (!entry.is_directory(entry_ec) || entry.is_symlink(entry_ec)) continue;
    const auto modified = std::filesystem::last_write_time(entry.path(), entry_ec);
    if (entry_ec || now - modified < std::chrono::minutes(1)) continue;
    try {
      std::error_code run_ec;
      if (std::filesystem::is_directory(std::filesystem::symlink_status(run_dir(name), run_ec))) {
        try {
          sdk::connect_unix(socket(name), false, true);
          continue;                    // an agent listens
        } catch (const sdk::Error&) {  // gone, refused, or not a socket any more
        }
      } else if (const auto expiry = read_expiry(name); expiry && *expiry + 60 > now_s) {
        continue;  // a sandbox without an agent lives until its expiry, and is gone a minute after
      }
    } catch (const sdk::Error&) {
      continue;  // not a sandbox name: not ours to remove
    }
    remove(name);
    ++removed;
  }
  return removed;
}

}  // namespace sbx::local_docker
