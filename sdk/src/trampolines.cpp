// The C side of the SDK: sbx_plugin / sbx_provider function tables whose entries copy the borrowed
// arguments, call the C++ Provider, and deliver each operation's outcome exactly once. No exception
// leaves this file through a C function.

#include <sbx/abi/ext/endpoint.h>
#include <sbx/abi/ext/list_reap.h>
#include <sbx/sdk/json.hpp>
#include <sbx/sdk/plugin.hpp>

#include <atomic>
#include <mutex>
#include <new>
#include <string>

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
  return exception_to_error(std::current_exception());
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
  if (sink && sink->report) {
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
template <class Callbacks>
bool usable(const Callbacks* callbacks) {
  return callbacks && callbacks->struct_size >= sizeof(Callbacks) && callbacks->on_complete;
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

class ExecOp final : public Op<ExitStatus>, public OutputSink {
 public:
  explicit ExecOp(const sbx_exec_callbacks* cb) : cb_(*cb) {}

  void write(StdStream stream, std::string_view bytes) override {
    if (bytes.empty()) return;
    std::lock_guard lock(output_mutex_);
    if (completed()) return;  // output after completion is dropped, never delivered late
    if (cb_.on_output) {
      cb_.on_output(cb_.user_data, static_cast<int32_t>(stream), to_bytes(bytes));
    } else {
      (stream == StdStream::err ? stderr_ : stdout_).append(bytes);
    }
  }
  void deliver_value(ExitStatus&& status) noexcept override {
    std::lock_guard lock(output_mutex_);  // waits for a write() in progress
    const sbx_exec_result result{
        sizeof(sbx_exec_result), status.return_code,
        status.error_type ? to_sbx(*status.error_type) : sbx_str{nullptr, 0}, to_bytes(stdout_),
        to_bytes(stderr_)};
    cb_.on_complete(cb_.user_data, &result, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    std::lock_guard lock(output_mutex_);
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, e); });
  }

 private:
  sbx_exec_callbacks cb_;
  std::mutex output_mutex_;
  std::string stdout_;
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
  explicit StatusOp(const sbx_status_callbacks* cb) : cb_(*cb) {}
  void deliver_value(SandboxStatus&& status) noexcept override {
    cb_.on_complete(cb_.user_data, static_cast<int32_t>(status), nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(
        error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, SBX_SANDBOX_UNKNOWN, e); });
  }

 private:
  sbx_status_callbacks cb_;
};

class EndpointOp final : public Op<Endpoint> {
 public:
  explicit EndpointOp(const sbx_endpoint_callbacks* cb) : cb_(*cb) {}
  void deliver_value(Endpoint&& endpoint) noexcept override {
    try {
      const KvListView headers(endpoint.headers);
      const sbx_endpoint c{sizeof(sbx_endpoint), to_sbx(endpoint.url), headers.list()};
      cb_.on_complete(cb_.user_data, &c, nullptr);
    } catch (...) {
      deliver_error(current_exception_to_error());
    }
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

  static ProviderBox& from(const sbx_provider* p) {
    return *static_cast<ProviderBox*>(p->provider_data);
  }
};

Sandbox& sandbox_of(sbx_sandbox* s) {
  return SandboxBox::from(s);
}

sbx_operation* SBX_ABI provider_create(sbx_provider* p, const sbx_spec* spec,
                                       const sbx_create_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new CreateOp(cb);
  return start(op, [&] {
    Completion<std::unique_ptr<Sandbox>> done(op);
    Spec copy = to_spec(*spec);
    ProviderBox::from(p).impl->create(std::move(copy), std::move(done));
  });
}

sbx_operation* SBX_ABI provider_exec(sbx_provider* p, sbx_sandbox* s, const sbx_exec_request* req,
                                     const sbx_exec_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new ExecOp(cb);
  return start(op, [&] {
    ExecCompletion done(op, op);
    ExecRequest copy = to_exec_request(*req);
    ProviderBox::from(p).impl->exec(sandbox_of(s), std::move(copy), std::move(done));
  });
}

using UploadOp = TransferOp<ByteSource, sbx_input_stream>;
using DownloadOp = TransferOp<ByteSink, sbx_output_stream>;

template <class T>
const T& require_struct(const T* value, const char* name) {
  if (!value || value->struct_size < sizeof(T)) {
    throw Error::invalid_argument(std::string(name) + " is missing or too small");
  }
  return *value;
}

sbx_operation* SBX_ABI provider_upload(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_upload_request* req,
                                       const sbx_done_callbacks* cb) {
  // The stream is validated inside start() so that a bad one completes the op with an error.
  if (!usable(cb)) return nullptr;
  static const sbx_input_stream empty{sizeof(sbx_input_stream), nullptr, 0, nullptr};
  const bool stream_ok = req && req->source && req->source->struct_size >= sizeof(sbx_input_stream);
  auto* op = new UploadOp(cb, stream_ok ? *req->source : empty);
  return start(op, [&] {
    Completion<void> done(op);
    const auto& r = require_struct(req, "sbx_upload_request");
    if (!stream_ok || !r.source->read) throw Error::invalid_argument("upload has no source stream");
    UploadRequest copy{std::string(view(r.remote_path)), r.mode == 0 ? 0644u : r.mode};
    ProviderBox::from(p).impl->upload(sandbox_of(s), std::move(copy), op->stream, std::move(done));
  });
}

sbx_operation* SBX_ABI provider_download(sbx_provider* p, sbx_sandbox* s,
                                         const sbx_download_request* req,
                                         const sbx_done_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  static const sbx_output_stream empty{sizeof(sbx_output_stream), nullptr, nullptr};
  const bool stream_ok = req && req->sink && req->sink->struct_size >= sizeof(sbx_output_stream);
  auto* op = new DownloadOp(cb, stream_ok ? *req->sink : empty);
  return start(op, [&] {
    Completion<void> done(op);
    const auto& r = require_struct(req, "sbx_download_request");
    if (!stream_ok || !r.sink->write) throw Error::invalid_argument("download has no sink stream");
    ProviderBox::from(p).impl->download(sandbox_of(s), std::string(view(r.remote_path)), op->stream,
                                        std::move(done));
  });
}

sbx_operation* SBX_ABI provider_status(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_status_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new StatusOp(cb);
  return start(op, [&] {
    Completion<SandboxStatus> done(op);
    ProviderBox::from(p).impl->status(sandbox_of(s), std::move(done));
  });
}

sbx_operation* SBX_ABI provider_close(sbx_provider* p, sbx_sandbox* s,
                                      const sbx_done_callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new DoneOp(cb);
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
  auto* op = new EndpointOp(cb);
  return start(op, [&] {
    Completion<Endpoint> done(op);
    ProviderBox::from(p).endpoint->endpoint(sandbox_of(s), port, std::move(done));
  });
}

template <class Callbacks, bool kReap>
sbx_operation* SBX_ABI list_or_reap(sbx_provider* p, sbx_kv_list selector, const Callbacks* cb) {
  if (!usable(cb)) return nullptr;
  auto* op = new InfoListOp<Callbacks>(cb);
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

const sbx_provider_endpoint kEndpointTable{sizeof(sbx_provider_endpoint), &endpoint_get};
const sbx_provider_list_reap kListReapTable{sizeof(sbx_provider_list_reap),
                                            &list_or_reap<sbx_list_callbacks, false>,
                                            &list_or_reap<sbx_reap_callbacks, true>};

const void* SBX_ABI provider_get_extension(const sbx_provider* p, const char* id) {
  if (!id) return nullptr;
  const ProviderBox& box = ProviderBox::from(p);
  const std::string_view name(id);
  if (name == SBX_EXT_ENDPOINT && box.endpoint) return &kEndpointTable;
  if (name == SBX_EXT_LIST_REAP && box.list_reap) return &kListReapTable;
  return nullptr;
}

void SBX_ABI provider_destroy(sbx_provider* p) {
  delete &ProviderBox::from(p);
}

// ---- Plugin-wide state ----------------------------------------------------------------------

std::atomic<const sbx_host*> g_plugin_host{nullptr};

}  // namespace

sbx_status SBX_ABI plugin_init(const sbx_host* host, const sbx_error_sink* errors) {
  if (!host || host->struct_size < sizeof(sbx_host) ||
      !sbx_version_is_compatible(host->abi_version)) {
    report(errors, Error::failed_precondition("the host's ABI is not compatible with this plugin"));
    return SBX_STATUS_FAILED_PRECONDITION;
  }
  g_plugin_host.store(host);
  return SBX_STATUS_OK;
}

void SBX_ABI plugin_deinit() {
  g_plugin_host.store(nullptr);
}

sbx_provider* make_c_provider(std::unique_ptr<Provider> provider, Logger log) {
  auto box = std::make_unique<ProviderBox>();
  box->endpoint = provider->endpoint_extension();
  box->list_reap = provider->list_reap_extension();
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
    if (!host || host->struct_size < sizeof(sbx_host)) {
      throw Error::invalid_argument("the provider needs a host");
    }
    const boost::json::object config = json::parse_object(view(config_json), "config");
    const ProviderContext context{host, Logger(host)};
    *out = make_c_provider(make(context, config), context.log);
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
