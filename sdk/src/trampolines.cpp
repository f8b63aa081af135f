// The C side of the SDK: sbx_plugin / sbx_provider function tables whose entries copy the borrowed
// arguments, call the C++ Provider, and deliver each operation's outcome exactly once. No exception
// leaves this file through a C function.

#include <sbx/abi/ext/connect.h>
#include <sbx/abi/ext/endpoint.h>
#include <sbx/abi/ext/list_reap.h>
#include <sbx/abi/ext/pause.h>
#include <sbx/abi/ext/renew.h>
#include <sbx/sdk/json.hpp>
#include <sbx/sdk/plugin.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <variant>

namespace sbx::sdk {
namespace detail {

// ---- Errors -------------------------------------------------------------------------------------

Error exception_to_error(const std::exception_ptr& error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e;
  } catch (const std::bad_alloc&) {
    return Error(SBX_STATUS_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return Error::internal(e.what());
  } catch (...) {
    return Error::internal("unknown exception");
  }
}

Error current_exception_to_error() noexcept {
  const std::exception_ptr error = std::current_exception();
  return error ? exception_to_error(error)
               : Error::internal("failed outside of an exception handler");
}

namespace {

// Calls fn(const sbx_error*) with a borrowed view of `error`.
template <class F>
void with_c_error(const Error& error, F&& fn) noexcept {
  const std::string_view message = error.what();
  const sbx_error c{sizeof(sbx_error),
                    error.status(),
                    to_sbx(message),
                    error.retryable(),
                    error.http_status(),
                    error.request_id().empty() ? sbx_str{nullptr, 0} : to_sbx(error.request_id())};
  fn(&c);
}

void report(const sbx_error_sink* sink, const Error& error) noexcept {
  if (sink && SBX_HAS_FIELD(sink, sbx_error_sink, report) && sink->report) {
    with_c_error(error, [&](const sbx_error* e) { sink->report(sink->ctx, e); });
  }
}

}  // namespace

// ---- Operations ---------------------------------------------------------------------------------

OpBase::OpBase() {
  handle_.struct_size = sizeof(sbx_operation);
  handle_.plugin_data = this;
  handle_.cancel = &OpBase::cancel_thunk;
  handle_.release = &OpBase::release_thunk;
}

sbx_operation* OpBase::host_handle() noexcept {
  add_ref();
  return &handle_;
}

void OpBase::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void SBX_ABI OpBase::cancel_thunk(sbx_operation* op) {
  static_cast<OpBase*>(op->plugin_data)->stop_.request_stop();
}

void SBX_ABI OpBase::release_thunk(sbx_operation* op) {
  static_cast<OpBase*>(op->plugin_data)->release();
}

void OpBase::on_dropped() noexcept {
  {
    std::lock_guard lock(start_mutex_);
    if (starting_) {
      dropped_ = true;  // reported by end_start(), where a thrown exception can take precedence
      return;
    }
  }
  fail(Error::internal("the provider dropped the operation without completing it"));
}

void OpBase::end_start(const std::exception_ptr& error) noexcept {
  bool dropped;
  {
    std::lock_guard lock(start_mutex_);
    starting_ = false;
    dropped = dropped_;
  }
  if (error) {
    fail(exception_to_error(error));
  } else if (dropped) {
    fail(Error::internal("the provider dropped the operation without completing it"));
  }
}

namespace {

// Runs a provider's start method: hands the host its handle and turns a synchronous throw into the
// operation's error.
template <class F>
sbx_operation* start(OpBase* op, F&& body) noexcept {
  sbx_operation* handle = op->host_handle();
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
  op->end_start(error);
  op->release();  // the trampoline's reference
  return handle;
}

// A sandbox handle as the host sees it.
struct SandboxBox {
  sbx_sandbox c{};
  std::unique_ptr<Sandbox> impl;

  explicit SandboxBox(std::unique_ptr<Sandbox> sandbox) : impl(std::move(sandbox)) {
    c.struct_size = sizeof(sbx_sandbox);
    c.id = to_sbx(impl->id());
    c.sandbox_data = this;
  }
  static Sandbox& from(sbx_sandbox* s) { return *static_cast<SandboxBox*>(s->sandbox_data)->impl; }
};

// A start call without usable callbacks cannot report anything: it starts nothing and returns NULL.
// Every callbacks struct ends with on_complete in ABI 1.0; a larger struct is from a later minor.
template <class Callbacks>
bool usable(const Callbacks* callbacks) {
  return callbacks && SBX_HAS_FIELD(callbacks, Callbacks, on_complete) && callbacks->on_complete;
}

class CreateOp final : public Op<std::unique_ptr<Sandbox>> {
 public:
  explicit CreateOp(const sbx_create_callbacks* cb) : cb_(*cb) {}
  void deliver_value(std::unique_ptr<Sandbox>&& sandbox) noexcept override {
    if (!sandbox) return deliver_error(Error::internal("the provider created no sandbox"));
    SandboxBox* box;
    try {
      box = new SandboxBox(std::move(sandbox));
    } catch (...) {
      return deliver_error(current_exception_to_error());
    }
    cb_.on_complete(cb_.user_data, &box->c, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, e); });
  }

 private:
  sbx_create_callbacks cb_;
};

// Output and completion reach the host one call at a time and in order, without a lock of ours held
// during the call (a host may cancel from inside on_output, and cancelling may run the provider's
// stop callbacks, which may write or complete on this very thread). A write or completion made
// re-entrantly from inside our own on_output is queued and delivered when that call returns.
class ExecOp final : public Op<ExitStatus>, public OutputSink {
 public:
  explicit ExecOp(const sbx_exec_callbacks* cb) : cb_(*cb) {}

  void write(StdStream stream, std::string_view bytes) override {
    if (bytes.empty()) return;
    std::unique_lock lock(mutex_);
    if (completed()) return;  // output after completion is dropped, never delivered late
    if (!cb_.on_output) {
      (stream == StdStream::err ? stderr_ : stdout_).append(bytes);
      return;
    }
    if (delivering_ && deliverer_ == std::this_thread::get_id()) {
      queued_.push_back({stream, std::string(bytes)});
      return;
    }
    turn_.wait(lock, [&] { return !delivering_; });
    if (completed()) return;
    begin_turn();
    lock.unlock();
    cb_.on_output(cb_.user_data, static_cast<int32_t>(stream), to_bytes(bytes));
    lock.lock();
    end_turn(lock);
  }
  void deliver_value(ExitStatus&& status) noexcept override {
    if (wait_for_turn(status)) complete(status);
  }
  void deliver_error(const Error& error) noexcept override {
    if (wait_for_turn(error)) complete(error);
  }

 private:
  using Outcome = std::variant<ExitStatus, Error>;
  struct Chunk {
    StdStream stream;
    std::string bytes;
  };

  void begin_turn() {
    delivering_ = true;
    deliverer_ = std::this_thread::get_id();
  }
  // Called with the lock held after on_output returned: delivers what was queued meanwhile, then
  // hands the turn on (and the completion, if it arrived re-entrantly).
  void end_turn(std::unique_lock<std::mutex>& lock) noexcept {
    while (!queued_.empty()) {
      const Chunk chunk = std::move(queued_.front());
      queued_.pop_front();
      lock.unlock();
      cb_.on_output(cb_.user_data, static_cast<int32_t>(chunk.stream), to_bytes(chunk.bytes));
      lock.lock();
    }
    delivering_ = false;
    std::optional<Outcome> outcome = std::exchange(parked_, std::nullopt);
    lock.unlock();
    turn_.notify_all();
    if (outcome) std::visit([&](const auto& o) { complete(o); }, *outcome);
  }
  // The operation is claimed (completed() is true), so no new write starts. Returns false when the
  // outcome was parked for the on_output call this thread is inside of.
  template <class T>
  bool wait_for_turn(const T& outcome) noexcept {
    std::unique_lock lock(mutex_);
    if (delivering_ && deliverer_ == std::this_thread::get_id()) {
      try {
        parked_.emplace(outcome);
      } catch (...) {
        parked_.emplace(Error(SBX_STATUS_RESOURCE_EXHAUSTED, "out of memory"));
      }
      return false;
    }
    turn_.wait(lock, [&] { return !delivering_; });
    return true;
  }
  void complete(const ExitStatus& status) noexcept {
    const sbx_exec_result result{
        sizeof(sbx_exec_result), status.return_code,
        status.error_type ? to_sbx(*status.error_type) : sbx_str{nullptr, 0}, to_bytes(stdout_),
        to_bytes(stderr_)};
    cb_.on_complete(cb_.user_data, &result, nullptr);
  }
  void complete(const Error& error) noexcept {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, e); });
  }

  sbx_exec_callbacks cb_;
  std::mutex mutex_;
  std::condition_variable turn_;
  bool delivering_ = false;  // an on_output call is in progress
  std::thread::id deliverer_;
  std::deque<Chunk> queued_;
  std::optional<Outcome> parked_;
  std::string stdout_;  // accumulated when the host did not ask for streaming
  std::string stderr_;
};

class DoneOp final : public Op<void> {
 public:
  explicit DoneOp(const sbx_done_callbacks* cb) : cb_(*cb) {}
  void deliver_value() noexcept override { cb_.on_complete(cb_.user_data, nullptr); }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, e); });
  }

 private:
  sbx_done_callbacks cb_;
};

// An upload or download: the operation owns the C++ view of the host's stream.
template <class Stream, class CStream>
class TransferOp final : public Op<void> {
 public:
  TransferOp(const sbx_done_callbacks* cb, const CStream& stream) : cb_(*cb), stream(stream) {}
  void deliver_value() noexcept override { cb_.on_complete(cb_.user_data, nullptr); }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, e); });
  }

 private:
  sbx_done_callbacks cb_;

 public:
  Stream stream;
};

class StatusOp final : public Op<SandboxStatus> {
 public:
  // `host_knows_paused`: the host's ABI is 1.1 or later; a 1.0 host hears RUNNING for PAUSED.
  StatusOp(const sbx_status_callbacks* cb, bool host_knows_paused)
      : cb_(*cb), host_knows_paused_(host_knows_paused) {}
  void deliver_value(SandboxStatus&& status) noexcept override {
    if (status == SandboxStatus::paused && !host_knows_paused_) status = SandboxStatus::running;
    cb_.on_complete(cb_.user_data, static_cast<int32_t>(status), nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(
        error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, SBX_SANDBOX_UNKNOWN, e); });
  }

 private:
  sbx_status_callbacks cb_;
  bool host_knows_paused_;
};

class DescriptorOp final : public Op<std::string> {
 public:
  explicit DescriptorOp(const sbx_descriptor_callbacks* cb) : cb_(*cb) {}
  void deliver_value(std::string&& descriptor) noexcept override {
    cb_.on_complete(cb_.user_data, to_sbx(descriptor), nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) {
      cb_.on_complete(cb_.user_data, sbx_str{nullptr, 0}, e);
    });
  }

 private:
  sbx_descriptor_callbacks cb_;
};

// As CreateOp: a sandbox handed over is the host's; with it, what the host must know of it.
class ConnectOp final : public Op<Connected> {
 public:
  explicit ConnectOp(const sbx_connect_callbacks* cb) : cb_(*cb) {}
  void deliver_value(Connected&& connected) noexcept override {
    if (!connected.sandbox)
      return deliver_error(Error::internal("the provider connected no sandbox"));
    SandboxBox* box;
    try {
      box = new SandboxBox(std::move(connected.sandbox));
    } catch (...) {
      return deliver_error(current_exception_to_error());
    }
    const sbx_connected_sandbox info{
        sizeof(sbx_connected_sandbox),
        connected.workdir ? to_sbx(*connected.workdir) : sbx_str{nullptr, 0},
        {connected.ports.data(), connected.ports.size()}};
    cb_.on_complete(cb_.user_data, &box->c, &info, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error,
                 [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, nullptr, e); });
  }

 private:
  sbx_connect_callbacks cb_;
};

class RenewOp final : public Op<int64_t> {
 public:
  explicit RenewOp(const sbx_renew_callbacks* cb) : cb_(*cb) {}
  void deliver_value(int64_t&& expires_at) noexcept override {
    cb_.on_complete(cb_.user_data, expires_at, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, 0, e); });
  }

 private:
  sbx_renew_callbacks cb_;
};

class EndpointOp final : public Op<Endpoint> {
 public:
  explicit EndpointOp(const sbx_endpoint_callbacks* cb) : cb_(*cb) {}
  void deliver_value(Endpoint&& endpoint) noexcept override {
    std::optional<KvListView> headers;
    try {
      headers.emplace(endpoint.headers);
    } catch (...) {
      return deliver_error(current_exception_to_error());
    }
    const sbx_endpoint c{sizeof(sbx_endpoint), to_sbx(endpoint.url), headers->list()};
    cb_.on_complete(cb_.user_data, &c, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, e); });
  }

 private:
  sbx_endpoint_callbacks cb_;
};

// list and reap share a shape: items, then completion.
template <class Callbacks>
class InfoListOp final : public Op<std::vector<SandboxInfo>> {
 public:
  explicit InfoListOp(const Callbacks* cb) : cb_(*cb) {}
  void deliver_value(std::vector<SandboxInfo>&& items) noexcept override {
    try {
      for (const SandboxInfo& info : items) {
        const KvListView labels(info.labels);
        const sbx_sandbox_info c{sizeof(sbx_sandbox_info), to_sbx(info.id),
                                 static_cast<int32_t>(info.status), labels.list(),
                                 info.created_unix_ms};
        if (cb_.on_item) cb_.on_item(cb_.user_data, &c);
      }
    } catch (...) {
      return deliver_error(current_exception_to_error());
    }
    cb_.on_complete(cb_.user_data, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, e); });
  }

 private:
  Callbacks cb_;
};

// ---- The provider table
// ---------------------------------------------------------------------------

struct ProviderBox {
  sbx_provider c{};
  std::unique_ptr<Provider> impl;
  Logger log;
  EndpointExtension* endpoint = nullptr;
  ListReapExtension* list_reap = nullptr;
  PauseExtension* pause = nullptr;
  ConnectExtension* connect = nullptr;
  RenewExtension* renew = nullptr;
  bool host_knows_paused = false;  // the host's ABI is 1.1 or later

  static ProviderBox& from(const sbx_provider* p) {
    return *static_cast<ProviderBox*>(p->provider_data);
  }
};

Sandbox& sandbox_of(sbx_sandbox* s) {
  return SandboxBox::from(s);
}

// When not even the operation can be allocated, the host hears of it at once, with no handle. The
// callbacks differ only in what stands for "no result": nothing, NULL, or an unknown status.
template <class Callbacks>
void fail_unstarted(const Callbacks& cb, const sbx_error* e) {
  if constexpr (std::is_invocable_v<decltype(cb.on_complete), void*, const sbx_error*>) {
    cb.on_complete(cb.user_data, e);
  } else if constexpr (std::is_same_v<Callbacks, sbx_status_callbacks>) {
    cb.on_complete(cb.user_data, SBX_SANDBOX_UNKNOWN, e);
  } else if constexpr (std::is_same_v<Callbacks, sbx_renew_callbacks>) {
    cb.on_complete(cb.user_data, 0, e);
  } else if constexpr (std::is_same_v<Callbacks, sbx_descriptor_callbacks>) {
    cb.on_complete(cb.user_data, sbx_str{nullptr, 0}, e);
  } else if constexpr (std::is_same_v<Callbacks, sbx_connect_callbacks>) {
    cb.on_complete(cb.user_data, nullptr, nullptr, e);
  } else {
    cb.on_complete(cb.user_data, nullptr, e);
  }
}

// Allocates an operation; on failure (out of memory) completes it at once and returns NULL.
template <class OpT, class Callbacks, class... Args>
OpT* new_op(const Callbacks* cb, Args&&... args) noexcept {
  try {
    return new OpT(cb, std::forward<Args>(args)...);
  } catch (...) {
    static const char kMessage[] = "out of memory starting the operation";
    const sbx_error e{
        sizeof(sbx_error), SBX_STATUS_RESOURCE_EXHAUSTED, {kMessage, sizeof(kMessage) - 1}, true, 0,
        {nullptr, 0}};
    fail_unstarted(*cb, &e);
    return nullptr;
  }
}

sbx_operation* SBX_ABI provider_create(sbx_provider* p, const sbx_spec* spec,
                                       const sbx_create_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<CreateOp>(cb);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<std::unique_ptr<Sandbox>> done(op);
    if (!spec) throw Error::invalid_argument("create needs a spec");
    Spec copy = to_spec(*spec);
    ProviderBox::from(p).impl->create(std::move(copy), std::move(done));
  });
}

sbx_operation* SBX_ABI provider_exec(sbx_provider* p, sbx_sandbox* s, const sbx_exec_request* req,
                                     const sbx_exec_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<ExecOp>(cb);
  if (!op) return nullptr;
  return start(op, [&] {
    ExecCompletion done(op, op);
    if (!req) throw Error::invalid_argument("exec needs a request");
    ExecRequest copy = to_exec_request(*req);
    ProviderBox::from(p).impl->exec(sandbox_of(s), std::move(copy), std::move(done));
  });
}

using UploadOp = TransferOp<ByteSource, sbx_input_stream>;
using DownloadOp = TransferOp<ByteSink, sbx_output_stream>;

// The host's stream, if the request carries a usable one (checked before the op exists, because
// the op keeps a copy); otherwise a stand-in, and the op fails inside start().
const sbx_input_stream* source_of(const sbx_upload_request* req) {
  if (!req || !SBX_HAS_FIELD(req, sbx_upload_request, mode)) return nullptr;
  const sbx_input_stream* s = req->source;
  return s && SBX_HAS_FIELD(s, sbx_input_stream, read) && s->read ? s : nullptr;
}
const sbx_output_stream* sink_of(const sbx_download_request* req) {
  if (!req || !SBX_HAS_FIELD(req, sbx_download_request, sink)) return nullptr;
  const sbx_output_stream* s = req->sink;
  return s && SBX_HAS_FIELD(s, sbx_output_stream, write) && s->write ? s : nullptr;
}

sbx_operation* SBX_ABI provider_upload(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_upload_request* req,
                                       const sbx_done_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  static const sbx_input_stream none{sizeof(sbx_input_stream), nullptr, 0, nullptr};
  const sbx_input_stream* source = source_of(req);
  auto* op = new_op<UploadOp>(cb, source ? *source : none);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<void> done(op);
    if (!source) throw Error::invalid_argument("upload needs a request with a source stream");
    UploadRequest copy{text(req->remote_path, "the upload's remote_path"),
                       req->mode == 0 ? 0644u : req->mode};
    ProviderBox::from(p).impl->upload(sandbox_of(s), std::move(copy), op->stream, std::move(done));
  });
}

sbx_operation* SBX_ABI provider_download(sbx_provider* p, sbx_sandbox* s,
                                         const sbx_download_request* req,
                                         const sbx_done_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  static const sbx_output_stream none{sizeof(sbx_output_stream), nullptr, nullptr};
  const sbx_output_stream* sink = sink_of(req);
  auto* op = new_op<DownloadOp>(cb, sink ? *sink : none);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<void> done(op);
    if (!sink) throw Error::invalid_argument("download needs a request with a sink stream");
    ProviderBox::from(p).impl->download(sandbox_of(s),
                                        text(req->remote_path, "the download's remote_path"),
                                        op->stream, std::move(done));
  });
}

sbx_operation* SBX_ABI provider_status(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_status_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<StatusOp>(cb, ProviderBox::from(p).host_knows_paused);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<SandboxStatus> done(op);
    ProviderBox::from(p).impl->status(sandbox_of(s), std::move(done));
  });
}

sbx_operation* SBX_ABI provider_close(sbx_provider* p, sbx_sandbox* s,
                                      const sbx_done_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<DoneOp>(cb);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<void> done(op);
    ProviderBox::from(p).impl->close(sandbox_of(s), std::move(done));
  });
}

void SBX_ABI provider_release_sandbox(sbx_provider*, sbx_sandbox* s) {
  delete static_cast<SandboxBox*>(s->sandbox_data);
}

sbx_operation* SBX_ABI endpoint_get(sbx_provider* p, sbx_sandbox* s, uint16_t port,
                                    const sbx_endpoint_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<EndpointOp>(cb);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<Endpoint> done(op);
    ProviderBox::from(p).endpoint->endpoint(sandbox_of(s), port, std::move(done));
  });
}

template <class Callbacks, bool kReap>
sbx_operation* SBX_ABI list_or_reap(sbx_provider* p, sbx_kv_list selector, const Callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<InfoListOp<Callbacks>>(cb);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<std::vector<SandboxInfo>> done(op);
    auto& ext = *ProviderBox::from(p).list_reap;
    if constexpr (kReap) {
      ext.reap(to_key_values(selector), std::move(done));
    } else {
      ext.list(to_key_values(selector), std::move(done));
    }
  });
}

// sbx.pause/1: both directions complete like close.
template <bool kPause>
sbx_operation* SBX_ABI pause_or_resume(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_done_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<DoneOp>(cb);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<void> done(op);
    auto& ext = *ProviderBox::from(p).pause;
    if constexpr (kPause) {
      ext.pause(sandbox_of(s), std::move(done));
    } else {
      ext.resume(sandbox_of(s), std::move(done));
    }
  });
}

sbx_operation* SBX_ABI connect_serialize(sbx_provider* p, sbx_sandbox* s,
                                         const sbx_descriptor_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<DescriptorOp>(cb);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<std::string> done(op);
    ProviderBox::from(p).connect->serialize(sandbox_of(s), std::move(done));
  });
}

sbx_operation* SBX_ABI connect_connect(sbx_provider* p, sbx_str descriptor,
                                       const sbx_connect_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<ConnectOp>(cb);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<Connected> done(op);
    ProviderBox::from(p).connect->connect(text(descriptor, "the descriptor"), std::move(done));
  });
}

sbx_operation* SBX_ABI renew_renew(sbx_provider* p, sbx_sandbox* s, int64_t expires_at_unix_ms,
                                   const sbx_renew_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new_op<RenewOp>(cb);
  if (!op) return nullptr;
  return start(op, [&] {
    Completion<int64_t> done(op);
    ProviderBox::from(p).renew->renew(sandbox_of(s), expires_at_unix_ms, std::move(done));
  });
}

const sbx_provider_endpoint kEndpointTable{sizeof(sbx_provider_endpoint), &endpoint_get};
const sbx_provider_pause kPauseTable{sizeof(sbx_provider_pause), &pause_or_resume<true>,
                                     &pause_or_resume<false>};
const sbx_provider_connect kConnectTable{sizeof(sbx_provider_connect), &connect_serialize,
                                         &connect_connect};
const sbx_provider_renew kRenewTable{sizeof(sbx_provider_renew), &renew_renew};
const sbx_provider_list_reap kListReapTable{sizeof(sbx_provider_list_reap),
                                            &list_or_reap<sbx_list_callbacks, false>,
                                            &list_or_reap<sbx_reap_callbacks, true>};

const void* SBX_ABI provider_get_extension(const sbx_provider* p, const char* id) {
  if (!id) return nullptr;
  const ProviderBox& box = ProviderBox::from(p);
  const std::string_view name(id);
  if (name == SBX_EXT_ENDPOINT && box.endpoint) return &kEndpointTable;
  if (name == SBX_EXT_LIST_REAP && box.list_reap) return &kListReapTable;
  if (name == SBX_EXT_PAUSE && box.pause) return &kPauseTable;
  if (name == SBX_EXT_CONNECT && box.connect) return &kConnectTable;
  if (name == SBX_EXT_RENEW && box.renew) return &kRenewTable;
  return nullptr;
}

void SBX_ABI provider_destroy(sbx_provider* p) {
  delete &ProviderBox::from(p);
}

// ---- Plugin-wide state ----------------------------------------------------------------------

// init and deinit may come more than once (CLAP 1.2 asks the same of its plugins): balanced pairs
// are counted, the host stays set until the last deinit, and a deinit without an init does
// nothing.
std::atomic<const sbx_host*> g_plugin_host{nullptr};
std::mutex g_init_mutex;
int g_init_count = 0;

// The host struct as ABI 1.0 defined it ends with get_extension; a later minor appends to it.
bool usable(const sbx_host* host) {
  return host && SBX_HAS_FIELD(host, sbx_host, get_extension);
}

}  // namespace

sbx_status SBX_ABI plugin_init(const sbx_host* host, const sbx_error_sink* errors) {
  if (!usable(host) || !sbx_version_is_compatible(host->abi_version)) {
    try {
      report(errors,
             Error::failed_precondition("the host's ABI is not compatible with this plugin"));
    } catch (...) {  // out of memory for the message: the status says enough
    }
    return SBX_STATUS_FAILED_PRECONDITION;
  }
  std::lock_guard lock(g_init_mutex);
  if (g_init_count++ == 0) g_plugin_host.store(host);
  return SBX_STATUS_OK;
}

void SBX_ABI plugin_deinit() {
  std::lock_guard lock(g_init_mutex);
  if (g_init_count == 0) return;
  if (--g_init_count == 0) g_plugin_host.store(nullptr);
}

sbx_provider* make_c_provider(std::unique_ptr<Provider> provider, Logger log,
                              bool host_knows_paused) {
  auto box = std::make_unique<ProviderBox>();
  box->endpoint = provider->endpoint_extension();
  box->list_reap = provider->list_reap_extension();
  box->pause = provider->pause_extension();
  box->connect = provider->connect_extension();
  box->renew = provider->renew_extension();
  box->host_knows_paused = host_knows_paused;
  box->impl = std::move(provider);
  box->log = log;
  sbx_provider& c = box->c;
  c.struct_size = sizeof(sbx_provider);
  c.provider_data = box.get();
  c.create = &provider_create;
  c.exec = &provider_exec;
  c.upload = &provider_upload;
  c.download = &provider_download;
  c.status = &provider_status;
  c.close = &provider_close;
  c.release_sandbox = &provider_release_sandbox;
  c.get_extension = &provider_get_extension;
  c.destroy = &provider_destroy;
  return &box.release()->c;
}

sbx_status create_provider(const sbx_host* host, sbx_str config_json, sbx_provider** out,
                           const sbx_error_sink* errors,
                           std::unique_ptr<Provider> (*make)(const ProviderContext&,
                                                             const boost::json::object&)) {
  try {
    if (!out) throw Error::invalid_argument("no output pointer for the provider");
    *out = nullptr;
    if (!usable(host)) {
      throw Error::invalid_argument("the provider needs a host");
    }
    const boost::json::object config = json::parse_object(view(config_json), "config");
    const ProviderContext context{host, Logger(host)};
    const bool host_knows_paused = host->abi_version.major > 1 || host->abi_version.minor >= 1;
    *out = make_c_provider(make(context, config), context.log, host_knows_paused);
    return SBX_STATUS_OK;
  } catch (...) {
    const Error error = current_exception_to_error();
    report(errors, error);
    return error.status();
  }
}

}  // namespace detail

const sbx_host* plugin_host() noexcept {
  return detail::g_plugin_host.load();
}

// ---- Completion<void>, ByteSource, ByteSink
// -------------------------------------------------------

namespace detail {

CompletionBase::CompletionBase(OpBase* op) : op_(op) {
  op_->add_ref();
}

CompletionBase& CompletionBase::operator=(CompletionBase&& other) noexcept {
  if (this != &other) {
    reset();
    op_ = std::exchange(other.op_, nullptr);
  }
  return *this;
}

CompletionBase::~CompletionBase() {
  reset();
}

void CompletionBase::reset() noexcept {
  if (auto* op = std::exchange(op_, nullptr)) {
    op->on_dropped();
    op->release();
  }
}

void CompletionBase::fail(const Error& error) {
  auto* op = std::exchange(op_, nullptr);
  if (!op) return;  // already completed, or moved from
  op->fail(error);
  op->release();
}

void CompletionBase::fail_current_exception() {
  fail(current_exception_to_error());
}

CancelToken CompletionBase::cancel_token() const {
  return op_ ? op_->token() : CancelToken();
}

}  // namespace detail

Completion<void>::Completion(detail::Op<void>* op) : detail::CompletionBase(op) {}

void Completion<void>::succeed() {
  auto* op = static_cast<detail::Op<void>*>(take());
  if (!op) return;  // already completed, or moved from
  if (op->claim()) op->deliver_value();
  op->release();
}

size_t ByteSource::read(char* buffer, size_t capacity) {
  const int64_t n = stream_.read(stream_.ctx, reinterpret_cast<uint8_t*>(buffer), capacity);
  if (n < 0 || static_cast<uint64_t>(n) > capacity) {
    throw Error::internal("the upload's source stream failed");
  }
  return static_cast<size_t>(n);
}

void ByteSink::write(std::string_view bytes) {
  if (bytes.empty()) return;
  if (stream_.write(stream_.ctx, to_bytes(bytes)) != 0) {
    throw Error::cancelled("the download's destination refused the data");
  }
}

}  // namespace sbx::sdk
