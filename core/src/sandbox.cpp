// sbx::Sandbox: exec, file transfer, status, endpoint and close through the provider ABI.

#include "abi_glue.hpp"

#include <sbx/abi/ext/endpoint.h>
#include <sbx/core/sandbox.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

namespace sbx {
namespace detail {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

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
auto completed(const std::shared_ptr<Generation>& g, A&&... value) {
  auto state = std::make_shared<OpState<T>>(g);
  state->succeed(std::forward<A>(value)...);
  return Operation<std::conditional_t<std::is_same_v<T, Unit>, void, T>>(state);
}

// Every operation on a sandbox keeps its state (and so the plugin's handle) alive until it
// completes: a handle is released only when no operation on it is pending.
struct SandboxRef {
  std::shared_ptr<SandboxState> sandbox;
};

// Operations without a value (upload, download, close) complete through one thunk; each context
// says in finish() what success and failure mean for it.
template <class Ctx>
void SBX_ABI done_thunk(void* user_data, const sbx_error* error) {
  CallbackScope scope;
  std::unique_ptr<Ctx> ctx(static_cast<Ctx*>(user_data));
  in_callback(*ctx->state, [&] { ctx->finish(error); });
}

struct DoneCtx : SandboxRef {
  std::shared_ptr<OpState<Unit>> state;
  void finish(const sbx_error* error) {
    if (error) return state->fail(*error);
    state->succeed();
  }
};

// A failed close leaves the sandbox open, so that close can be retried.
struct CloseCtx : DoneCtx {
  void finish(const sbx_error* error) {
    if (error) sandbox->closed.store(false);
    DoneCtx::finish(error);
  }
};

struct ExecCtx : SandboxRef {
  std::shared_ptr<OpState<ExecResult>> state;
  std::function<void(OutputStream, std::string_view)> on_output;

  // A caller's callback that throws ends the exec with that error: the command is cancelled and
  // the callback sees no further output (the caller may have returned from exec() already).
  static void SBX_ABI output(void* user_data, int32_t stream, sbx_bytes chunk) {
    CallbackScope scope;
    auto* ctx = static_cast<ExecCtx*>(user_data);
    if (ctx->state->ready()) return;
    try {
      ctx->on_output(stream == SBX_STREAM_STDERR ? OutputStream::err : OutputStream::out,
                     std::string_view(reinterpret_cast<const char*>(chunk.data), chunk.len));
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      ctx->state->cancel();  // before fail(): a completed state ignores cancel
      ctx->state->fail(error);
    }
  }
  static void SBX_ABI on_complete(void* user_data, const sbx_exec_result* result,
                                  const sbx_error* error) {
    CallbackScope scope;
    std::unique_ptr<ExecCtx> ctx(static_cast<ExecCtx*>(user_data));
    in_callback(*ctx->state, [&] {
      if (!result) {
        return ctx->state->fail(error ? to_error(*error) : InternalError("exec failed"));
      }
      ExecResult r;
      r.stdout_text.assign(reinterpret_cast<const char*>(result->stdout_bytes.data),
                           result->stdout_bytes.len);
      r.stderr_text.assign(reinterpret_cast<const char*>(result->stderr_bytes.data),
                           result->stderr_bytes.len);
      r.return_code = result->return_code;
      if (result->error_type.data) r.error_type = copy_of(result->error_type);
      ctx->state->succeed(std::move(r));
    });
  }
};

struct StatusCtx : SandboxRef {
  std::shared_ptr<OpState<SandboxStatus>> state;
  static void SBX_ABI on_complete(void* user_data, int32_t status, const sbx_error* error) {
    CallbackScope scope;
    std::unique_ptr<StatusCtx> ctx(static_cast<StatusCtx*>(user_data));
    in_callback(*ctx->state, [&] {
      if (error) return ctx->state->fail(*error);
      ctx->state->succeed(to_status(status));
    });
  }
};

// Upload source: a local file or bytes in memory; host-owned until on_complete.
struct UploadCtx : DoneCtx {
  int fd = -1;
  std::string memory;
  size_t offset = 0;
  sbx_input_stream stream{};

  ~UploadCtx() {
    if (fd >= 0) ::close(fd);
  }
  static int64_t SBX_ABI read_file(void* c, uint8_t* buffer, size_t capacity) {
    auto* ctx = static_cast<UploadCtx*>(c);
    for (;;) {
      const ssize_t n = ::read(ctx->fd, buffer, capacity);
      if (n >= 0) return n;
      if (errno != EINTR) return -1;
    }
  }
  static int64_t SBX_ABI read_memory(void* c, uint8_t* buffer, size_t capacity) {
    auto* ctx = static_cast<UploadCtx*>(c);
    const size_t n = std::min(capacity, ctx->memory.size() - ctx->offset);
    std::memcpy(buffer, ctx->memory.data() + ctx->offset, n);
    ctx->offset += n;
    return static_cast<int64_t>(n);
  }
};

// Download sink: a temporary file renamed over the target on success, removed otherwise.
struct DownloadCtx : SandboxRef {
  std::shared_ptr<OpState<Unit>> state;
  int fd = -1;
  std::filesystem::path temp_path;
  std::filesystem::path target;
  std::string* memory = nullptr;  // download_bytes: append here instead
  sbx_output_stream stream{};

  ~DownloadCtx() { discard(); }
  static int32_t SBX_ABI write(void* c, sbx_bytes data) {
    auto* ctx = static_cast<DownloadCtx*>(c);
    if (ctx->memory) {
      try {
        ctx->memory->append(reinterpret_cast<const char*>(data.data), data.len);
      } catch (...) {  // out of memory: abort the download rather than throw into the plugin
        return -1;
      }
      return 0;
    }
    const auto* p = data.data;
    size_t left = data.len;
    while (left > 0) {
      const ssize_t n = ::write(ctx->fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return -1;
      p += n;
      left -= static_cast<size_t>(n);
    }
    return 0;
  }
  // Settles the file system before the caller can see the outcome: a partial file is never on
  // disk once the operation is complete.
  void finish(const sbx_error* error) {
    std::optional<Error> failure = error ? std::optional<Error>(to_error(*error)) : commit();
    discard();
    if (failure) return state->fail(*failure);
    state->succeed();
  }

  // Moves the finished temporary file over the target; the error, if that fails.
  std::optional<Error> commit() {
    if (fd < 0) return std::nullopt;  // download_bytes: nothing on disk
    const int f = std::exchange(fd, -1);
    const bool written = ::fsync(f) == 0;
    const int write_errno = errno;
    if (::close(f) != 0 || !written) {
      return InternalError("writing " + target.string() + " failed: " + errno_text(write_errno));
    }
    if (::rename(temp_path.c_str(), target.c_str()) != 0) {
      return InternalError("renaming the download to " + target.string() +
                           " failed: " + errno_text(errno));
    }
    temp_path.clear();
    return std::nullopt;
  }
  // Closes and removes the temporary file unless it was committed.
  void discard() {
    if (fd >= 0) ::close(std::exchange(fd, -1));
    if (!temp_path.empty()) ::unlink(temp_path.c_str());
    temp_path.clear();
  }
};

struct EndpointCtx : SandboxRef {
  std::shared_ptr<OpState<Endpoint>> state;
  static void SBX_ABI on_complete(void* user_data, const sbx_endpoint* endpoint,
                                  const sbx_error* error) {
    CallbackScope scope;
    std::unique_ptr<EndpointCtx> ctx(static_cast<EndpointCtx*>(user_data));
    in_callback(*ctx->state, [&] {
      if (!endpoint) {
        return ctx->state->fail(error ? to_error(*error) : InternalError("endpoint failed"));
      }
      ctx->state->succeed(Endpoint{copy_of(endpoint->url), copy_of(endpoint->headers)});
    });
  }
};

}  // namespace
}  // namespace detail

using detail::start_operation;

Sandbox::Sandbox(std::shared_ptr<detail::SandboxState> state) : state_(std::move(state)) {}

Sandbox& Sandbox::operator=(Sandbox&& other) noexcept {
  if (this != &other) {
    Sandbox old(std::move(*this));  // closes what this held
    state_ = std::move(other.state_);
  }
  return *this;
}

Sandbox::~Sandbox() {
  if (!state_ || state_->closed.load()) return;
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
    close();
  } catch (const std::exception& e) {
    detail::logger()->warn("closing sandbox {} failed: {}", state_->id, e.what());
  }
}

const std::string& Sandbox::id() const {
  return state_->id;
}
const std::string& Sandbox::provider_name() const {
  return state_->generation->name;
}
bool Sandbox::closed() const {
  return state_->closed.load();
}

namespace {

void require_open(const detail::SandboxState& s) {
  if (s.closed.load()) throw FailedPreconditionError("Sandbox " + s.id + " is closed");
}

}  // namespace

Operation<ExecResult> Sandbox::exec_async(std::string command, ExecOptions options) {
  require_open(*state_);
  options.validate();
  const auto& g = state_->generation;
  auto ctx = std::make_unique<detail::ExecCtx>();
  ctx->sandbox = state_;
  ctx->on_output = std::move(options.on_output);
  const bool streamed = static_cast<bool>(ctx->on_output);
  if (!options.cwd) options.cwd = state_->workdir;
  const detail::KvList env(options.env);
  const sbx_exec_request request{sizeof(sbx_exec_request),
                                 detail::view_of(command),
                                 detail::optional_view(options.cwd),
                                 env.get(),
                                 detail::to_abi_ms(options.timeout_s),
                                 detail::optional_view(options.user)};
  return start_operation<ExecResult>(g, std::move(ctx), [&](detail::ExecCtx* raw) {
    const sbx_exec_callbacks callbacks{sizeof(sbx_exec_callbacks), raw,
                                       streamed ? &detail::ExecCtx::output : nullptr,
                                       &detail::ExecCtx::on_complete};
    return g->provider->exec(g->provider, state_->handle, &request, &callbacks);
  });
}

ExecResult Sandbox::exec(std::string_view command, ExecOptions options) {
  return exec_async(std::string(command), std::move(options)).get();
}

namespace {

Operation<void> start_upload(const std::shared_ptr<detail::SandboxState>& s,
                             std::unique_ptr<detail::UploadCtx> ctx, const std::string& remote) {
  const auto& g = s->generation;
  ctx->sandbox = s;
  ctx->stream.struct_size = sizeof(sbx_input_stream);
  ctx->stream.ctx = ctx.get();
  const sbx_upload_request request{sizeof(sbx_upload_request), detail::view_of(remote),
                                   &ctx->stream, 0};
  return start_operation<detail::Unit>(g, std::move(ctx), [&](detail::UploadCtx* raw) {
    const sbx_done_callbacks callbacks{sizeof(sbx_done_callbacks), raw,
                                       &detail::done_thunk<detail::UploadCtx>};
    return g->provider->upload(g->provider, s->handle, &request, &callbacks);
  });
}

}  // namespace

Operation<void> Sandbox::upload_async(std::filesystem::path local_path, std::string remote_path) {
  require_open(*state_);
  auto ctx = std::make_unique<detail::UploadCtx>();
  ctx->fd = ::open(local_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ctx->fd < 0) {
    throw InvalidArgumentError("cannot open " + local_path.string() +
                               " for upload: " + detail::errno_text(errno));
  }
  struct stat st {};
  if (::fstat(ctx->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw InvalidArgumentError("cannot upload " + local_path.string() + ": not a regular file");
  }
  ctx->stream.size = st.st_size;
  ctx->stream.read = &detail::UploadCtx::read_file;
  return start_upload(state_, std::move(ctx), remote_path);
}

void Sandbox::upload(const std::filesystem::path& local_path, std::string_view remote_path) {
  upload_async(local_path, std::string(remote_path)).get();
}

Operation<void> Sandbox::upload_bytes_async(std::string contents, std::string remote_path) {
  require_open(*state_);
  auto ctx = std::make_unique<detail::UploadCtx>();
  ctx->memory = std::move(contents);
  ctx->stream.size = static_cast<int64_t>(ctx->memory.size());
  ctx->stream.read = &detail::UploadCtx::read_memory;
  return start_upload(state_, std::move(ctx), remote_path);
}

void Sandbox::upload_bytes(std::string_view contents, std::string_view remote_path) {
  upload_bytes_async(std::string(contents), std::string(remote_path)).get();
}

namespace {

Operation<void> start_download(const std::shared_ptr<detail::SandboxState>& s,
                               std::unique_ptr<detail::DownloadCtx> ctx,
                               const std::string& remote) {
  const auto& g = s->generation;
  ctx->sandbox = s;
  ctx->stream = {sizeof(sbx_output_stream), ctx.get(), &detail::DownloadCtx::write};
  const sbx_download_request request{sizeof(sbx_download_request), detail::view_of(remote),
                                     &ctx->stream};
  return start_operation<detail::Unit>(g, std::move(ctx), [&](detail::DownloadCtx* raw) {
    const sbx_done_callbacks callbacks{sizeof(sbx_done_callbacks), raw,
                                       &detail::done_thunk<detail::DownloadCtx>};
    return g->provider->download(g->provider, s->handle, &request, &callbacks);
  });
}

}  // namespace

Operation<void> Sandbox::download_async(std::string remote_path, std::filesystem::path local_path) {
  require_open(*state_);
  auto ctx = std::make_unique<detail::DownloadCtx>();
  ctx->target = std::filesystem::absolute(local_path);
  std::error_code ec;
  std::filesystem::create_directories(ctx->target.parent_path(), ec);
  if (ec) {
    throw InvalidArgumentError("cannot create " + ctx->target.parent_path().string() + ": " +
                               ec.message());
  }
  std::string temp = ctx->target.string() + ".sbx-partial-XXXXXX";
  ctx->fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (ctx->fd < 0) {
    throw InvalidArgumentError("cannot write next to " + ctx->target.string() + ": " +
                               detail::errno_text(errno));
  }
  ctx->temp_path = temp;
  ::fchmod(ctx->fd, detail::new_file_mode());  // mkostemp made it 0600
  return start_download(state_, std::move(ctx), remote_path);
}

void Sandbox::download(std::string_view remote_path, const std::filesystem::path& local_path) {
  download_async(std::string(remote_path), local_path).get();
}

std::string Sandbox::download_bytes(std::string_view remote_path) {
  require_open(*state_);
  std::string contents;
  auto ctx = std::make_unique<detail::DownloadCtx>();
  ctx->memory = &contents;
  start_download(state_, std::move(ctx), std::string(remote_path)).get();
  return contents;
}

Operation<SandboxStatus> Sandbox::status_async() {
  const auto& g = state_->generation;
  if (state_->closed.load()) return detail::completed<SandboxStatus>(g, SandboxStatus::stopped);
  auto ctx = std::make_unique<detail::StatusCtx>();
  ctx->sandbox = state_;
  return start_operation<SandboxStatus>(g, std::move(ctx), [&](detail::StatusCtx* raw) {
    const sbx_status_callbacks callbacks{sizeof(sbx_status_callbacks), raw,
                                         &detail::StatusCtx::on_complete};
    return g->provider->status(g->provider, state_->handle, &callbacks);
  });
}

SandboxStatus Sandbox::status() {
  return status_async().get();
}

Endpoint Sandbox::endpoint(int64_t port) {
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
  if (!ext || !SBX_HAS_FIELD(ext, sbx_provider_endpoint, get)) {
    throw UnimplementedError("provider '" + g->name + "' does not support service endpoints");
  }
  require_open(*state_);
  auto ctx = std::make_unique<detail::EndpointCtx>();
  ctx->sandbox = state_;
  return start_operation<Endpoint>(g, std::move(ctx),
                                   [&](detail::EndpointCtx* raw) {
                                     const sbx_endpoint_callbacks callbacks{
                                         sizeof(sbx_endpoint_callbacks), raw,
                                         &detail::EndpointCtx::on_complete};
                                     return ext->get(g->provider, state_->handle,
                                                     static_cast<uint16_t>(port), &callbacks);
                                   })
      .get();
}

Operation<void> Sandbox::close_async() {
  const auto& g = state_->generation;
  if (state_->closed.exchange(true)) return detail::completed<detail::Unit>(g);
  auto ctx = std::make_unique<detail::CloseCtx>();
  ctx->sandbox = state_;
  return start_operation<detail::Unit>(g, std::move(ctx), [&](detail::CloseCtx* raw) {
    const sbx_done_callbacks callbacks{sizeof(sbx_done_callbacks), raw,
                                       &detail::done_thunk<detail::CloseCtx>};
    return g->provider->close(g->provider, state_->handle, &callbacks);
  });
}

void Sandbox::close() {
  if (state_) close_async().get();
}

void Sandbox::detach() {
  state_.reset();
}

}  // namespace sbx
