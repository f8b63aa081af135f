// The execd file routes on the gateway (docs/serve.md), never holding a whole file in memory
// (POST /files/upload is routes_execd_upload.cpp):
//   GET  /files/download?path=   Sandbox::download_to_async, streamed to the client as it arrives
//                           (held at the provider while the client reads slowly, cancelled when
//                           it hangs up); Range (one range) answers 206, an unsatisfiable one 416
//   GET  /files/info?path=...    `stat` run in the sandbox, one line per path
// and what the other file routes (routes_execd_fs.cpp) share: shell_quote, format_time_ns and the
// FileInfo of a `stat` line (file_info_json).
//
// THREADING: provider calls are asynchronous and their continuations (plugin threads) answer
// through Reply or the ChunkSink.

#include "faults.hpp"
#include "flow_gate.hpp"
#include "kept_exec.hpp"
#include "line_cutter.hpp"
#include "state.hpp"

#include <sbx/base/shell_quote.hpp>

#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
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

std::string file_not_found(const std::string& op, const std::string& path) {
  return "file not found. " + op + " " + path + ": no such file or directory";
}

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
  std::shared_ptr<KeptExec> exec;
  try {
    // A stat line is under 100 bytes; a sandbox's stat that prints more is stopped.
    exec = KeptExec::start(*entry->box(), command, std::move(options), 4096 * (paths.size() + 1));
  } catch (const std::exception& e) {
    reply(execd_error(request, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
    return;
  }
  exec->then([paths, version, reply](KeptExec& done) {
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

}  // namespace sbx::serve
