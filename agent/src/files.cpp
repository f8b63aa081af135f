// The file routes' disk work. Everything runs on the loop's thread (agent.cpp); each call blocks
// for at most one bounded disk operation (a write of what one read brought, a rename).
#include "files.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>

#include "http.hpp"
#include "json.hpp"
#include "users.hpp"

namespace sbx::agent::files {

namespace {

constexpr std::size_t kMaxPartHeaders = 16 * 1024;  // one multipart part's header block
constexpr std::size_t kMaxMetadata = 64 * 1024;     // one metadata part's JSON

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The value of parameter `key` in a header value such as `form-data; name="x"; filename="y"`.
std::optional<std::string> header_param(std::string_view value, std::string_view key) {
  std::size_t pos = value.find(';');
  while (pos != std::string_view::npos) {
    ++pos;
    while (pos < value.size() && (value[pos] == ' ' || value[pos] == '\t'))
      ++pos;
    const std::size_t eq = value.find('=', pos);
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string name = lower(value.substr(pos, eq - pos));
    std::size_t start = eq + 1;
    std::string v;
    std::size_t next;
    if (start < value.size() && value[start] == '"') {
      const std::size_t end = value.find('"', start + 1);
      if (end == std::string_view::npos) return std::nullopt;
      v = std::string(value.substr(start + 1, end - start - 1));
      next = value.find(';', end);
    } else {
      next = value.find(';', start);
      v = std::string(
          value.substr(start, next == std::string_view::npos ? value.npos : next - start));
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t'))
        v.pop_back();
    }
    if (name == key) return v;
    pos = next;
  }
  return std::nullopt;
}

std::string errno_text(const char* op, const std::string& path, int error) {
  return std::string(op) + " " + path + ": " + std::strerror(error);
}

std::string not_found(const char* op, const std::string& path) {
  return std::string("file not found. ") + op + " " + path + ": no such file or directory";
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// RFC 3339 with nanoseconds, as execd (Go) prints file times.
std::string rfc3339(const timespec& ts) {
  std::tm tm{};
  ::gmtime_r(&ts.tv_sec, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09ldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec);
  return buf;
}

// An HTTP date ("Mon, 30 Nov 2026 23:18:17 GMT"), without strftime's locale machinery.
std::string http_date(time_t secs) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday % 7],
                tm.tm_mday, kMonths[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
                tm.tm_sec);
  return buf;
}

// The permission bits as execd writes them: octal digits read as a decimal number (0644 -> 644).
long long octal_as_decimal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%o", static_cast<unsigned>(mode & 07777));
  return std::atoll(buf);
}

std::string base_name(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  std::string out;
  for (const char c : slash == std::string::npos ? path : path.substr(slash + 1))
    if (c != '"' && c != '\\' && c != '\r' && c != '\n') out += c;
  return out;
}

struct Range {
  uint64_t first = 0, last = 0;
};

// One byte range of a file of `size` bytes: [first, last], or nullopt when unsatisfiable;
// `ignored` when the header is not one range of bytes (the whole file is sent then).
std::optional<Range> parse_range(std::string_view header, uint64_t size, bool& ignored) {
  ignored = true;
  auto number = [](std::string_view s, uint64_t& out) {
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != s.npos) return false;
    out = std::strtoull(std::string(s).c_str(), nullptr, 10);
    return true;
  };
  if (!header.starts_with("bytes=") || header.find(',') != header.npos) return std::nullopt;
  const std::string_view spec = header.substr(6);
  const std::size_t dash = spec.find('-');
  if (dash == spec.npos) return std::nullopt;
  const std::string_view a = spec.substr(0, dash), b = spec.substr(dash + 1);
  uint64_t first = 0, last = 0;
  if (a.empty()) {  // the last N bytes
    if (!number(b, last)) return std::nullopt;
    ignored = false;
    if (last == 0 || size == 0) return std::nullopt;
    return Range{size - std::min(last, size), size - 1};
  }
  if (!number(a, first) || (!b.empty() && !number(b, last))) return std::nullopt;
  if (!b.empty() && last < first) return std::nullopt;
  ignored = false;
  if (first >= size) return std::nullopt;
  return Range{first, b.empty() ? size - 1 : std::min(last, size - 1)};
}

}  // namespace

std::string resolve(const Context& context, const std::string& path) {
  if (path.starts_with('/')) return path;
  std::string base = context.workdir.empty() ? "/" : context.workdir;
  if (!base.ends_with('/')) base += '/';
  return base + path;
}

std::optional<std::string> multipart_boundary(std::string_view content_type) {
  const std::size_t semi = content_type.find(';');
  std::string_view type = content_type.substr(0, semi);
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t'))
    type.remove_suffix(1);
  if (lower(type) != "multipart/form-data") return std::nullopt;
  auto boundary = header_param(content_type, "boundary");
  if (!boundary || boundary->empty() || boundary->size() > 200) return std::nullopt;
  return boundary;
}

// ---------------------------------------------------------------------------------------------
// Upload

Upload::Upload(std::string boundary, Context context)
    : delimiter_("\r\n--" + boundary), context_(std::move(context)) {
  buffer_ = "\r\n";  // the first delimiter has no line break before it
}

Upload::~Upload() {
  discard();
}

void Upload::discard() {
  auto drop = [](Pair& p) {
    if (p.fd >= 0) ::close(p.fd);
    p.fd = -1;
    if (!p.temp.empty()) ::unlink(p.temp.c_str());
    p.temp.clear();
  };
  if (pending_) drop(*pending_);
  for (Pair& p : done_)
    drop(p);
  pending_.reset();
  done_.clear();
  if (!finished_) {
    // Directories made for this upload go again when nothing else was put in them.
    for (auto it = made_dirs_.rbegin(); it != made_dirs_.rend(); ++it)
      ::rmdir(it->c_str());
  }
  made_dirs_.clear();
  buffer_.clear();
  buffer_.shrink_to_fit();
  metadata_.clear();
}

void Upload::fail(int status, std::string code, std::string message) {
  if (failure_) return;
  failure_ = Failure{status, std::move(code), std::move(message), {}};
  discard();
}

void Upload::feed(std::string_view bytes) {
  if (failure_ || phase_ == Phase::done) return;  // dropped: after a failure, or the epilogue
  buffer_.append(bytes);
  parse();
}

void Upload::parse() {
  while (!failure_) {
    switch (phase_) {
      case Phase::preamble: {
        const std::size_t at = buffer_.find(delimiter_);
        if (at == std::string::npos) {
          if (buffer_.size() >= delimiter_.size())
            buffer_.erase(0, buffer_.size() - (delimiter_.size() - 1));
          return;
        }
        buffer_.erase(0, at + delimiter_.size());
        phase_ = Phase::after_delimiter;
        break;
      }
      case Phase::after_delimiter: {
        if (buffer_.size() < 2) return;
        if (buffer_.compare(0, 2, "--") == 0) {  // the closing delimiter; the epilogue is dropped
          phase_ = Phase::done;
          buffer_.clear();
          return;
        }
        const std::size_t eol = buffer_.find("\r\n");
        if (eol == std::string::npos) {
          if (buffer_.size() > 256)
            fail(400, "INVALID_FILE_CONTENT",
                 "malformed multipart body: no line break after a "
                 "boundary");
          return;
        }
        buffer_.erase(0, eol + 2);  // transport padding, then the line break
        phase_ = Phase::headers;
        break;
      }
      case Phase::headers: {
        const bool none = buffer_.starts_with("\r\n");
        const std::size_t end = none ? 0 : buffer_.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (buffer_.size() > kMaxPartHeaders)
            fail(400, "INVALID_FILE_CONTENT", "a multipart part's headers are too long");
          return;
        }
        const std::string headers = buffer_.substr(0, end);
        buffer_.erase(0, none ? 2 : end + 4);
        if (!begin_part(headers)) return;
        phase_ = Phase::body;
        break;
      }
      case Phase::body: {
        const std::size_t at = buffer_.find(delimiter_);
        if (at == std::string::npos) {
          // Everything but what could be the start of a delimiter is part of the body.
          const std::size_t keep = std::min(buffer_.size(), delimiter_.size() - 1);
          if (!part_bytes(std::string_view(buffer_).substr(0, buffer_.size() - keep))) return;
          buffer_.erase(0, buffer_.size() - keep);
          return;
        }
        if (!part_bytes(std::string_view(buffer_).substr(0, at))) return;
        buffer_.erase(0, at + delimiter_.size());
        if (!end_part()) return;
        phase_ = Phase::after_delimiter;
        break;
      }
      case Phase::done:
        return;
    }
  }
}

bool Upload::begin_part(std::string_view headers) {
  std::optional<std::string> name;
  std::size_t start = 0;
  while (start < headers.size()) {
    std::size_t eol = headers.find("\r\n", start);
    if (eol == std::string_view::npos) eol = headers.size();
    const std::string_view line = headers.substr(start, eol - start);
    const std::size_t colon = line.find(':');
    if (colon != std::string_view::npos && lower(line.substr(0, colon)) == "content-disposition")
      name = header_param(line.substr(colon + 1), "name");
    start = eol + 2;
  }
  part_ = Part::other;  // a part of another name is read and dropped
  if (name == "metadata") {
    if (pending_) {
      fail(400, "INVALID_FILE", "file is missing for metadata " + pending_->path);
      return false;
    }
    part_ = Part::metadata;
    metadata_.clear();
  } else if (name == "file") {
    if (!pending_ || writing_) {
      fail(400, "INVALID_FILE_METADATA", "metadata file is missing");
      return false;
    }
    part_ = Part::file;
    const std::size_t slash = pending_->dest.find_last_of('/');
    const std::string dir = slash == 0 ? "/" : pending_->dest.substr(0, slash);
    for (int attempt = 0; attempt < 8 && pending_->fd < 0; ++attempt) {
      pending_->temp = (dir == "/" ? "" : dir) + "/.sbx-upload-" + random_hex(8);
      pending_->fd = ::open(pending_->temp.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (pending_->fd < 0 && errno != EEXIST) break;
    }
    if (pending_->fd < 0) {
      const int error = errno;
      pending_->temp.clear();
      fail(error == ENOSPC || error == EIO ? 500 : 400,
           error == ENOSPC || error == EIO ? "RUNTIME_ERROR" : "INVALID_FILE",
           "cannot create a temporary file in " + dir + " for " + pending_->path + ": " +
               std::strerror(error));
      return false;
    }
    writing_ = true;
  }
  return true;
}

bool Upload::part_bytes(std::string_view bytes) {
  if (bytes.empty()) return true;
  if (part_ == Part::metadata) {
    metadata_.append(bytes);
    if (metadata_.size() > kMaxMetadata) {
      fail(400, "INVALID_FILE_METADATA", "metadata is too long");
      return false;
    }
  } else if (part_ == Part::file) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(pending_->fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        fail(500, "RUNTIME_ERROR", errno_text("write", pending_->temp, n < 0 ? errno : EIO));
        return false;
      }
      done += static_cast<std::size_t>(n);
    }
  }
  return true;
}

bool Upload::end_part() {
  if (part_ == Part::metadata) {
    if (!read_metadata()) return false;
  } else if (part_ == Part::file) {
    // Whole before it gets its owner and mode; renamed into place only by finish(). Not fsync'ed
    // (decision 210): a reader sees the old file or the new one by the rename alone.
    Pair& p = *pending_;
    if ((p.uid != static_cast<uid_t>(-1) || p.gid != static_cast<gid_t>(-1)) &&
        ::fchown(p.fd, p.uid, p.gid) != 0) {
      fail(500, "RUNTIME_ERROR", errno_text("chown", p.path, errno));
      return false;
    }
    // After the chown, which may clear set-id bits; exactly the mode, whatever the umask.
    if (::fchmod(p.fd, p.mode) != 0) {
      fail(500, "RUNTIME_ERROR", errno_text("chmod", p.path, errno));
      return false;
    }
    ::close(p.fd);
    p.fd = -1;
    done_.push_back(std::move(p));
    pending_.reset();
    writing_ = false;
  }
  part_ = Part::other;
  return true;
}

bool Upload::read_metadata() {
  auto bad = [&](const std::string& why) {
    fail(400, "INVALID_FILE_METADATA", "invalid metadata: " + why);
    return false;
  };
  json::Value v;
  std::string error;
  if (!json::parse(metadata_, v, error) || v.kind != json::Value::Kind::object)
    return bad("not a JSON object");
  using K = json::Value::Kind;
  Pair p;
  const json::Value* path = v.find("path");
  if (!path || path->kind != K::string || path->text.empty()) return bad("path is required");
  p.path = path->text;
  if (p.path.find('\0') != std::string::npos) return bad("path contains a NUL character");
  if (p.path.ends_with('/')) return bad("path " + p.path + " names a directory, not a file");
  p.dest = resolve(context_, p.path);
  for (const char* field : {"owner", "group"}) {
    const json::Value* f = v.find(field);
    if (!f || f->kind == K::null) continue;
    if (f->kind != K::string) return bad(std::string(field) + " must be a string");
    if (f->text.empty()) continue;
    if (field[0] == 'o') {
      const auto who = resolve_user(context_.etc_dir, f->text, error);
      if (!who) return bad(error);
      p.uid = who->uid;
    } else {
      const auto gid = resolve_group(context_.etc_dir, f->text, error);
      if (!gid) return bad(error);
      p.gid = *gid;
    }
  }
  if (const json::Value* mode = v.find("mode"); mode && mode->kind != K::null) {
    const std::string digits = mode->integer_ok ? std::to_string(mode->integer) : "";
    if (mode->kind != K::number || !mode->integer_ok || mode->integer < 0 || mode->integer > 7777 ||
        digits.find_first_of("89") != std::string::npos)
      return bad("mode must be an octal permission written in decimal, e.g. 644");
    if (mode->integer != 0) p.mode = static_cast<mode_t>(std::strtoul(digits.c_str(), nullptr, 8));
  }
  struct stat st {};
  // lstat: a link (even to a directory) is replaced by the rename, never followed.
  if (::lstat(p.dest.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    fail(400, "INVALID_FILE", p.path + " is a directory");
    return false;
  }
  const std::size_t slash = p.dest.find_last_of('/');
  if (slash > 0 && !make_parents(p.dest.substr(0, slash))) return false;
  pending_ = std::move(p);
  metadata_.clear();
  return true;
}

bool Upload::make_parents(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return true;
    fail(400, "INVALID_FILE", "cannot create " + dir + ": " + std::strerror(ENOTDIR));
    return false;
  }
  // Each missing component in turn, from the top.
  std::size_t pos = 1;
  while (pos <= dir.size()) {
    std::size_t slash = dir.find('/', pos);
    if (slash == std::string::npos) slash = dir.size();
    const std::string prefix = dir.substr(0, slash);
    pos = slash + 1;
    if (prefix.empty() || prefix.ends_with('/')) continue;
    if (::mkdir(prefix.c_str(), 0755) == 0) {
      made_dirs_.push_back(prefix);
      continue;
    }
    const int error = errno;
    if (error == EEXIST && ::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
    fail(400, "INVALID_FILE",
         "cannot create " + prefix + ": " + std::strerror(error == EEXIST ? ENOTDIR : error));
    return false;
  }
  return true;
}

std::optional<Failure> Upload::finish() {
  if (!failure_ && phase_ != Phase::done)
    fail(400, "INVALID_FILE_CONTENT", "the multipart body ended before its closing boundary");
  if (!failure_ && pending_)
    fail(400, "INVALID_FILE", "file is missing for metadata " + pending_->path);
  if (!failure_ && done_.empty()) fail(400, "INVALID_FILE", "no file in the request");
  if (failure_) return failure_;
  for (Pair& p : done_) {
    if (::rename(p.temp.c_str(), p.dest.c_str()) != 0) {
      const int error = errno;
      fail(error == EISDIR || error == ENOTDIR || error == EACCES || error == EPERM ? 400 : 500,
           error == EISDIR || error == ENOTDIR || error == EACCES || error == EPERM
               ? "INVALID_FILE"
               : "RUNTIME_ERROR",
           errno_text("rename", p.path, error));
      return failure_;
    }
    p.temp.clear();
  }
  finished_ = true;
  discard();
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Download and info

std::optional<Download> open_download(const Context& context, const std::string& path,
                                      const std::string* range, bool keep_alive, Failure& failure) {
  constexpr uint64_t kMaxUnsizedFile = 16 * 1024 * 1024;
  const std::string full = resolve(context, path);
  auto refuse = [&](int error, mode_t mode) -> std::optional<Download> {
    if (error == ENOENT || error == ENOTDIR) {
      failure = {404, "FILE_NOT_FOUND", not_found("open", path), {}};
    } else if (error == 0 || error == ELOOP) {
      failure = {400,
                 "INVALID_FILE",
                 path + " is not a regular file (" + kind_of(error ? S_IFLNK : mode) + ")",
                 {}};
    } else {
      failure = {500, "RUNTIME_ERROR", errno_text("open", path, error), {}};
    }
    return std::nullopt;
  };
  struct stat st {};
  if (::lstat(full.c_str(), &st) != 0) return refuse(errno, 0);
  if (!S_ISREG(st.st_mode)) return refuse(0, st.st_mode);
  // O_NOFOLLOW and O_NONBLOCK: a link or a FIFO put there since the lstat is refused, not waited
  // on.
  const int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return refuse(errno, 0);
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return refuse(0, st.st_mode);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  Download d;
  d.fd = fd;
  if (size == 0) {
    // A file that reports no size may still hold bytes (/proc and /sys files do): what it gives
    // is read now, into a memory file that is served in its place, up to kMaxUnsizedFile.
    const int copy = ::memfd_create("sbx-download", MFD_CLOEXEC);
    if (copy < 0) {
      ::close(fd);
      return refuse(errno, 0);
    }
    char buf[65536];
    uint64_t total = 0;
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int error = errno;
        ::close(fd);
        ::close(copy);
        return refuse(error, 0);
      }
      if (n == 0) break;
      total += static_cast<uint64_t>(n);
      if (total > kMaxUnsizedFile ||
          ::write(copy, buf, static_cast<size_t>(n)) != static_cast<ssize_t>(n)) {
        ::close(fd);
        ::close(copy);
        failure = {400,
                   "INVALID_FILE",
                   path + " reports no size and gives more than " +
                       std::to_string(kMaxUnsizedFile) + " bytes: it cannot be downloaded whole",
                   {}};
        return std::nullopt;
      }
    }
    ::close(fd);
    d.fd = copy;
    size = total;
  }
  d.length = size;
  std::vector<std::string> headers;
  int status = 200;
  if (range && !range->empty()) {
    bool ignored = false;
    const auto r = parse_range(*range, size, ignored);
    if (!r && !ignored) {
      ::close(fd);
      failure = {416,
                 "INVALID_FILE",
                 "requested range not satisfiable: " + *range,
                 {"Content-Range: bytes */" + std::to_string(size)}};
      return std::nullopt;
    }
    if (r) {
      status = 206;
      d.offset = r->first;
      d.length = r->last - r->first + 1;
      headers.push_back("Content-Range: bytes " + std::to_string(r->first) + "-" +
                        std::to_string(r->last) + "/" + std::to_string(size));
    }
  }
  if (status == 200) headers.push_back("Accept-Ranges: bytes");
  headers.push_back("Content-Disposition: attachment; filename=\"" + base_name(path) + "\"");
  if (status == 200) headers.push_back("Last-Modified: " + http_date(st.st_mtim.tv_sec));
  d.head = http::head(status, "application/octet-stream", d.length, keep_alive, headers);
  return d;
}

std::optional<std::string> info(const Context& context, const std::vector<std::string>& paths,
                                Failure& failure) {
  std::string body = "{";
  for (const std::string& path : paths) {
    if (path.empty() || path.find('\0') != std::string::npos) {
      failure = {400, "INVALID_REQUEST_BODY", "invalid path: " + path, {}};
      return std::nullopt;
    }
    struct stat st {};
    if (::lstat(resolve(context, path).c_str(), &st) != 0) {
      const int error = errno;
      if (error == ENOENT || error == ENOTDIR) {
        failure = {404, "FILE_NOT_FOUND", not_found("stat", path), {}};
      } else {
        failure = {500, "RUNTIME_ERROR", errno_text("stat", path, error), {}};
      }
      return std::nullopt;
    }
    const char* type = S_ISREG(st.st_mode)   ? "file"
                       : S_ISDIR(st.st_mode) ? "directory"
                       : S_ISLNK(st.st_mode) ? "symlink"
                                             : "other";
    if (body.size() > 1) body += ",";
    json::append_string(body, path);
    body += ":{\"path\":";
    json::append_string(body, path);
    body += ",\"type\":\"";
    body += type;
    body += "\",\"size\":" + std::to_string(st.st_size);
    body += ",\"modified_at\":\"" + rfc3339(st.st_mtim) + "\"";
    body += ",\"created_at\":\"" + rfc3339(st.st_ctim) + "\"";
    body += ",\"owner\":\"" + std::to_string(st.st_uid) + "\"";
    body += ",\"group\":\"" + std::to_string(st.st_gid) + "\"";
    body += ",\"mode\":" + std::to_string(octal_as_decimal(st.st_mode)) + "}";
  }
  body += "}";
  return body;
}

std::string random_hex(std::size_t size) {
  unsigned char bytes[16] = {};
  size = std::min(size, sizeof bytes);
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::getrandom(bytes + got, size - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got < size) {  // no getrandom: unique enough with O_EXCL retried by the caller
    static uint64_t counter = 0;
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    const uint64_t v[2] = {
        static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec),
        ++counter ^ static_cast<uint64_t>(::getpid())};
    std::memcpy(bytes, v, sizeof bytes);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < size; ++i) {
    const unsigned char b = bytes[i];
    out += kHex[b >> 4];
    out += kHex[b & 0xF];
  }
  return out;
}

}  // namespace sbx::agent::files
