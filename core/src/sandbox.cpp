// sbx::Sandbox: exec, file transfer, status, endpoint and close through the provider ABI.

#include "sandbox_calls.hpp"

#include <sbx/abi/ext/connect.h>
#include <sbx/abi/ext/endpoint.h>
#include <sbx/abi/ext/pause.h>
#include <sbx/abi/ext/renew.h>
#include <sbx/base/shell_quote.hpp>
#include <sbx/core/plugin_checks.hpp>
#include <sbx/core/sandbox.hpp>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <string>

namespace sbx {
namespace detail {
namespace {

namespace fs = std::filesystem;

// A file that says it is empty may be a pseudo-file whose size the kernel does not know
// (/proc/cpuinfo): it is read whole, up to this much, and uploaded from memory.
constexpr size_t kPseudoFileLimit = 64 * 1024 * 1024;

// What open(O_CREAT, 0666) would give a new file: 0666 less the process's umask, read from
// /proc/self/status (calling umask() to read it would change it for other threads meanwhile).
mode_t new_file_mode() {
  static const mode_t mode = [] {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Umask:", 0) == 0)
        return static_cast<mode_t>(0666 & ~std::stoul(line.substr(6), nullptr, 8));
    }
    return static_cast<mode_t>(0644);
  }();
  return mode;
}

// A completed operation, for answers the host knows without asking the plugin.
template <class T, class... A>
auto completed(const std::shared_ptr<Generation>& g, CallKind kind, A&&... value) {
  auto state = std::make_shared<OpState<T>>(g, call_kind_name(kind));
  state->succeed(std::forward<A>(value)...);
  return Operation<std::conditional_t<std::is_same_v<T, Unit>, void, T>>(state);
}

OpDeadline transfer_deadline(const Generation& g) {
  return {g.deadlines.transfer_idle(), OpDeadline::From::progress, "no data moved for that long"};
}

// A failed close leaves the sandbox open, so that close can be retried. An abandoned one does
// not: the host gave up on it (the log says so), and a destructor must not wait for it again.
// A close the host does not record (plugin_checks::close_behind_host): the handle stays open.
struct BehindCloseCtx : DoneCtx {
  static constexpr CallKind kKind = CallKind::close;
  BehindCloseCtx() : DoneCtx(kKind) {}
};

struct CloseCtx : DoneCtx {
  static constexpr CallKind kKind = CallKind::close;
  CloseCtx() : DoneCtx(kKind) {}
  void finish(const sbx_error* error) {
    if (error && !state->abandoned()) sandbox->closed.store(false);
    DoneCtx::finish(error);
  }
};

struct StatusCtx : CallCtx, SandboxRef {
  static constexpr CallKind kKind = CallKind::status;
  StatusCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<SandboxStatus>> state;
  static void SBX_ABI on_complete(void* token, int32_t status, const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<StatusCtx> ctx = calls::complete<StatusCtx>(token, "on_complete");
    if (!ctx || calls::late(*ctx)) return;
    in_callback(*ctx->state, [&] {
      if (error) return ctx->state->fail(plugin_error(*ctx->sandbox->generation, error, "status"));
      ctx->state->succeed(to_status(status));
    });
  }
};

// Upload source: a local file or bytes in memory; host-owned until on_complete. The file is
// streamed until its end, and must end exactly at the size announced when the upload started:
// a file that shrinks or grows meanwhile fails the upload, with the reason as its error.
struct UploadCtx : DoneCtx {
  static constexpr CallKind kKind = CallKind::upload;
  UploadCtx() : DoneCtx(kKind) {}
  std::mutex mutex;
  int fd = -1;
  fs::path local_path;
  std::string memory;
  uint64_t offset = 0;
  std::optional<Error> local_error;  // why this side failed the stream
  sbx_input_stream stream{};

  ~UploadCtx() override {
    if (fd >= 0) ::close(fd);
  }
  int64_t fail_stream(Error error) {
    local_error.emplace(std::move(error));
    return -1;
  }
  static int64_t SBX_ABI read_file(void* c, uint8_t* buffer, size_t capacity) {
    auto* ctx = static_cast<UploadCtx*>(c);
    std::lock_guard lock(ctx->mutex);
    if (ctx->local_error || ctx->state->abandoned()) return -1;
    const auto size = static_cast<uint64_t>(ctx->stream.size);
    const size_t want = static_cast<size_t>(std::min<uint64_t>(capacity, size - ctx->offset));
    if (want == 0) return 0;
    ssize_t n;
    do {
      n = ::read(ctx->fd, buffer, want);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
      return ctx->fail_stream(local_io_error("reading " + ctx->local_path.string(), errno));
    if (n == 0) {
      return ctx->fail_stream(FailedPreconditionError(
          ctx->local_path.string() + " changed during the upload: it ended after " +
          std::to_string(ctx->offset) + " of the " + std::to_string(size) +
          " bytes it had when the upload started"));
    }
    ctx->offset += static_cast<uint64_t>(n);
    ctx->state->touch();
    if (ctx->offset == size) {  // the announced end: the file must end here too
      char extra;
      ssize_t m;
      do {
        m = ::read(ctx->fd, &extra, 1);
      } while (m < 0 && errno == EINTR);
      if (m < 0)
        return ctx->fail_stream(local_io_error("reading " + ctx->local_path.string(), errno));
      if (m > 0) {
        return ctx->fail_stream(FailedPreconditionError(
            ctx->local_path.string() + " changed during the upload: it grew past the " +
            std::to_string(size) + " bytes it had when the upload started"));
      }
    }
    return n;
  }
  static int64_t SBX_ABI read_memory(void* c, uint8_t* buffer, size_t capacity) {
    auto* ctx = static_cast<UploadCtx*>(c);
    std::lock_guard lock(ctx->mutex);
    if (ctx->state->abandoned()) return -1;
    const size_t n = std::min<size_t>(capacity, ctx->memory.size() - ctx->offset);
    std::memcpy(buffer, ctx->memory.data() + ctx->offset, n);
    ctx->offset += n;
    ctx->state->touch();
    return static_cast<int64_t>(n);
  }
  // This side's reason comes first: the plugin only saw a stream that failed.
  void finish(const sbx_error* error) {
    std::optional<Error> local;
    {
      std::lock_guard lock(mutex);
      local = local_error;
    }
    if (local) return state->fail(*local);
    DoneCtx::finish(error);
  }
};

// Writes `size` bytes to the FIFO or device `fd` (O_NONBLOCK) without ever raising SIGPIPE: a
// FIFO whose reader went away is EPIPE for this download, not a signal that kills the host
// (SIGPIPE is blocked on this thread around each write, and the one a write raised, unless one
// was pending before, is taken back). While the reader is slow, waits for room, or for `wake`
// (an eventfd) to be signalled: the host abandoned the download. 0, or an errno (ECANCELED when
// woken).
int write_in_place(int fd, int wake, const uint8_t* data, size_t size) {
  sigset_t pipe_only;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  while (size > 0) {
    sigset_t pending;
    sigemptyset(&pending);
    ::sigpending(&pending);
    const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
    sigset_t old;
    ::pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
    const ssize_t n = ::write(fd, data, size);
    const int err = errno;
    if (n < 0 && err == EPIPE && !was_pending) {
      const timespec zero{};
      while (::sigtimedwait(&pipe_only, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return EIO;
    if (err == EINTR) continue;
    if (err != EAGAIN && err != EWOULDBLOCK) return err;
    pollfd fds[2] = {{fd, POLLOUT, 0}, {wake, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return errno;
    if (fds[1].revents != 0) return ECANCELED;
  }
  return 0;
}

// Download sink. A regular file (or a new one) gets a temporary file beside it, renamed over it
// on success; on failure the temporary file and the parent directories the download made are
// removed before the error is reported. A FIFO or a character device (`in_place`) is written
// into directly: no temporary file, no rename, and a failure is reported as such (what was
// written is gone to the reader).
struct DownloadCtx : CallCtx, SandboxRef {
  static constexpr CallKind kKind = CallKind::download;
  DownloadCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<Unit>> state;
  std::mutex mutex;
  int fd = -1;
  bool in_place = false;  // fd is the FIFO or device itself (O_NONBLOCK)
  int wake = -1;          // in_place: an eventfd signalled when the host abandons the download
  fs::path temp_path;
  fs::path target;      // the path the caller gave (absolute), named in messages
  fs::path final_path;  // what the temporary file is renamed to: `target`, or a link's target
  std::vector<fs::path> made_dirs;      // parents this download created, outermost first
  std::shared_ptr<std::string> memory;  // download_bytes: append here instead
  DownloadSink to;                      // download_to_async: hand the bytes on instead
  std::optional<uint64_t> expected;     // the size the plugin announced (ABI 1.3)
  uint64_t written = 0;
  std::optional<Error> local_error;
  bool settled = false;  // committed or discarded: nothing more is written
  sbx_output_stream stream{};

  ~DownloadCtx() override {
    discard();
    if (wake >= 0) ::close(wake);
  }

  // ABI 1.3: the plugin knows the size. Asked only by download_to_async, whose sink may use it.
  static int32_t SBX_ABI expect(void* c, int64_t size) {
    auto* ctx = static_cast<DownloadCtx*>(c);
    std::lock_guard lock(ctx->mutex);
    if (ctx->settled || ctx->local_error) return -1;
    if (size < 0 || ctx->expected || ctx->written > 0) {
      ctx->local_error.emplace(InternalError(
          describe(*ctx->sandbox->generation) +
          " announced a download's size after its first bytes, twice, or as a negative number"));
      return -1;
    }
    ctx->expected = static_cast<uint64_t>(size);
    if (ctx->to.on_size) {
      try {
        ctx->to.on_size(*ctx->expected);
      } catch (...) {
        ctx->local_error.emplace(to_error(std::current_exception()));
        return -1;
      }
    }
    return 0;
  }

  static int32_t SBX_ABI write(void* c, sbx_bytes data) {
    auto* ctx = static_cast<DownloadCtx*>(c);
    std::lock_guard lock(ctx->mutex);
    if (ctx->settled || ctx->local_error) return -1;
    if (!data.data && data.len > 0) return -1;
    ctx->state->touch();
    ctx->written += data.len;
    if (ctx->expected && ctx->written > *ctx->expected) {
      ctx->local_error.emplace(InternalError(
          describe(*ctx->sandbox->generation) + " wrote more of a download than the " +
          std::to_string(*ctx->expected) + " bytes it announced"));
      return -1;
    }
    if (ctx->to.on_data) {
      bool more = false;
      try {
        more =
            ctx->to.on_data(std::string_view(reinterpret_cast<const char*>(data.data), data.len));
      } catch (...) {
        ctx->local_error.emplace(to_error(std::current_exception()));
        return -1;
      }
      if (!more) {
        ctx->local_error.emplace(CancelledError("the download's consumer stopped it"));
        return -1;
      }
      return 0;
    }
    if (ctx->memory) {
      try {
        ctx->memory->append(reinterpret_cast<const char*>(data.data), data.len);
      } catch (...) {  // out of memory: abort the download rather than throw into the plugin
        ctx->local_error.emplace(local_io_error("keeping the download in memory", ENOMEM));
        return -1;
      }
      return 0;
    }
    if (ctx->in_place) {
      if (const int err = write_in_place(ctx->fd, ctx->wake, data.data, data.len)) {
        ctx->local_error.emplace(local_io_error("writing " + ctx->target.string(), err));
        return -1;
      }
      return 0;
    }
    const auto* p = data.data;
    size_t left = data.len;
    while (left > 0) {
      const ssize_t n = ::write(ctx->fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ctx->local_error.emplace(
            local_io_error("writing " + ctx->target.string(), n < 0 ? errno : EIO));
        return -1;
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return 0;
  }

  // Settles the file system before the caller can see the outcome: a partial file is never on
  // disk once the operation is complete.
  void finish(const sbx_error* error) {
    std::optional<Error> failure;
    {
      std::lock_guard lock(mutex);
      if (local_error) {
        failure = local_error;
      } else if (error) {
        failure = plugin_error(*sandbox->generation, error, "download");
      } else if (expected && written != *expected) {
        failure = InternalError(describe(*sandbox->generation) + " ended a download after " +
                                std::to_string(written) + " of the " + std::to_string(*expected) +
                                " bytes it announced");
      } else {
        failure = commit();
      }
      discard_locked();
    }
    if (failure) return state->fail(*failure);
    state->succeed();
  }

  // The host gave up: nothing more is written, and nothing is left behind.
  // A write waiting for a slow reader holds the mutex: it is woken first.
  void on_abandoned() override {
    if (wake >= 0) ::eventfd_write(wake, 1);
    discard();
  }

  // Moves the finished temporary file over the target (closes the FIFO or device written in
  // place); the error, if that fails.
  std::optional<Error> commit() {
    if (fd < 0) return std::nullopt;  // download_bytes: nothing on disk
    const int f = std::exchange(fd, -1);
    if (in_place) {
      if (::close(f) != 0) return local_io_error("writing " + target.string(), errno);
      return std::nullopt;
    }
    if (::fsync(f) != 0) {
      const int err = errno;
      ::close(f);
      return local_io_error("writing " + target.string(), err);
    }
    if (::close(f) != 0) return local_io_error("writing " + target.string(), errno);
    if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
      return local_io_error("renaming the download to " + target.string(), errno);
    }
    temp_path.clear();
    made_dirs.clear();  // they hold the file now
    return std::nullopt;
  }
  // Closes and removes the temporary file unless it was committed, then the directories made for
  // it (only those still empty).
  void discard_locked() {
    settled = true;
    if (fd >= 0) ::close(std::exchange(fd, -1));
    if (!temp_path.empty()) ::unlink(temp_path.c_str());
    temp_path.clear();
    for (auto it = made_dirs.rbegin(); it != made_dirs.rend(); ++it)
      ::rmdir(it->c_str());
    made_dirs.clear();
  }
  void discard() {
    std::lock_guard lock(mutex);
    discard_locked();
  }
};

struct SerializeCtx : CallCtx, SandboxRef {
  static constexpr CallKind kKind = CallKind::serialize;
  SerializeCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<std::string>> state;
  static void SBX_ABI on_complete(void* token, sbx_str descriptor, const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<SerializeCtx> ctx = calls::complete<SerializeCtx>(token, "on_complete");
    if (!ctx || calls::late(*ctx)) return;
    const Generation& g = *ctx->sandbox->generation;
    in_callback(*ctx->state, [&] {
      if (error || !descriptor.data) return ctx->state->fail(plugin_error(g, error, "serialize"));
      std::string text = copy_of(descriptor);
      if (!base::utf8::valid(text)) {
        return ctx->state->fail(
            InternalError(describe(g) + " made a descriptor that is not valid UTF-8"));
      }
      ctx->state->succeed(std::move(text));
    });
  }
};

struct RenewCtx : CallCtx, SandboxRef {
  static constexpr CallKind kKind = CallKind::renew;
  RenewCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<std::chrono::system_clock::time_point>> state;
  static void SBX_ABI on_complete(void* token, int64_t expires_at_unix_ms, const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<RenewCtx> ctx = calls::complete<RenewCtx>(token, "on_complete");
    if (!ctx || calls::late(*ctx)) return;
    in_callback(*ctx->state, [&] {
      if (error) return ctx->state->fail(plugin_error(*ctx->sandbox->generation, error, "renew"));
      ctx->state->succeed(
          std::chrono::system_clock::time_point(std::chrono::milliseconds(expires_at_unix_ms)));
    });
  }
};

struct EndpointCtx : CallCtx, SandboxRef {
  static constexpr CallKind kKind = CallKind::endpoint;
  EndpointCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<Endpoint>> state;
  static void SBX_ABI on_complete(void* token, const sbx_endpoint* endpoint,
                                  const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<EndpointCtx> ctx = calls::complete<EndpointCtx>(token, "on_complete");
    if (!ctx || calls::late(*ctx)) return;
    const Generation& g = *ctx->sandbox->generation;
    in_callback(*ctx->state, [&] {
      if (!endpoint) return ctx->state->fail(plugin_error(g, error, "endpoint"));
      if (!SBX_HAS_FIELD(endpoint, sbx_endpoint, headers)) {
        return ctx->state->fail(InternalError(describe(g) + " returned an sbx_endpoint of " +
                                              std::to_string(endpoint->struct_size) +
                                              " bytes, smaller than ABI 1.0 defines"));
      }
      ctx->state->succeed(
          Endpoint{base::utf8::sanitize(copy_of(endpoint->url)), copy_of(endpoint->headers)});
    });
  }
};

// A local file the caller named that cannot be used: their argument, with the errno kept.
[[noreturn]] void refuse_local_file(const std::string& what, int error_number) {
  InvalidArgumentError error(what + ": " + std::strerror(error_number));
  error.set_local_errno(error_number);
  throw error;
}

// A download target that cannot be written: `dest` named, with what it is.
[[noreturn]] void refuse_download_target(const fs::path& dest, const std::string& why,
                                         int error_number) {
  InvalidArgumentError error("cannot download to " + dest.string() + ": " + why);
  error.set_local_errno(error_number);
  throw error;
}

// Where a download to `dest` goes, as cp would write it.
struct DownloadTarget {
  enum class Kind { new_file, regular, in_place };
  Kind kind = Kind::new_file;
  fs::path path;          // `dest`, or the file a symbolic link at `dest` leads to
  bool via_link = false;  // `dest` is a symbolic link
  int fd = -1;            // in_place: the FIFO or device, open for writing (O_NONBLOCK)
  int wake = -1;          // in_place: the eventfd that wakes a waiting write
};

// Looks at `dest` before anything is fetched: a symbolic link is followed (to its end); a regular
// file or a missing one is a file to replace (a missing link target's directory must exist); a
// FIFO or a character device is opened for writing (a FIFO without a reader waits for one, as
// cp does); a directory, a socket or a block device is refused.
DownloadTarget examine_download_target(const fs::path& dest) {
  DownloadTarget t;
  t.path = dest;
  struct stat st {};
  for (int hops = 0;; ++hops) {
    if (::lstat(t.path.c_str(), &st) != 0) {
      const int err = errno;
      if (err != ENOENT) refuse_local_file("cannot download to " + dest.string(), err);
      if (t.via_link) {
        struct stat dir {};
        if (::stat(t.path.parent_path().c_str(), &dir) != 0 || !S_ISDIR(dir.st_mode)) {
          refuse_download_target(
              dest,
              "it is a symbolic link to " + t.path.string() + ", whose directory does not exist",
              ENOENT);
        }
      }
      return t;  // a new file
    }
    if (!S_ISLNK(st.st_mode)) break;
    if (hops == 40) refuse_local_file("cannot download to " + dest.string(), ELOOP);
    std::error_code ec;
    const fs::path link = fs::read_symlink(t.path, ec);
    if (ec) refuse_local_file("cannot download to " + dest.string(), ec.value());
    t.path = link.is_absolute() ? link : t.path.parent_path() / link;
    t.via_link = true;
  }
  if (S_ISREG(st.st_mode)) {
    t.kind = DownloadTarget::Kind::regular;
    return t;
  }
  const char* what = S_ISDIR(st.st_mode)                           ? "it is a directory"
                     : S_ISSOCK(st.st_mode)                        ? "it is a socket"
                     : S_ISBLK(st.st_mode)                         ? "it is a block device"
                     : S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) ? nullptr
                                                                   : "it is not a file";
  if (what) {
    refuse_download_target(
        dest,
        std::string(what) + "; a download writes a regular file, a FIFO or a character device",
        S_ISDIR(st.st_mode) ? EISDIR : EINVAL);
  }
  // Without O_NONBLOCK, a FIFO's open waits for a reader; with it, a FIFO without one is ENXIO.
  // Tried without waiting first, so that a reader already there costs no blocking call.
  t.kind = DownloadTarget::Kind::in_place;
  const int flags = O_WRONLY | O_CLOEXEC | O_NOCTTY;
  t.fd = ::open(t.path.c_str(), flags | O_NONBLOCK);
  if (t.fd < 0 && errno == ENXIO && S_ISFIFO(st.st_mode)) {
    do {
      t.fd = ::open(t.path.c_str(), flags);
    } while (t.fd < 0 && errno == EINTR);
  }
  if (t.fd < 0) refuse_local_file("cannot open " + dest.string() + " for the download", errno);
  struct stat opened {};
  if (::fstat(t.fd, &opened) != 0 || !(S_ISFIFO(opened.st_mode) || S_ISCHR(opened.st_mode))) {
    ::close(t.fd);
    refuse_download_target(dest, "it changed while it was opened", EINVAL);
  }
  // Writes stay non-blocking: write_in_place waits for room itself, and can be woken.
  const int now = ::fcntl(t.fd, F_GETFL);
  if (now < 0 || ::fcntl(t.fd, F_SETFL, now | O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(t.fd);
    refuse_local_file("cannot open " + dest.string() + " for the download", err);
  }
  t.wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (t.wake < 0) {
    const int err = errno;
    ::close(t.fd);
    throw_error(local_io_error("cannot download to " + dest.string(), err));
  }
  return t;
}

// Creates every missing directory above `file`, outermost first; returns those it made.
std::vector<fs::path> make_parents(const fs::path& file) {
  std::vector<fs::path> missing;
  for (fs::path dir = file.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) break;
    missing.push_back(dir);
    if (dir == dir.parent_path()) break;
  }
  std::vector<fs::path> made;
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0777) != 0 && errno != EEXIST) {
      const int err = errno;
      for (auto m = made.rbegin(); m != made.rend(); ++m)
        ::rmdir(m->c_str());
      throw_error(local_io_error("cannot create " + it->string(), err));
    }
    made.push_back(*it);
  }
  return made;
}

}  // namespace
}  // namespace detail

using detail::call_deadline;
using detail::extension;
using detail::require_open;
using detail::start_operation;
using detail::started;

Sandbox::Sandbox(std::shared_ptr<detail::SandboxState> state) : state_(std::move(state)) {}

Sandbox& Sandbox::operator=(Sandbox&& other) noexcept {
  if (this != &other) {
    Sandbox old(std::move(*this));  // closes what this held
    state_ = std::move(other.state_);
  }
  return *this;
}

Sandbox::~Sandbox() {
  if (!state_ || state_->closed.load() || state_->moved.load()) return;
  if (detail::CallbackScope::active()) {
    // On a plugin thread: waiting here could starve the plugin; close without waiting.
    close_async().then([id = state_->id](Operation<void>& op) {
      try {
        op.get();
      } catch (const std::exception& e) {
        detail::logger()->warn("closing sandbox {} failed: {}", id, e.what());
      }
    });
    return;
  }
  try {
    close();  // bounded by the host's deadline for close
  } catch (const std::exception& e) {
    detail::logger()->warn("closing sandbox {} failed: {}", state_->id, e.what());
  }
}

const std::string& Sandbox::id() const {
  return started(state_).id;
}
const std::string& Sandbox::provider_name() const {
  return started(state_).generation->name;
}
bool Sandbox::closed() const {
  return started(state_).closed.load();
}
bool Sandbox::supports(std::string_view extension_id) const {
  const std::string id(extension_id);
  return started(state_).generation->extension(id.c_str()) != nullptr;
}

Operation<ExecResult> Sandbox::exec_async(std::string command, ExecOptions options) {
  return exec_request_async(std::move(command), {}, std::move(options));
}

Operation<ExecResult> Sandbox::exec_argv_async(std::vector<std::string> argv, ExecOptions options) {
  if (argv.empty() || argv.front().empty()) {
    throw InvalidArgumentError("an argv exec needs a program: argv[0] is missing or empty");
  }
  for (const auto& word : argv)
    detail::require_utf8(word, "an argv word");
  std::string command = base::shell_join(argv);
  return exec_request_async(std::move(command), std::move(argv), std::move(options));
}

ExecResult Sandbox::exec_argv(std::vector<std::string> argv, ExecOptions options) {
  return exec_argv_async(std::move(argv), std::move(options)).get();
}

Operation<ExecResult> Sandbox::exec_request_async(std::string command,
                                                  std::vector<std::string> argv,
                                                  ExecOptions options) {
  require_open(state_);
  options.validate();
  detail::require_utf8(command, "the command");
  const auto& g = state_->generation;
  auto ctx = std::make_shared<detail::ExecCtx>();
  ctx->sandbox = state_;
  ctx->on_output = std::move(options.on_output);
  const bool streamed = static_cast<bool>(ctx->on_output);
  if (!options.cwd) options.cwd = state_->workdir;
  const detail::KvList env(options.env);
  std::vector<sbx_str> words;
  for (const auto& word : argv)
    words.push_back(detail::view_of(word));
  const sbx_exec_request request{sizeof(sbx_exec_request),
                                 detail::view_of(command),
                                 detail::optional_view(options.cwd),
                                 env.list(),
                                 detail::to_abi_ms(options.timeout_s),
                                 detail::optional_view(options.user),
                                 {words.data(), words.size()}};
  detail::OpDeadline deadline{g->deadlines.exec(), detail::OpDeadline::From::start,
                              "the host's limit for an exec without a timeout"};
  if (options.timeout_s) {
    deadline.after = Deadlines::ms(*options.timeout_s) + g->deadlines.grace();
    deadline.why = "its timeout plus the host's grace of " +
                   std::to_string(g->deadlines.grace().count() / 1000) + " s";
  }
  return start_operation<ExecResult>(g, std::move(ctx), deadline, [&](void* token) {
    const sbx_exec_callbacks callbacks{sizeof(sbx_exec_callbacks), token,
                                       streamed ? &detail::ExecCtx::output : nullptr,
                                       &detail::ExecCtx::on_complete};
    return g->provider->exec(g->provider, state_->handle, &request, &callbacks);
  });
}

ExecResult Sandbox::exec(std::string_view command, ExecOptions options) {
  return exec_async(std::string(command), std::move(options)).get();
}

namespace {

// `mode`: the permission bits the file gets (0: the ABI's default, 0644).
Operation<void> start_upload(const std::shared_ptr<detail::SandboxState>& s,
                             std::shared_ptr<detail::UploadCtx> ctx, const std::string& remote,
                             uint32_t mode) {
  detail::require_utf8(remote, "the sandbox path");
  const auto& g = s->generation;
  ctx->sandbox = s;
  ctx->stream.struct_size = sizeof(sbx_input_stream);
  ctx->stream.ctx = ctx.get();
  const sbx_upload_request request{sizeof(sbx_upload_request), detail::view_of(remote),
                                   &ctx->stream, mode};
  return start_operation<detail::Unit>(
      g, std::move(ctx), detail::transfer_deadline(*g), [&](void* token) {
        const sbx_done_callbacks callbacks{sizeof(sbx_done_callbacks), token,
                                           &detail::done_thunk<detail::UploadCtx>};
        return g->provider->upload(g->provider, s->handle, &request, &callbacks);
      });
}

}  // namespace

Operation<void> Sandbox::upload_async(std::filesystem::path local_path, std::string remote_path) {
  require_open(state_);
  auto ctx = std::make_shared<detail::UploadCtx>();
  ctx->local_path = local_path;
  ctx->fd = ::open(local_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ctx->fd < 0) {
    detail::refuse_local_file("cannot open " + local_path.string() + " for upload", errno);
  }
  struct stat st {};
  if (::fstat(ctx->fd, &st) != 0) {
    detail::refuse_local_file("cannot upload " + local_path.string(), errno);
  }
  if (!S_ISREG(st.st_mode)) {
    throw InvalidArgumentError("cannot upload " + local_path.string() + ": not a regular file");
  }
  const auto mode = static_cast<uint32_t>(st.st_mode & 0777);
  if (st.st_size > 0) {
    ctx->stream.size = st.st_size;
    ctx->stream.read = &detail::UploadCtx::read_file;
    return start_upload(state_, std::move(ctx), remote_path, mode);
  }
  // Size 0: empty, or a pseudo-file whose size is only known once it is read.
  char buffer[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(ctx->fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_error(local_io_error("reading " + local_path.string(), errno));
    if (n == 0) break;
    if (ctx->memory.size() + static_cast<size_t>(n) > detail::kPseudoFileLimit) {
      throw InvalidArgumentError("cannot upload " + local_path.string() +
                                 ": it reports no size and holds more than 64 MiB; copy it to "
                                 "a regular file first");
    }
    ctx->memory.append(buffer, static_cast<size_t>(n));
  }
  ctx->stream.size = static_cast<int64_t>(ctx->memory.size());
  ctx->stream.read = &detail::UploadCtx::read_memory;
  return start_upload(state_, std::move(ctx), remote_path, mode);
}

void Sandbox::upload(const std::filesystem::path& local_path, std::string_view remote_path) {
  upload_async(local_path, std::string(remote_path)).get();
}

Operation<void> Sandbox::upload_bytes_async(std::string contents, std::string remote_path) {
  require_open(state_);
  auto ctx = std::make_shared<detail::UploadCtx>();
  ctx->memory = std::move(contents);
  ctx->stream.size = static_cast<int64_t>(ctx->memory.size());
  ctx->stream.read = &detail::UploadCtx::read_memory;
  return start_upload(state_, std::move(ctx), remote_path, 0);
}

void Sandbox::upload_bytes(std::string_view contents, std::string_view remote_path) {
  upload_bytes_async(std::string(contents), std::string(remote_path)).get();
}

namespace {

Operation<void> start_download(const std::shared_ptr<detail::SandboxState>& s,
                               std::shared_ptr<detail::DownloadCtx> ctx,
                               const std::string& remote) {
  const auto& g = s->generation;
  ctx->sandbox = s;
  ctx->stream = {sizeof(sbx_output_stream), ctx.get(), &detail::DownloadCtx::write,
                 ctx->to.on_data ? &detail::DownloadCtx::expect : nullptr};
  const sbx_download_request request{sizeof(sbx_download_request), detail::view_of(remote),
                                     &ctx->stream};
  return start_operation<detail::Unit>(
      g, std::move(ctx), detail::transfer_deadline(*g), [&](void* token) {
        const sbx_done_callbacks callbacks{sizeof(sbx_done_callbacks), token,
                                           &detail::done_thunk<detail::DownloadCtx>};
        return g->provider->download(g->provider, s->handle, &request, &callbacks);
      });
}

}  // namespace

Operation<void> Sandbox::download_async(std::string remote_path, std::filesystem::path local_path) {
  require_open(state_);
  detail::require_utf8(remote_path, "the sandbox path");
  auto ctx = std::make_shared<detail::DownloadCtx>();
  ctx->target = std::filesystem::absolute(local_path);
  detail::DownloadTarget where = detail::examine_download_target(ctx->target);
  ctx->final_path = where.path;
  if (where.kind == detail::DownloadTarget::Kind::in_place) {
    ctx->fd = where.fd;
    ctx->wake = where.wake;
    ctx->in_place = true;
    return start_download(state_, std::move(ctx), remote_path);
  }
  if (!where.via_link) ctx->made_dirs = detail::make_parents(ctx->final_path);
  std::string temp = ctx->final_path.string() + ".sbx-partial-XXXXXX";
  ctx->fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (ctx->fd < 0) {
    const int err = errno;
    ctx->discard();
    throw_error(local_io_error("cannot write next to " + ctx->target.string(), err));
  }
  ctx->temp_path = temp;
  if (::fchmod(ctx->fd, detail::new_file_mode()) != 0) {  // mkostemp made it 0600
    const int err = errno;
    ctx->discard();
    throw_error(local_io_error("cannot set the mode of " + temp, err));
  }
  return start_download(state_, std::move(ctx), remote_path);
}

void Sandbox::download(std::string_view remote_path, const std::filesystem::path& local_path) {
  download_async(std::string(remote_path), local_path).get();
}

std::string Sandbox::download_bytes(std::string_view remote_path) {
  require_open(state_);
  detail::require_utf8(remote_path, "the sandbox path");
  // Shared with the context: a plugin that writes after the host abandoned the download writes
  // into a buffer that still exists (and that nobody reads).
  auto contents = std::make_shared<std::string>();
  auto ctx = std::make_shared<detail::DownloadCtx>();
  ctx->memory = contents;
  start_download(state_, std::move(ctx), std::string(remote_path)).get();
  return std::move(*contents);
}

Operation<void> Sandbox::download_to_async(std::string remote_path, DownloadSink sink) {
  require_open(state_);
  detail::require_utf8(remote_path, "the sandbox path");
  if (!sink.on_data) throw InvalidArgumentError("download_to_async needs a sink with on_data");
  auto ctx = std::make_shared<detail::DownloadCtx>();
  ctx->to = std::move(sink);
  return start_download(state_, std::move(ctx), remote_path);
}

Operation<SandboxStatus> Sandbox::status_async() {
  if (!state_) {  // as NeMo Gym's facade: no handle, no status to ask for
    auto state = std::make_shared<detail::OpState<SandboxStatus>>(nullptr, "status");
    state->succeed(SandboxStatus::unknown);
    return Operation<SandboxStatus>(state);
  }
  const auto& g = state_->generation;
  if (state_->closed.load()) {
    return detail::completed<SandboxStatus>(g, detail::CallKind::status, SandboxStatus::stopped);
  }
  auto ctx = std::make_shared<detail::StatusCtx>();
  ctx->sandbox = state_;
  return start_operation<SandboxStatus>(g, std::move(ctx), call_deadline(*g), [&](void* token) {
    const sbx_status_callbacks callbacks{sizeof(sbx_status_callbacks), token,
                                         &detail::StatusCtx::on_complete};
    return g->provider->status(g->provider, state_->handle, &callbacks);
  });
}

SandboxStatus Sandbox::status() {
  return status_async().get();
}

Operation<Endpoint> Sandbox::endpoint_async(int64_t port) {
  started(state_);
  // The seed's order: port range, then declaration, then capability.
  if (port < 1 || port > 65535) {
    throw InvalidArgumentError("Sandbox endpoint port must be between 1 and 65535, got " +
                               std::to_string(port));
  }
  if (std::find(state_->ports.begin(), state_->ports.end(), port) == state_->ports.end()) {
    std::string declared;
    for (int64_t p : state_->ports)
      declared += (declared.empty() ? "" : ", ") + std::to_string(p);
    throw InvalidArgumentError("Sandbox port " + std::to_string(port) +
                               " was not declared in SandboxSpec.ports; declared ports: [" +
                               declared + "]");
  }
  const auto& g = state_->generation;
  const auto* ext = static_cast<const sbx_provider_endpoint*>(g->extension(SBX_EXT_ENDPOINT));
  if (!ext || !SBX_HAS_FIELD(ext, sbx_provider_endpoint, get) || !ext->get) {
    throw UnimplementedError("provider '" + g->name + "' does not support service endpoints");
  }
  require_open(state_);
  auto ctx = std::make_shared<detail::EndpointCtx>();
  ctx->sandbox = state_;
  return start_operation<Endpoint>(g, std::move(ctx), call_deadline(*g), [&](void* token) {
    const sbx_endpoint_callbacks callbacks{sizeof(sbx_endpoint_callbacks), token,
                                           &detail::EndpointCtx::on_complete};
    return ext->get(g->provider, state_->handle, static_cast<uint16_t>(port), &callbacks);
  });
}
Endpoint Sandbox::endpoint(int64_t port) {
  return endpoint_async(port).get();
}

Operation<void> Sandbox::close_async() {
  if (!state_) {  // nothing to close
    auto state = std::make_shared<detail::OpState<detail::Unit>>(nullptr, "close");
    state->succeed();
    return Operation<void>(state);
  }
  const auto& g = state_->generation;
  if (state_->closed.exchange(true))
    return detail::completed<detail::Unit>(g, detail::CallKind::close);
  auto ctx = std::make_shared<detail::CloseCtx>();
  ctx->sandbox = state_;
  return start_operation<detail::Unit>(g, std::move(ctx), call_deadline(*g), [&](void* token) {
    const sbx_done_callbacks callbacks{sizeof(sbx_done_callbacks), token,
                                       &detail::done_thunk<detail::CloseCtx>};
    return g->provider->close(g->provider, state_->handle, &callbacks);
  });
}

void Sandbox::close() {
  if (state_) close_async().get();
}

void plugin_checks::close_behind_host(Sandbox& box) {
  const auto& s = box.state_;
  require_open(s);
  const auto& g = s->generation;
  auto ctx = std::make_shared<detail::BehindCloseCtx>();
  ctx->sandbox = s;
  start_operation<detail::Unit>(g, std::move(ctx), call_deadline(*g), [&](void* token) {
    const sbx_done_callbacks callbacks{sizeof(sbx_done_callbacks), token,
                                       &detail::done_thunk<detail::BehindCloseCtx>};
    return g->provider->close(g->provider, s->handle, &callbacks);
  }).get();
}

struct plugin_checks::FailingUpload::Source {
  std::mutex mutex;
  std::condition_variable changed;
  int64_t given = 0;  // bytes to give before the read that fails
  bool hold = false;
  bool holding = false;   // a read waits in hold
  bool released = false;  // release() or the destructor: the held read fails now
  bool ended = false;     // the upload completed
};

namespace detail {
namespace {

// An UploadCtx whose stream reads from a FailingUpload::Source.
struct FailingUploadCtx : UploadCtx {
  std::shared_ptr<plugin_checks::FailingUpload::Source> source;

  static int64_t SBX_ABI read(void* c, uint8_t* buffer, size_t capacity) {
    auto* ctx = static_cast<FailingUploadCtx*>(static_cast<UploadCtx*>(c));
    auto& src = *ctx->source;
    std::unique_lock lock(src.mutex);
    if (ctx->offset < static_cast<uint64_t>(src.given)) {
      const size_t n = std::min<size_t>(capacity, static_cast<size_t>(src.given) - ctx->offset);
      std::memset(buffer, 'x', n);
      ctx->offset += n;
      return static_cast<int64_t>(n);
    }
    if (src.hold) {
      src.holding = true;
      src.changed.notify_all();
      src.changed.wait_for(lock, std::chrono::seconds(30), [&] { return src.released; });
    }
    return -1;
  }
};

}  // namespace
}  // namespace detail

plugin_checks::FailingUpload::FailingUpload(Sandbox& box, std::string remote_path, int64_t size,
                                            int64_t given, bool hold)
    : source_(std::make_shared<Source>()) {
  if (size <= 0 || given < 0 || given >= size) {
    throw InvalidArgumentError("FailingUpload: 0 <= given < size");
  }
  source_->given = given;
  source_->hold = hold;
  require_open(box.state_);
  auto ctx = std::make_shared<detail::FailingUploadCtx>();
  ctx->source = source_;
  ctx->stream.size = size;
  ctx->stream.read = &detail::FailingUploadCtx::read;
  op_ = start_upload(box.state_, std::move(ctx), remote_path, 0);
  op_.then([source = source_](const Operation<void>&) {
    {
      std::lock_guard lock(source->mutex);
      source->ended = true;
    }
    source->changed.notify_all();
  });
}

plugin_checks::FailingUpload::~FailingUpload() {
  release();
}

bool plugin_checks::FailingUpload::held(std::chrono::milliseconds limit) {
  std::unique_lock lock(source_->mutex);
  source_->changed.wait_for(lock, limit, [&] { return source_->holding || source_->ended; });
  return source_->holding;
}

void plugin_checks::FailingUpload::release() {
  {
    std::lock_guard lock(source_->mutex);
    source_->released = true;
  }
  source_->changed.notify_all();
}

namespace {

template <detail::CallKind K>
Operation<void> pause_or_resume(const std::shared_ptr<detail::SandboxState>& s) {
  require_open(s);
  const auto& g = s->generation;
  const auto& ext = extension<sbx_provider_pause>(
      *g, SBX_EXT_PAUSE, SBX_FIELD_END(sbx_provider_pause, resume), "pausing sandboxes");
  using Ctx = detail::PlainDoneCtx<K>;
  auto ctx = std::make_shared<Ctx>();
  ctx->sandbox = s;
  return start_operation<detail::Unit>(g, std::move(ctx), call_deadline(*g), [&](void* token) {
    const sbx_done_callbacks callbacks{sizeof(sbx_done_callbacks), token, &detail::done_thunk<Ctx>};
    return (K == detail::CallKind::pause ? ext.pause : ext.resume)(g->provider, s->handle,
                                                                   &callbacks);
  });
}

}  // namespace

Operation<void> Sandbox::pause_async() {
  return pause_or_resume<detail::CallKind::pause>(state_);
}
void Sandbox::pause() {
  pause_async().get();
}
Operation<void> Sandbox::resume_async() {
  return pause_or_resume<detail::CallKind::resume>(state_);
}
void Sandbox::resume() {
  resume_async().get();
}

Operation<std::string> Sandbox::serialize_async() {
  require_open(state_);
  const auto& g = state_->generation;
  const auto& ext = extension<sbx_provider_connect>(
      *g, SBX_EXT_CONNECT, SBX_FIELD_END(sbx_provider_connect, connect), "serialize()/connect()");
  auto ctx = std::make_shared<detail::SerializeCtx>();
  ctx->sandbox = state_;
  return start_operation<std::string>(g, std::move(ctx), call_deadline(*g), [&](void* token) {
    const sbx_descriptor_callbacks callbacks{sizeof(sbx_descriptor_callbacks), token,
                                             &detail::SerializeCtx::on_complete};
    return ext.serialize(g->provider, state_->handle, &callbacks);
  });
}
std::string Sandbox::serialize() {
  return serialize_async().get();
}

Operation<std::chrono::system_clock::time_point> Sandbox::renew_async(
    std::chrono::system_clock::time_point expires_at) {
  require_open(state_);
  const auto& g = state_->generation;
  const auto& ext = extension<sbx_provider_renew>(
      *g, SBX_EXT_RENEW, SBX_FIELD_END(sbx_provider_renew, renew), "renewing sandboxes");
  const int64_t unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(expires_at.time_since_epoch()).count();
  auto ctx = std::make_shared<detail::RenewCtx>();
  ctx->sandbox = state_;
  return start_operation<std::chrono::system_clock::time_point>(
      g, std::move(ctx), call_deadline(*g), [&](void* token) {
        const sbx_renew_callbacks callbacks{sizeof(sbx_renew_callbacks), token,
                                            &detail::RenewCtx::on_complete};
        return ext.renew(g->provider, state_->handle, unix_ms, &callbacks);
      });
}
std::chrono::system_clock::time_point Sandbox::renew(double ttl_s) {
  if (!(ttl_s > 0) || !std::isfinite(ttl_s)) {
    throw InvalidArgumentError("Sandbox ttl_s must be > 0, got " + std::to_string(ttl_s));
  }
  return renew_async(std::chrono::system_clock::now() + Deadlines::ms(ttl_s)).get();
}

void Sandbox::detach() {
  state_.reset();
}

}  // namespace sbx
