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

bool is_not_found(std::exception_ptr error) {
  return sbx::to_error(error).status() == SBX_STATUS_NOT_FOUND;
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

// Where a download is staged: a directory of its own in the server's temp dir, holding the file
// (and, while the provider writes, its partial file), removed with its last holder. The bytes it
// holds are taken from the server's temp space as they appear (measure()) and given back then.
struct Staging {
  std::shared_ptr<Server::State> state;
  fs::path dir;
  fs::path path;  // dir/file
  int fd = -1;    // once staged: the file, read by the Pump
  std::mutex mutex;
  uint64_t taken = 0;  // guarded by mutex

  explicit Staging(std::shared_ptr<Server::State> s) : state(std::move(s)) {
    dir = state->temp_dir / ("download-" + new_request_id());
    if (::mkdir(dir.c_str(), 0700) != 0)
      throw std::runtime_error("cannot create " + dir.string() + ": " + std::strerror(errno));
    path = dir / "file";
  }
  ~Staging() {
    if (fd >= 0) ::close(fd);
    std::error_code ignored;
    fs::remove_all(dir, ignored);
    state->temp_space.give(taken);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // Takes what the directory's files grew by since the last call from the temp space; false
  // when that would pass the limit. Any thread.
  bool measure() {
    uint64_t size = 0;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
        size += static_cast<uint64_t>(st.st_size);
    }
    std::lock_guard lock(mutex);
    if (size <= taken) return true;
    if (!state->temp_space.take(size - taken)) return false;
    taken = size;
    return true;
  }
};

// Sends [offset, offset + length) of the staged file through the sink, a piece at a time: the
// next piece is read once the last is written, so at most one piece is in memory.
struct Pump : std::enable_shared_from_this<Pump> {
  std::shared_ptr<Staging> file;
  std::shared_ptr<ChunkSink> sink;
  uint64_t offset = 0;
  uint64_t left = 0;

  void step() {
    if (left == 0 || sink->gone()) {
      sink->end();
      file.reset();
      return;
    }
    std::string piece(std::min<uint64_t>(left, kPiece), '\0');
    ssize_t n = -1;
    do {
      n = ::pread(file->fd, piece.data(), piece.size(), static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {  // the temp file is shorter than it was: cut the answer (the client sees it)
      spdlog::warn("sbx serve: a download's temp file ended early");
      sink->end();
      file.reset();
      return;
    }
    piece.resize(static_cast<std::size_t>(n));
    offset += static_cast<uint64_t>(n);
    left -= static_cast<uint64_t>(n);
    sink->send(std::move(piece), [self = shared_from_this()] { self->step(); });
  }
};

// While the provider stages a download: every kStagingCheck, the staged bytes are measured against
// the temp space; over it, the download is cancelled. Runs on a strand of its own until stop().
struct StagingWatch : std::enable_shared_from_this<StagingWatch> {
  std::shared_ptr<Staging> staging;
  sbx::Operation<void> op;
  asio::strand<asio::io_context::executor_type> strand;
  asio::steady_timer timer;
  bool stopped = false;              // on `strand`
  std::atomic<bool> over{false};     // the temp space ran out: the download was cancelled
  std::atomic<bool> hung_up{false};  // the client went away: the download was cancelled

  StagingWatch(asio::io_context& ioc, std::shared_ptr<Staging> s)
      : staging(std::move(s)), strand(asio::make_strand(ioc)), timer(strand) {}

  void start() {
    asio::post(strand, [self = shared_from_this()] { self->arm(); });
  }
  void arm() {
    if (stopped) return;
    timer.expires_after(kStagingCheck);
    timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->stopped) return;
      if (!self->staging->measure()) {
        self->over = true;
        self->op.cancel();
        return;
      }
      self->arm();
    });
  }
  void stop() {
    asio::post(strand, [self = shared_from_this()] {
      self->stopped = true;
      self->timer.cancel();
    });
  }
};

// Line mode of a download (newer execd): `offset` (1-based, default 1) and `limit` (default: to
// the end) select whole lines; each keeps its newline, a last line without one comes as it is.
struct LineSlice {
  uint64_t offset = 1;
  std::optional<uint64_t> limit;
};

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

// The bytes [first, first + length) of the lines `slice` selects in the open file `fd` of `size`
// bytes (read in 64 KiB pieces); false if the file cannot be read.
bool find_lines(int fd, uint64_t size, const LineSlice& slice, uint64_t& first, uint64_t& length) {
  // Where the first line wanted starts, and where the first line after them starts.
  std::optional<uint64_t> start = slice.offset == 1 ? std::optional<uint64_t>(0) : std::nullopt;
  std::optional<uint64_t> end;
  // The first line not wanted; 0: none (no limit, or the sum passes uint64: no file has that
  // many lines).
  const uint64_t stop_line =
      slice.limit && *slice.limit <= std::numeric_limits<uint64_t>::max() - slice.offset
          ? slice.offset + *slice.limit
          : 0;
  uint64_t line = 1;  // the line being read
  std::vector<char> buffer(64 * 1024);
  for (uint64_t at = 0; at < size && !end;) {
    const ssize_t n = ::pread(fd, buffer.data(), buffer.size(), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    const char* p = buffer.data();
    const char* const stop = p + n;
    while (!end && (p = static_cast<const char*>(std::memchr(p, '\n', stop - p)))) {
      ++p;
      ++line;
      const uint64_t next = at + static_cast<uint64_t>(p - buffer.data());
      if (line == slice.offset) start = next;
      if (stop_line != 0 && line == stop_line) end = next;
    }
    at += static_cast<uint64_t>(n);
  }
  first = start.value_or(size);
  const uint64_t last = end.value_or(size);
  length = last > first ? last - first : 0;
  return true;
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

void download(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
              const Request& request, const Reply& reply, const OpenStream& open_stream,
              const WatchHangup& watch_hangup) {
  const auto paths = query_values(request, "path");
  if (paths.empty() || paths.front().empty()) {
    reply(execd_error(request, http::status::bad_request, "MISSING_QUERY",
                      "missing query parameter 'path'"));
    return;
  }
  const std::string path = paths.front();
  std::string why;
  const std::optional<LineSlice> lines = parse_line_slice(request, why);
  if (!why.empty()) {
    reply(execd_error(request, http::status::bad_request, "INVALID_REQUEST_BODY", why));
    return;
  }
  if (lines && request.find(http::field::range) != request.end()) {
    reply(execd_error(request, http::status::bad_request, "INVALID_REQUEST_BODY",
                      "offset/limit and the Range header cannot be used together"));
    return;
  }
  std::shared_ptr<Staging> file;
  try {
    file = std::make_shared<Staging>(state);
  } catch (const std::exception& e) {
    reply(execd_error(request, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
    return;
  }
  const auto range_header = request.find(http::field::range);
  const std::string range =
      range_header == request.end() ? std::string() : std::string(range_header->value());
  const auto version = request.version();
  sbx::Operation<void> op;
  try {
    op = entry->box()->download_async(path, file->path);
  } catch (...) {
    const sbx::Error e = sbx::to_error(std::current_exception());
    reply(execd_error(request, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
    return;
  }
  // The staged bytes count against the temp space; a client that hangs up cancels the download.
  auto watch = std::make_shared<StagingWatch>(state->ioc, file);
  watch->op = op;
  watch->start();
  watch_hangup([watch] {
    watch->hung_up = true;
    watch->op.cancel();
  });
  op.then([state, entry, id = entry->id, file, watch, path, range, lines, version, reply,
           open_stream](sbx::Operation<void>& done) {
    watch->stop();
    Request shape;
    shape.version(version);
    try {
      done.get();
    } catch (...) {
      const auto error = std::current_exception();
      if (watch->hung_up) {
        spdlog::info("sbx serve: download of {} from sandbox {} cancelled: its client went away",
                     path, id);
        reply(execd_error(shape, http::status::bad_request, "RUNTIME_ERROR",
                          "the client went away"));  // written to no one
      } else if (watch->over) {
        reply(execd_error(shape, http::status::insufficient_storage, "INSUFFICIENT_STORAGE",
                          temp_full(*state)));
      } else if (const sbx::Error e = sbx::to_error(error); sandbox_gone(e, *entry)) {
        reply(sandbox_gone_response(shape, e, id));
      } else if (is_not_found(error)) {
        reply(execd_error(shape, http::status::not_found, "FILE_NOT_FOUND",
                          file_not_found("open", path)));
      } else {
        reply(execd_error(shape, http::status::internal_server_error, "RUNTIME_ERROR",
                          sbx::to_error(error).what()));
      }
      return;
    }
    if (!file->measure()) {  // it grew past the limit after the last check
      reply(execd_error(shape, http::status::insufficient_storage, "INSUFFICIENT_STORAGE",
                        temp_full(*state)));
      return;
    }
    file->fd = ::open(file->path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (file->fd < 0 || ::fstat(file->fd, &st) != 0) {
      reply(execd_error(shape, http::status::internal_server_error, "RUNTIME_ERROR",
                        "cannot read the downloaded file"));
      return;
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    Response head{http::status::ok, version};
    uint64_t first = 0, length = size;
    if (!range.empty()) {
      bool ignored = false;
      const auto r = parse_range(range, size, ignored);
      if (!r && !ignored) {
        Response refused = execd_error(shape, http::status::range_not_satisfiable, "INVALID_FILE",
                                       "requested range not satisfiable: " + range);
        refused.set(http::field::content_range, "bytes */" + std::to_string(size));
        reply(std::move(refused));
        return;
      }
      if (r) {
        head.result(http::status::partial_content);
        first = r->first;
        length = r->last - r->first + 1;
        head.set(http::field::content_range, "bytes " + std::to_string(r->first) + "-" +
                                                 std::to_string(r->last) + "/" +
                                                 std::to_string(size));
      }
    }
    if (lines) {
      if (!find_lines(file->fd, size, *lines, first, length)) {
        reply(execd_error(shape, http::status::internal_server_error, "RUNTIME_ERROR",
                          "cannot read the downloaded file"));
        return;
      }
      head.set(http::field::content_type, "text/plain; charset=utf-8");
    } else {
      if (head.result() == http::status::ok) head.set(http::field::accept_ranges, "bytes");
      head.set(http::field::content_disposition,
               "attachment; filename=\"" + base_name(path) + "\"");
      head.set(http::field::content_type, "application/octet-stream");
    }
    head.content_length(length);
    auto pump = std::make_shared<Pump>();
    pump->file = file;
    pump->offset = first;
    pump->left = length;
    pump->sink = open_stream(std::move(head), false);
    if (state->options.faults) {  // the fault plan's cut_after_events: N pieces (faults.hpp)
      if (const auto n = state->options.faults->stream_cut("GET /files/download", id)) {
        pump->sink->cut_after(*n);
      }
    }
    pump->step();
  });
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
