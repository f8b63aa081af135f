// The execd file routes on the gateway (docs/serve.md), never holding a whole file in memory:
//   POST /files/upload      multipart/form-data, pairs of a `metadata` part (JSON {path, owner?,
//                           group?, mode?}) and a `file` part; each file part is streamed to a
//                           temp file as it arrives, then Sandbox::upload_async
//   GET  /files/download?path=   Sandbox::download_async to a temp file (measured against the
//                           server's temp space, cancelled when the client hangs up), then sent in
//                           64 KiB pieces; Range (one range) answers 206, an unsatisfiable one 416
//   GET  /files/info?path=...    `stat` run in the sandbox, one line per path
// and what the other file routes (routes_execd_fs.cpp) share: shell_quote, format_time_ns and the
// FileInfo of a `stat` line (file_info_json).
//
// THREADING: the upload's body arrives on the connection's strand (BodySink); provider calls are
// asynchronous and their continuations (plugin threads) answer through Reply or the ChunkSink.
// OWNERSHIP: every temp file (in the server's temp dir) is owned by a TempFile, removed when the
// last holder lets go: on success, on an error and when the client goes away.

#include "faults.hpp"
#include "flow_gate.hpp"
#include "line_cutter.hpp"
#include "state.hpp"

#include <sbx/base/shell_quote.hpp>

#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <mutex>
#include <optional>
#include <vector>

namespace sbx::serve {

namespace json = boost::json;
namespace fs = std::filesystem;
namespace asio = boost::asio;

std::string shell_quote(const std::string& s) {
  return base::shell_quote(s);
}

std::string format_time_ns(int64_t unix_s) {
  const std::time_t secs = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.000000000Z", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  return buf;
}

std::optional<json::object> file_info_json(const std::string& path, std::string_view fields) {
  std::vector<std::string> f;
  for (std::size_t s = 0;;) {
    const auto bar = fields.find('|', s);
    f.emplace_back(
        fields.substr(s, bar == std::string_view::npos ? std::string_view::npos : bar - s));
    if (bar == std::string_view::npos) break;
    s = bar + 1;
  }
  if (f.size() != 7) return std::nullopt;
  std::string type = "other";
  if (f[0].find("regular") != std::string::npos) type = "file";
  if (f[0] == "directory") type = "directory";
  if (f[0] == "symbolic link") type = "symlink";
  try {
    return json::object{{"path", path},
                        {"type", type},
                        {"size", std::stoll(f[1])},
                        {"modified_at", format_time_ns(std::stoll(f[2]))},
                        {"created_at", format_time_ns(std::stoll(f[3]))},
                        {"owner", f[4]},
                        {"group", f[5]},
                        {"mode", std::stoll(f[6])}};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {

constexpr std::size_t kPiece = 64 * 1024;  // bytes per download write
// How often a download being staged is measured against the temp space.
constexpr auto kStagingCheck = std::chrono::milliseconds(50);
constexpr std::size_t kMaxPartHeaders = 16 * 1024;  // a multipart part's header block
constexpr std::size_t kMaxMetadata = 64 * 1024;     // a metadata part's JSON

// A file in the server's temp dir, removed with its last holder; the bytes it took from the
// server's temp space (State::temp_space) are given back then.
struct TempFile {
  std::shared_ptr<Server::State> state;
  fs::path path;
  int fd = -1;
  uint64_t taken = 0;  // from state->temp_space
  TempFile(std::shared_ptr<Server::State> s, const std::string& what) : state(std::move(s)) {
    path = state->temp_dir / (what + "-" + new_request_id());
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
      throw std::runtime_error("cannot create " + path.string() + ": " + std::strerror(errno));
  }
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    ::unlink(path.c_str());
    state->temp_space.give(taken);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  void close_fd() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

std::string temp_full(const Server::State& state) {
  return "the server's temporary space for transfers is full (at most " +
         std::to_string(state.temp_space.limit()) +
         " bytes at once, serve.temp_limit); try again later";
}

std::string file_not_found(const std::string& op, const std::string& path) {
  return "file not found. " + op + " " + path + ": no such file or directory";
}

// ----------------------------------------------------------------------------------------------
// Upload

struct FileMeta {
  std::string path;
  std::optional<std::string> owner, group;
  std::optional<uint32_t> mode;  // permission bits, from the decimal-encoded octal
};

struct Pair {
  FileMeta meta;
  std::shared_ptr<TempFile> file;
};

// The value of `key` in a header's parameters (name="x"; filename="y").
std::optional<std::string> header_param(const std::string& header, const std::string& key) {
  std::size_t at = 0;
  while ((at = header.find(key + "=", at)) != std::string::npos) {
    if (at > 0 && header[at - 1] != ' ' && header[at - 1] != ';' && header[at - 1] != '\t') {
      at += key.size();
      continue;
    }
    std::size_t start = at + key.size() + 1;
    if (start < header.size() && header[start] == '"') {
      const auto end = header.find('"', start + 1);
      if (end == std::string::npos) return std::nullopt;
      return header.substr(start + 1, end - start - 1);
    }
    const auto end = header.find(';', start);
    return header.substr(start, end == std::string::npos ? std::string::npos : end - start);
  }
  return std::nullopt;
}

std::string lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::optional<FileMeta> parse_metadata(const std::string& text, std::string& why) {
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) {
    why = "invalid metadata: not a JSON object";
    return std::nullopt;
  }
  const auto& o = v.as_object();
  FileMeta m;
  const auto* path = o.if_contains("path");
  if (!path || !path->is_string() || path->as_string().empty()) {
    why = "invalid metadata: path is required";
    return std::nullopt;
  }
  m.path = std::string(path->as_string());
  for (const char* name : {"owner", "group"}) {
    const auto* f = o.if_contains(name);
    if (!f || f->is_null()) continue;
    if (!f->is_string()) {
      why = std::string("invalid metadata: ") + name + " must be a string";
      return std::nullopt;
    }
    if (f->as_string().empty()) continue;
    (std::string(name) == "owner" ? m.owner : m.group) = std::string(f->as_string());
  }
  if (const auto* mode = o.if_contains("mode"); mode && !mode->is_null()) {
    int64_t n = -1;
    if (mode->is_int64()) n = mode->as_int64();
    if (mode->is_uint64() && mode->as_uint64() < 100000)
      n = static_cast<int64_t>(mode->as_uint64());
    const std::string digits = std::to_string(n);
    if (n < 0 || n > 7777 || digits.find_first_of("89") != std::string::npos) {
      why = "invalid metadata: mode must be an octal permission written in decimal, e.g. 644";
      return std::nullopt;
    }
    if (n != 0) m.mode = static_cast<uint32_t>(std::stoul(digits, nullptr, 8));
  }
  return m;
}

// A multipart/form-data body parsed as it arrives: metadata parts kept (small), file parts written
// to temp files. Then each pair is uploaded in turn.
class UploadSink final : public BodySink, public std::enable_shared_from_this<UploadSink> {
 public:
  UploadSink(std::shared_ptr<Server::State> state, std::shared_ptr<Entry> entry,
             std::string boundary, Reply reply, unsigned version)
      : state_(std::move(state)),
        entry_(std::move(entry)),
        delimiter_("\r\n--" + boundary),
        reply_(std::move(reply)),
        version_(version) {
    buffer_ = "\r\n";  // the first delimiter has no line break before it
  }

  bool write(std::string_view bytes) override {
    if (answered_) return false;
    buffer_.append(bytes);
    return parse();
  }

  void finish() override {
    if (answered_) return;
    if (phase_ != Phase::end) {
      fail(http::status::bad_request, "INVALID_FILE_CONTENT",
           "the multipart body ended before its closing boundary");
      return;
    }
    if (pending_meta_) {
      fail(http::status::bad_request, "INVALID_FILE",
           "file is missing for metadata " + pending_meta_->path);
      return;
    }
    if (pairs_.empty()) {
      fail(http::status::bad_request, "INVALID_FILE", "no file in the request");
      return;
    }
    next(0);
  }

  void abort() override {
    answered_ = true;
    pairs_.clear();
    current_.reset();
  }

 private:
  enum class Phase { preamble, after_delimiter, headers, body, end };

  Request shape() const {
    Request r;
    r.version(version_);
    return r;
  }

  void fail(http::status status, const std::string& code, const std::string& message) {
    finish(execd_error(shape(), status, code, message));
  }
  void finish(Response response) {
    if (answered_) return;
    answered_ = true;
    pairs_.clear();
    current_.reset();
    reply_(std::move(response));
  }

  // Consumes what it can of buffer_; false once it answered.
  bool parse() {
    while (!answered_) {
      switch (phase_) {
        case Phase::preamble: {
          const auto at = buffer_.find(delimiter_);
          if (at == std::string::npos) {
            if (buffer_.size() > delimiter_.size())
              buffer_.erase(0, buffer_.size() - delimiter_.size());
            return true;
          }
          buffer_.erase(0, at + delimiter_.size());
          phase_ = Phase::after_delimiter;
          break;
        }
        case Phase::after_delimiter: {
          if (buffer_.size() < 2) return true;
          if (buffer_.compare(0, 2, "--") == 0) {
            phase_ = Phase::end;
            buffer_.clear();
            return true;
          }
          const auto eol = buffer_.find("\r\n");
          if (eol == std::string::npos) {
            if (buffer_.size() > 256) {
              fail(http::status::bad_request, "INVALID_FILE_CONTENT", "malformed multipart body");
            }
            return !answered_;
          }
          buffer_.erase(0, eol + 2);  // transport padding, then the line break
          phase_ = Phase::headers;
          break;
        }
        case Phase::headers: {
          const auto end = buffer_.find("\r\n\r\n");
          const bool empty_headers = buffer_.compare(0, 2, "\r\n") == 0;
          if (end == std::string::npos && !empty_headers) {
            if (buffer_.size() > kMaxPartHeaders) {
              fail(http::status::bad_request, "INVALID_FILE_CONTENT",
                   "a multipart part's headers are too long");
            }
            return !answered_;
          }
          const std::string headers = empty_headers ? std::string() : buffer_.substr(0, end);
          buffer_.erase(0, empty_headers ? 2 : end + 4);
          if (!begin_part(headers)) return false;
          phase_ = Phase::body;
          break;
        }
        case Phase::body: {
          const auto at = buffer_.find(delimiter_);
          if (at == std::string::npos) {
            // Keep what could be the start of a delimiter.
            const std::size_t keep = std::min(buffer_.size(), delimiter_.size() - 1);
            if (!part_bytes(std::string_view(buffer_).substr(0, buffer_.size() - keep))) {
              return false;
            }
            buffer_.erase(0, buffer_.size() - keep);
            return true;
          }
          if (!part_bytes(std::string_view(buffer_).substr(0, at))) return false;
          buffer_.erase(0, at + delimiter_.size());
          if (!end_part()) return false;
          phase_ = Phase::after_delimiter;
          break;
        }
        case Phase::end:
          buffer_.clear();
          return true;
      }
    }
    return false;
  }

  bool begin_part(const std::string& headers) {
    std::string disposition;
    std::size_t start = 0;
    while (start <= headers.size()) {
      auto eol = headers.find("\r\n", start);
      if (eol == std::string::npos) eol = headers.size();
      const std::string line = headers.substr(start, eol - start);
      const auto colon = line.find(':');
      if (colon != std::string::npos && lower(line.substr(0, colon)) == "content-disposition") {
        disposition = line.substr(colon + 1);
      }
      start = eol + 2;
    }
    const auto name = header_param(disposition, "name");
    part_ = Part::other;
    if (name == "metadata") {
      if (pending_meta_) {
        fail(http::status::bad_request, "INVALID_FILE",
             "file is missing for metadata " + pending_meta_->path);
        return false;
      }
      part_ = Part::metadata;
      metadata_.clear();
    } else if (name == "file") {
      if (!pending_meta_) {
        fail(http::status::bad_request, "INVALID_FILE_METADATA", "metadata file is missing");
        return false;
      }
      part_ = Part::file;
      try {
        current_ = std::make_shared<TempFile>(state_, "upload");
      } catch (const std::exception& e) {
        fail(http::status::internal_server_error, "RUNTIME_ERROR", e.what());
        return false;
      }
    }
    return true;
  }

  bool part_bytes(std::string_view bytes) {
    if (bytes.empty()) return true;
    if (part_ == Part::metadata) {
      metadata_.append(bytes);
      if (metadata_.size() > kMaxMetadata) {
        fail(http::status::bad_request, "INVALID_FILE_METADATA", "metadata is too long");
        return false;
      }
    } else if (part_ == Part::file) {
      if (!state_->temp_space.take(bytes.size())) {
        fail(http::status::insufficient_storage, "INSUFFICIENT_STORAGE", temp_full(*state_));
        return false;
      }
      current_->taken += bytes.size();
      std::size_t done = 0;
      while (done < bytes.size()) {
        const ssize_t n = ::write(current_->fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          fail(http::status::internal_server_error, "RUNTIME_ERROR",
               std::string("cannot write the upload's temp file: ") + std::strerror(errno));
          return false;
        }
        done += static_cast<std::size_t>(n);
      }
    }
    return true;
  }

  bool end_part() {
    if (part_ == Part::metadata) {
      std::string why;
      auto meta = parse_metadata(metadata_, why);
      if (!meta) {
        fail(http::status::bad_request, "INVALID_FILE_METADATA", why);
        return false;
      }
      pending_meta_ = std::move(meta);
    } else if (part_ == Part::file) {
      // The upload keeps the local permission bits: they are the requested mode (default 0644).
      const uint32_t mode = pending_meta_->mode.value_or(0644);
      if (::fchmod(current_->fd, mode) != 0) {
        fail(http::status::internal_server_error, "RUNTIME_ERROR",
             std::string("chmod of the upload's temp file: ") + std::strerror(errno));
        return false;
      }
      current_->close_fd();
      pairs_.push_back({std::move(*pending_meta_), std::move(current_)});
      pending_meta_.reset();
      current_.reset();
    }
    part_ = Part::other;
    return true;
  }

  // Uploads pair i, then the next; answers once all are in (or at the first failure).
  void next(std::size_t i) {
    if (i == pairs_.size()) {
      pairs_.clear();
      answered_ = true;
      reply_(empty_response(shape(), http::status::ok));
      return;
    }
    const Pair& pair = pairs_[i];
    sbx::Operation<void> op;
    try {
      op = entry_->box()->upload_async(pair.file->path, pair.meta.path);
    } catch (...) {
      upload_failed(std::current_exception(), pair.meta.path);
      return;
    }
    op.then([self = shared_from_this(), i](sbx::Operation<void>& done) {
      Pair& pair = self->pairs_[i];
      try {
        done.get();
      } catch (...) {
        self->upload_failed(std::current_exception(), pair.meta.path);
        return;
      }
      pair.file.reset();  // the temp file goes now
      if (pair.meta.owner || pair.meta.group) {
        self->chown(i);
        return;
      }
      self->next(i + 1);
    });
  }

  // owner/group by name, as execd: a failure is logged, not an error.
  void chown(std::size_t i) {
    const Pair& pair = pairs_[i];
    const std::string spec =
        pair.meta.owner.value_or("") + (pair.meta.group ? ":" + *pair.meta.group : std::string());
    sbx::ExecOptions options;
    options.timeout_s = 60;
    sbx::Operation<sbx::ExecResult> op;
    try {
      op = entry_->box()->exec_async(
          "chown " + shell_quote(spec) + " -- " + shell_quote(pair.meta.path), std::move(options));
    } catch (const std::exception& e) {
      spdlog::warn("sbx serve: chown {} {}: {}", spec, pair.meta.path, e.what());
      next(i + 1);
      return;
    }
    op.then([self = shared_from_this(), i, spec](sbx::Operation<sbx::ExecResult>& done) {
      try {
        const auto r = done.get();
        if (r.return_code != 0) {
          spdlog::warn("sbx serve: chown {} {}: exit {}", spec, self->pairs_[i].meta.path,
                       r.return_code);
        }
      } catch (const std::exception& e) {
        spdlog::warn("sbx serve: chown {} {}: {}", spec, self->pairs_[i].meta.path, e.what());
      }
      self->next(i + 1);
    });
  }

  void upload_failed(std::exception_ptr error, const std::string& path) {
    const sbx::Error e = sbx::to_error(error);
    spdlog::info("sbx serve: upload to {} failed: {}", path, e.what());
    if (sandbox_gone(e, *entry_)) {
      finish(sandbox_gone_response(shape(), e, entry_->id));
    } else if (e.status() == SBX_STATUS_INVALID_ARGUMENT) {
      fail(http::status::bad_request, "INVALID_FILE", e.what());
    } else {
      fail(http::status::internal_server_error, "RUNTIME_ERROR", e.what());
    }
  }

  enum class Part { other, metadata, file };

  std::shared_ptr<Server::State> state_;
  std::shared_ptr<Entry> entry_;
  const std::string delimiter_;
  Reply reply_;
  unsigned version_;
  std::string buffer_;  // bytes not consumed yet (at most a delimiter's worth in a file part)
  Phase phase_ = Phase::preamble;
  Part part_ = Part::other;
  std::string metadata_;
  std::optional<FileMeta> pending_meta_;
  std::shared_ptr<TempFile> current_;
  std::vector<Pair> pairs_;
  bool answered_ = false;
};

// ----------------------------------------------------------------------------------------------
// Download

// The query's line slice, nullopt when it names neither; `why` is set for a bad value.
std::optional<LineSlice> parse_line_slice(const Request& request, std::string& why) {
  const auto offsets = query_values(request, "offset");
  const auto limits = query_values(request, "limit");
  if (offsets.empty() && limits.empty()) return std::nullopt;
  const auto positive = [&](const std::vector<std::string>& values, const char* name,
                            uint64_t& out) {
    if (values.empty()) return true;
    const std::string& v = values.front();
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n < 1) {
      why = std::string("query parameter '") + name + "' must be an integer of at least 1, not '" +
            v + "'";
      return false;
    }
    out = n;
    return true;
  };
  LineSlice slice;
  uint64_t limit = 0;
  if (!positive(offsets, "offset", slice.offset) || !positive(limits, "limit", limit)) {
    return LineSlice{};
  }
  if (!limits.empty()) slice.limit = limit;
  return slice;
}

// "bytes=a-b" / "bytes=a-" / "bytes=-n" of a file of `size` bytes: [first, last], or nullopt when
// unsatisfiable; `ignored` when the header is not one range we understand (the whole file then).
struct Range {
  uint64_t first = 0, last = 0;
};
std::optional<Range> parse_range(const std::string& header, uint64_t size, bool& ignored) {
  ignored = false;
  const std::string prefix = "bytes=";
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() < 19 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  if (header.rfind(prefix, 0) != 0 || header.find(',') != std::string::npos) {
    ignored = true;
    return std::nullopt;
  }
  const std::string spec = header.substr(prefix.size());
  const auto dash = spec.find('-');
  if (dash == std::string::npos) {
    ignored = true;
    return std::nullopt;
  }
  const std::string a = spec.substr(0, dash), b = spec.substr(dash + 1);
  if (a.empty()) {
    if (!digits(b)) {
      ignored = true;
      return std::nullopt;
    }
    const uint64_t n = std::stoull(b);
    if (n == 0 || size == 0) return std::nullopt;
    return Range{size - std::min(n, size), size - 1};
  }
  if (!digits(a) || (!b.empty() && !digits(b))) {
    ignored = true;
    return std::nullopt;
  }
  const uint64_t first = std::stoull(a);
  uint64_t last = b.empty() ? size - 1 : std::stoull(b);
  if (!b.empty() && last < first) {
    ignored = true;
    return std::nullopt;
  }
  if (first >= size) return std::nullopt;
  last = std::min(last, size - 1);
  return Range{first, last};
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string out;
  for (const char c : name)
    if (c != '"' && c != '\\' && c != '\r' && c != '\n') out += c;
  return out;
}

// One GET /files/download, streamed from the provider to the client (Sandbox::download_to_async):
// nothing is staged on the host. The head goes out once the provider says the file's size (a
// Content-Length; a range answered 206), or with its first bytes when it cannot say (chunked,
// the whole file: a Range is then ignored, as HTTP lets a server do). Line mode (offset/limit) is
// chunked and stops the download past its last line. A client that reads slowly holds the
// download at the provider (sbx.flow/1, FlowGate); one whose provider cannot hold it is cut past
// Options::stream_buffer bytes waiting. An error before the head is execd's error answer; after
// it, the body is cut short (the client sees it end before its length or last chunk).
// THREADING: on_size and on_data come on a plugin thread, one at a time; the sink's callbacks on
// the connection's strand; the mutex orders them.
class Download : public std::enable_shared_from_this<Download> {
 public:
  Download(std::shared_ptr<Server::State> state, std::shared_ptr<Entry> entry, std::string path,
           std::string range, std::optional<LineSlice> lines, unsigned version, Reply reply,
           OpenStream open_stream)
      : state_(std::move(state)),
        entry_(std::move(entry)),
        path_(std::move(path)),
        range_(std::move(range)),
        lines_(std::move(lines)),
        version_(version),
        reply_(std::move(reply)),
        open_stream_(std::move(open_stream)),
        flow_(std::min<std::size_t>(state_->limits.stream_buffer.load(), kHoldAbove),
              std::min<std::size_t>(state_->limits.stream_buffer.load(), kHoldAbove) / 4) {
    if (lines_) cutter_.emplace(*lines_);
  }

  void start(const WatchHangup& watch_hangup) {
    std::weak_ptr<Download> weak = weak_from_this();
    sbx::DownloadSink sink;
    sink.on_size = [weak](uint64_t size) {
      if (auto self = weak.lock()) self->on_size(size);
    };
    sink.on_data = [weak](std::string_view bytes) {
      auto self = weak.lock();
      return self && self->on_data(bytes);
    };
    sbx::Operation<void> op;
    try {
      op = entry_->box()->download_to_async(path_, std::move(sink));
    } catch (...) {
      failed(std::current_exception());
      return;
    }
    bool gone = false;
    {
      std::lock_guard lock(mutex_);
      op_ = op;
      gone = hung_up_;  // the client went away before the operation was known here
    }
    if (gone) op.cancel();
    flow_.set_hold([op](bool hold) { return op.hold_output(hold); }, nullptr);
    // Before the head: a client that hangs up cancels it (after: the sink's on_gone does).
    watch_hangup([weak] {
      if (auto self = weak.lock()) self->hung_up();
    });
    op.then([self = shared_from_this()](sbx::Operation<void>& done) { self->ended(done); });
  }

 private:
  static constexpr std::size_t kHoldAbove = 1024 * 1024;

  Request shape() const {
    Request r;
    r.version(version_);
    return r;
  }

  // On the plugin's thread, before any byte: the head with the file's length (or the range's).
  void on_size(uint64_t size) {
    std::lock_guard lock(mutex_);
    if (answered_) return;
    size_ = size;
    Response head{http::status::ok, version_};
    if (lines_) {
      open_locked(chunked_head(), true);
      return;
    }
    if (!range_.empty()) {
      bool ignored = false;
      const auto r = parse_range(range_, size, ignored);
      if (!r && !ignored) {
        Response refused = execd_error(shape(), http::status::range_not_satisfiable, "INVALID_FILE",
                                       "requested range not satisfiable: " + range_);
        refused.set(http::field::content_range, "bytes */" + std::to_string(size));
        answered_ = true;
        stop_ = true;
        reply_(std::move(refused));
        return;
      }
      if (r) {
        head.result(http::status::partial_content);
        first_ = r->first;
        end_ = r->last + 1;
        head.set(http::field::content_range, "bytes " + std::to_string(r->first) + "-" +
                                                 std::to_string(r->last) + "/" +
                                                 std::to_string(size));
      }
    }
    if (!end_) end_ = size;
    if (head.result() == http::status::ok) head.set(http::field::accept_ranges, "bytes");
    file_headers(head);
    head.content_length(*end_ - first_);
    open_locked(std::move(head), false);
  }

  // On the plugin's thread: the bytes in the range (or lines) go to the client. False stops the
  // download: the client went away, the range or the lines are done, or a client whose
  // provider cannot hold the download let too much wait.
  bool on_data(std::string_view bytes) {
    std::unique_lock lock(mutex_);
    if (stop_) return false;
    if (!sink_) {  // no size was said: the whole file, chunked
      if (answered_) return false;
      if (lines_) {
        open_locked(chunked_head(), true);
      } else {
        Response head{http::status::ok, version_};
        file_headers(head);
        open_locked(std::move(head), true);
      }
    }
    const uint64_t at = seen_;
    seen_ += bytes.size();
    std::string_view part = bytes;
    if (cutter_) {
      part = cutter_->cut(bytes);
      if (cutter_->done()) stop_ = true;
    } else {
      const uint64_t from = first_ > at ? first_ - at : 0;
      const uint64_t to =
          end_ ? std::min<uint64_t>(bytes.size(), *end_ > at ? *end_ - at : 0) : bytes.size();
      part = from < to ? bytes.substr(from, to - from) : std::string_view();
      // A range that ends before the file does: the rest is not read.
      if (end_ && size_ && *end_ < *size_ && seen_ >= *end_) stop_ = true;
    }
    if (!part.empty()) {
      sink_->send(std::string(part), [weak = weak_from_this()] {
        if (auto self = weak.lock()) self->flow_.update(*self->sink_);
      });
    }
    const bool stop = stop_;
    auto sink = sink_;
    lock.unlock();
    flow_.update(*sink);
    if (!flow_.can_hold() && sink->queued() > state_->limits.stream_buffer.load()) {
      spdlog::warn(
          "sbx serve: cutting the download of {} from sandbox {}: its client let more "
          "than {} bytes wait, and the provider cannot hold it",
          path_, entry_->id, state_->limits.stream_buffer.load());
      cut();
      return false;
    }
    return !stop;
  }

  // On the completing thread: the body ends, or is cut short when the download failed after its
  // head went out.
  void ended(sbx::Operation<void>& done) {
    std::exception_ptr error;
    try {
      done.get();
    } catch (...) {
      error = std::current_exception();
    }
    std::unique_lock lock(mutex_);
    if (cut_) return;
    if (hung_up_) {  // nobody to answer; a request not answered yet still is (to no one)
      const bool answered = answered_;
      lock.unlock();
      if (!answered) failed(error);
      return;
    }
    // Stopped by on_data (the range or the lines are done): the download's own end.
    if (error && !(stop_ && sink_)) {
      if (!sink_) {
        const bool answered = answered_;
        lock.unlock();
        if (!answered) failed(error);
        return;
      }
      const sbx::Error e = sbx::to_error(error);
      spdlog::info("sbx serve: the download of {} from sandbox {} failed after its head: {}", path_,
                   entry_->id, e.what());
      sandbox_gone(e, *entry_);  // remembered: the next call answers 409 at once
      auto sink = sink_;
      lock.unlock();
      sink->abort();  // the client sees the body end short
      return;
    }
    if (answered_ && !sink_) return;  // a 416
    if (!sink_) empty_answer_locked();
    auto sink = sink_;
    lock.unlock();
    sink->end();
  }

  // The file had no byte and no size was said: an empty answer.
  void empty_answer_locked() {
    Response head{http::status::ok, version_};
    if (lines_) {
      open_locked(chunked_head(), true);
      return;
    }
    file_headers(head);
    head.set(http::field::accept_ranges, "bytes");
    head.content_length(0);
    open_locked(std::move(head), false);
  }

  Response chunked_head() const {
    Response head{http::status::ok, version_};
    head.set(http::field::content_type, "text/plain; charset=utf-8");
    return head;
  }
  void file_headers(Response& head) const {
    head.set(http::field::content_disposition, "attachment; filename=\"" + base_name(path_) + "\"");
    head.set(http::field::content_type, "application/octet-stream");
  }

  // With the mutex held: the answer's head goes out; the client going away stops the download.
  void open_locked(Response head, bool chunked) {
    answered_ = true;
    sink_ = open_stream_(std::move(head), chunked);
    sink_->never_stall();          // held at the provider, not cut, while the client reads slowly
    if (state_->options.faults) {  // the fault plan's cut_after_events: N pieces (faults.hpp)
      if (const auto n = state_->options.faults->stream_cut("GET /files/download", entry_->id))
        sink_->cut_after(*n);
    }
    sink_->on_gone([weak = weak_from_this()] {
      if (auto self = weak.lock()) self->hung_up();
    });
  }

  void hung_up() {
    sbx::Operation<void> op;
    {
      std::lock_guard lock(mutex_);
      if (hung_up_) return;
      stop_ = true;
      hung_up_ = true;
      op = op_;
    }
    spdlog::info("sbx serve: download of {} from sandbox {} cancelled: its client went away", path_,
                 entry_->id);
    if (op.valid()) op.cancel();  // else start() cancels it once known
  }

  void cut() {
    std::shared_ptr<ChunkSink> sink;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      cut_ = true;
      sink = sink_;
    }
    if (sink) sink->abort();
  }

  // Before the head: the error as execd answers it.
  void failed(std::exception_ptr error) {
    bool hung_up = false;
    {
      std::lock_guard lock(mutex_);
      if (answered_) return;
      answered_ = true;
      hung_up = hung_up_;
    }
    const Request r = shape();
    if (hung_up) {
      reply_(execd_error(r, http::status::bad_request, "RUNTIME_ERROR",
                         "the client went away"));  // written to no one
      return;
    }
    const sbx::Error e = sbx::to_error(error);
    if (sandbox_gone(e, *entry_)) {
      reply_(sandbox_gone_response(r, e, entry_->id));
    } else if (e.status() == SBX_STATUS_NOT_FOUND) {
      reply_(
          execd_error(r, http::status::not_found, "FILE_NOT_FOUND", file_not_found("open", path_)));
    } else {
      reply_(execd_error(r, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
    }
  }

  const std::shared_ptr<Server::State> state_;
  const std::shared_ptr<Entry> entry_;
  const std::string path_;
  const std::string range_;  // the Range header, or empty
  const std::optional<LineSlice> lines_;
  const unsigned version_;
  const Reply reply_;
  const OpenStream open_stream_;
  FlowGate flow_;

  std::mutex mutex_;
  sbx::Operation<void> op_;  // once started
  bool answered_ = false;    // the head (or an error answer) went out
  std::shared_ptr<ChunkSink> sink_;
  std::optional<uint64_t> size_;
  uint64_t first_ = 0;           // the range's first byte
  std::optional<uint64_t> end_;  // one past its last
  uint64_t seen_ = 0;            // bytes of the file that came so far
  std::optional<LineCutter> cutter_;
  bool stop_ = false;     // nothing more is wanted (done, cut, or the client gone)
  bool cut_ = false;      // cut for a slow client
  bool hung_up_ = false;  // the client went away
};

void download(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
              const Request& request, const Reply& reply, const OpenStream& open_stream,
              const WatchHangup& watch_hangup) {
  const auto paths = query_values(request, "path");
  if (paths.empty() || paths.front().empty()) {
    reply(execd_error(request, http::status::bad_request, "MISSING_QUERY",
                      "missing query parameter 'path'"));
    return;
  }
  std::string why;
  std::optional<LineSlice> lines = parse_line_slice(request, why);
  if (!why.empty()) {
    reply(execd_error(request, http::status::bad_request, "INVALID_REQUEST_BODY", why));
    return;
  }
  const auto range_header = request.find(http::field::range);
  if (lines && range_header != request.end()) {
    reply(execd_error(request, http::status::bad_request, "INVALID_REQUEST_BODY",
                      "offset/limit and the Range header cannot be used together"));
    return;
  }
  std::string range =
      range_header == request.end() ? std::string() : std::string(range_header->value());
  auto d = std::make_shared<Download>(state, entry, paths.front(), std::move(range),
                                      std::move(lines), request.version(), reply, open_stream);
  d->start(watch_hangup);
}

// ----------------------------------------------------------------------------------------------
// Info

void info(const std::shared_ptr<Entry>& entry, const Request& request, const Reply& reply) {
  const auto paths = query_values(request, "path");
  if (paths.empty()) {
    reply(execd_error(request, http::status::bad_request, "MISSING_QUERY",
                      "missing query parameter 'path'"));
    return;
  }
  std::string quoted;
  for (const auto& p : paths) {
    if (p.empty() || p.find_first_of("\n\r") != std::string::npos) {
      reply(execd_error(request, http::status::bad_request, "INVALID_REQUEST_BODY",
                        "invalid path: " + p));
      return;
    }
    quoted += " " + shell_quote(p);
  }
  // One line per path: type|size|mtime|ctime|uid|gid|octal mode, or "?" when it cannot be stat'ed.
  const std::string command = "for p in" + quoted + "; do stat -c '" + kStatFormat +
                              "' -- \"$p\" 2>/dev/null || echo '?'; done";
  sbx::ExecOptions options;
  options.timeout_s = 60;
  const auto version = request.version();
  sbx::Operation<sbx::ExecResult> op;
  try {
    op = entry->box()->exec_async(command, std::move(options));
  } catch (const std::exception& e) {
    reply(execd_error(request, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
    return;
  }
  op.then([paths, version, reply](sbx::Operation<sbx::ExecResult>& done) {
    Request shape;
    shape.version(version);
    sbx::ExecResult result;
    try {
      result = done.get();
    } catch (const std::exception& e) {
      reply(execd_error(shape, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
      return;
    }
    std::vector<std::string> lines;
    std::size_t start = 0;
    const std::string& out = result.stdout_text;
    while (start < out.size()) {
      auto eol = out.find('\n', start);
      if (eol == std::string::npos) eol = out.size();
      lines.push_back(out.substr(start, eol - start));
      start = eol + 1;
    }
    if (lines.size() != paths.size()) {
      reply(execd_error(shape, http::status::internal_server_error, "RUNTIME_ERROR",
                        "stat in the sandbox failed: " + result.stderr_text));
      return;
    }
    json::object body;
    for (std::size_t i = 0; i < paths.size(); ++i) {
      if (std::count(lines[i].begin(), lines[i].end(), '|') != 6) {  // "?": no such path
        reply(execd_error(shape, http::status::not_found, "FILE_NOT_FOUND",
                          file_not_found("stat", paths[i])));
        return;
      }
      auto file = file_info_json(paths[i], lines[i]);
      if (!file) {
        reply(execd_error(shape, http::status::internal_server_error, "RUNTIME_ERROR",
                          "unexpected stat output: " + lines[i]));
        return;
      }
      body[paths[i]] = std::move(*file);
    }
    Response r = json_response(shape, http::status::ok, body);
    r.set(http::field::content_type, "application/json; charset=utf-8");
    reply(std::move(r));
  });
}

}  // namespace

void get_files_download(const Call& call) {
  download(call.state, call.entry, call.request, call.reply, call.open_stream, call.watch_hangup);
}

void get_files_info(const Call& call) {
  info(call.entry, call.request, call.reply);
}

std::shared_ptr<BodySink> post_files_upload(const Call& call) {
  const Request& head = call.request;
  const Reply& reply = call.reply;
  const auto type = head.find(http::field::content_type);
  const std::string content_type = type == head.end() ? std::string() : std::string(type->value());
  std::optional<std::string> boundary;
  if (lower(content_type).rfind("multipart/form-data", 0) == 0) {
    boundary = header_param(content_type, "boundary");
  }
  if (!boundary || boundary->empty() || boundary->size() > 200) {
    reply(execd_error(head, http::status::bad_request, "INVALID_FILE",
                      "the body must be multipart/form-data with a boundary"));
    return nullptr;
  }
  return std::make_shared<UploadSink>(call.state, call.entry, *boundary, reply, head.version());
}

}  // namespace sbx::serve
