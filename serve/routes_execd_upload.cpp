// POST /files/upload on the gateway (docs/serve.md): a multipart/form-data body of pairs, a
// `metadata` part (JSON {path, owner?, group?, mode?}) then a `file` part, parsed as it arrives.
// Each file part is written to a temp file as it arrives and uploaded from it
// (Sandbox::upload_async) once the body is in; owner/group: a chown in the sandbox after.
//
// THREADING: the body arrives on the connection's strand (BodySink); the uploads' continuations
// (plugin threads) answer through Reply, in turn, once the body is complete.
// OWNERSHIP: every temp file (in the server's temp dir) is owned by a TempFile, removed when the
// last holder lets go: on success, on an error and when the client goes away.

#include "kept_exec.hpp"
#include "multipart.hpp"
#include "state.hpp"

#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

namespace sbx::serve {

namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxMetadata = 64 * 1024;     // a metadata part's JSON
constexpr std::size_t kMaxChownOutput = 64 * 1024;  // chown's complaints (KeptExec)

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
class UploadSink final : public BodySink,
                         MultipartReader::Handler,
                         public std::enable_shared_from_this<UploadSink> {
 public:
  UploadSink(std::shared_ptr<Server::State> state, std::shared_ptr<Entry> entry,
             std::string_view boundary, Reply reply, unsigned version)
      : state_(std::move(state)),
        entry_(std::move(entry)),
        reader_(boundary),
        reply_(std::move(reply)),
        version_(version) {}

  bool write(std::string_view bytes) override {
    if (answered_) return false;
    if (reader_.feed(bytes, *this)) return true;
    if (!reader_.error().empty())
      fail(http::status::bad_request, "INVALID_FILE_CONTENT", reader_.error());
    return false;
  }

  void finish() override {
    if (answered_) return;
    if (!reader_.ended()) {
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

  bool begin_part(std::string_view headers) override {
    std::string disposition;
    std::size_t start = 0;
    while (start <= headers.size()) {
      auto eol = headers.find("\r\n", start);
      if (eol == std::string::npos) eol = headers.size();
      const std::string line(headers.substr(start, eol - start));
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

  bool part_bytes(std::string_view bytes) override {
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

  bool end_part() override {
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
    std::shared_ptr<KeptExec> exec;
    try {
      exec = KeptExec::start(*entry_->box(),
                             "chown " + shell_quote(spec) + " -- " + shell_quote(pair.meta.path),
                             std::move(options), kMaxChownOutput);
    } catch (const std::exception& e) {
      spdlog::warn("sbx serve: chown {} {}: {}", spec, pair.meta.path, e.what());
      next(i + 1);
      return;
    }
    exec->then([self = shared_from_this(), i, spec](KeptExec& done) {
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
  MultipartReader reader_;
  Reply reply_;
  unsigned version_;
  Part part_ = Part::other;
  std::string metadata_;
  std::optional<FileMeta> pending_meta_;
  std::shared_ptr<TempFile> current_;
  std::vector<Pair> pairs_;
  bool answered_ = false;
};

}  // namespace

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
