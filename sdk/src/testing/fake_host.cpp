#include <sbx/sdk/clock.hpp>
#include <sbx/sdk/testing/fake_host.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <utility>

namespace sbx::sdk::testing {

// ---- Records ------------------------------------------------------------------------------------

// Everything one operation's callbacks delivered. Kept alive by the FakeHost.
struct OpRecord {
  FakeHost* host;
  std::string name;
  mutable std::mutex mutex;
  std::condition_variable changed;
  int completions = 0;
  std::optional<ErrorInfo> error;
  sbx_sandbox* sandbox = nullptr;  // create
  int32_t status = SBX_SANDBOX_UNKNOWN;
  ExecOutcome exec;
  std::string downloaded;

  OpRecord(FakeHost* h, std::string n) : host(h), name(std::move(n)) {}
};

struct FakeHost::State {
  sbx_host host{};
  std::atomic<int64_t> now_ns{0};
  mutable std::mutex mutex;
  mutable std::condition_variable logged;
  std::vector<LogLine> logs;
  std::vector<std::string> problems;
  std::vector<std::shared_ptr<OpRecord>> records;
};

namespace {

std::string copy(sbx_str s) {
  return s.data ? std::string(s.data, s.len) : std::string();
}
sbx_str view(std::string_view s) {
  return sbx_str{s.data(), s.size()};
}
sbx_str optional_view(const std::optional<std::string>& s) {
  return s ? view(*s) : sbx_str{nullptr, 0};
}
sbx_opt_i64 optional_i64(const std::optional<int64_t>& v) {
  return v ? sbx_opt_i64{true, *v} : sbx_opt_i64{false, 0};
}

ErrorInfo copy(const sbx_error& e) {
  return ErrorInfo{
      e.status,           copy(e.message),
      e.retryable,        e.http_status,
      copy(e.request_id), SBX_HAS_FIELD(&e, sbx_error, reason) ? copy(e.reason) : std::string()};
}

FakeHost* owner(const sbx_host* host) {
  return static_cast<FakeHost*>(host->host_data);
}

// sbx_kv entries viewing a map (which must outlive the list).
struct KvView {
  std::vector<sbx_kv> items;
  explicit KvView(const std::map<std::string, std::string>& map) {
    for (const auto& [k, v] : map)
      items.push_back({view(k), view(v)});
  }
  sbx_kv_list list() const { return {items.data(), items.size()}; }
};

}  // namespace

// The callbacks of each operation kind, as static functions with access to FakeHost internals.
struct Callbacks {
  static void second(OpRecord& r) {
    r.host->add_problem("operation '" + r.name + "' completed a second time");
  }
  template <class F>
  static void on_complete(void* user_data, F&& fill) {
    auto& r = *static_cast<OpRecord*>(user_data);
    std::unique_lock lock(r.mutex);
    if (++r.completions > 1) {
      lock.unlock();
      second(r);
      return;
    }
    fill(r);
    lock.unlock();
    r.changed.notify_all();
  }
  static void SBX_ABI create_done(void* u, sbx_sandbox* sandbox, const sbx_error* e) {
    on_complete(u, [&](OpRecord& r) {
      r.sandbox = sandbox;
      if (e) r.error = copy(*e);
    });
  }
  static void SBX_ABI done(void* u, const sbx_error* e) {
    on_complete(u, [&](OpRecord& r) {
      if (e) r.error = copy(*e);
    });
  }
  static void SBX_ABI status_done(void* u, int32_t status, const sbx_error* e) {
    on_complete(u, [&](OpRecord& r) {
      r.status = status;
      if (e) r.error = copy(*e);
    });
  }
  static void SBX_ABI exec_output(void* u, int32_t stream, sbx_bytes chunk) {
    auto& r = *static_cast<OpRecord*>(u);
    std::unique_lock lock(r.mutex);
    if (r.completions > 0) {
      lock.unlock();
      r.host->add_problem("operation '" + r.name + "' wrote output after its completion");
      return;
    }
    std::string bytes(reinterpret_cast<const char*>(chunk.data), chunk.len);
    (stream == 2 ? r.exec.stderr_text : r.exec.stdout_text) += bytes;
    r.exec.chunks.push_back({stream, std::move(bytes)});
    lock.unlock();
    r.changed.notify_all();
  }
  static void SBX_ABI exec_done(void* u, const sbx_exec_result* result, const sbx_error* e) {
    on_complete(u, [&](OpRecord& r) {
      r.exec.completed = true;
      if (e) r.exec.error = copy(*e);
      if (result) {
        r.exec.return_code = result->return_code;
        if (result->error_type.data) r.exec.error_type = copy(result->error_type);
        r.exec.stdout_text.append(reinterpret_cast<const char*>(result->stdout_bytes.data),
                                  result->stdout_bytes.len);
        r.exec.stderr_text.append(reinterpret_cast<const char*>(result->stderr_bytes.data),
                                  result->stderr_bytes.len);
      }
    });
  }
  static int32_t SBX_ABI sink_write(void* u, sbx_bytes data) {
    auto& r = *static_cast<OpRecord*>(u);
    std::lock_guard lock(r.mutex);
    r.downloaded.append(reinterpret_cast<const char*>(data.data), data.len);
    return 0;
  }

  // The host's services.
  static void SBX_ABI log(const sbx_host* host, int32_t level, sbx_str message) {
    FakeHost* self = owner(host);
    LogLine line{level, copy(message)};
    if (self->options().echo_logs) {
      std::fprintf(stderr, "[plugin %d] %s\n", level, line.message.c_str());
    }
    {
      std::lock_guard lock(self->state_->mutex);
      self->state_->logs.push_back(std::move(line));
    }
    self->state_->logged.notify_all();
  }
  static bool SBX_ABI log_enabled(const sbx_host*, int32_t) { return true; }
  static int64_t SBX_ABI now_ns(const sbx_host* host) {
    return owner(host)->state_->now_ns.load(std::memory_order_acquire);
  }
  static const void* SBX_ABI get_extension(const sbx_host*, const char*) { return nullptr; }
  static void SBX_ABI error_sink(void* ctx, const sbx_error* e) {
    if (e) *static_cast<std::optional<ErrorInfo>*>(ctx) = copy(*e);
  }
};

// ---- FakeHost -----------------------------------------------------------------------------------

FakeHost::FakeHost(sbx_plugin_entry_fn entry) : FakeHost(entry, Options{}, nullptr) {}

FakeHost::FakeHost(sbx_plugin_entry_fn entry, Options options)
    : FakeHost(entry, std::move(options), nullptr) {}

FakeHost::FakeHost(sbx_plugin_entry_fn entry, Options options, void* library)
    : options_(std::move(options)), state_(std::make_unique<State>()), library_(library) {
  state_->now_ns.store(options_.start_ns);
  sbx_host& h = state_->host;
  h.struct_size = sizeof(sbx_host);
  h.abi_version = options_.abi_version;
  h.host_name = view(options_.host_name);
  h.host_version = view("0");
  h.host_data = this;
  h.log = options_.null_log ? nullptr : &Callbacks::log;
  h.log_enabled = &Callbacks::log_enabled;
  h.now_ns = options_.null_now_ns ? nullptr : &Callbacks::now_ns;
  h.get_extension = options_.null_get_extension ? nullptr : &Callbacks::get_extension;
  if (!entry) throw FakeHostError("no plugin entry function");
  plugin_ = entry();
  if (!plugin_ || !plugin_->init) throw FakeHostError("the plugin entry returned no usable plugin");
  std::optional<ErrorInfo> error;
  const sbx_error_sink sink{sizeof(sbx_error_sink), &error, &Callbacks::error_sink};
  const sbx_status status = plugin_->init(&h, &sink);
  if (status != SBX_STATUS_OK) {
    plugin_ = nullptr;
    throw FakeHostError("the plugin's init failed: " + (error ? error->message : "(no message)"));
  }
}

std::unique_ptr<FakeHost> FakeHost::load(const std::filesystem::path& file, Options options) {
  void* library = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) throw FakeHostError("cannot load " + file.string() + ": " + ::dlerror());
  auto entry = reinterpret_cast<sbx_plugin_entry_fn>(::dlsym(library, SBX_PLUGIN_ENTRY_SYMBOL));
  if (!entry) {
    ::dlclose(library);
    throw FakeHostError(file.string() + " exports no " SBX_PLUGIN_ENTRY_SYMBOL);
  }
  try {
    return std::unique_ptr<FakeHost>(new FakeHost(entry, std::move(options), library));
  } catch (...) {
    ::dlclose(library);
    throw;
  }
}

FakeHost::~FakeHost() {
  if (plugin_ && plugin_->deinit) plugin_->deinit();
  if (library_) ::dlclose(library_);
}

const sbx_host* FakeHost::host() const noexcept {
  return &state_->host;
}

FakeProvider FakeHost::provider(std::string_view id, std::string_view config_json) {
  for (size_t i = 0; i < plugin_->factory_count; ++i) {
    const sbx_provider_factory* f = plugin_->factories[i];
    if (!f || !f->id || std::string_view(f->id) != id) continue;
    std::optional<ErrorInfo> error;
    const sbx_error_sink sink{sizeof(sbx_error_sink), &error, &Callbacks::error_sink};
    sbx_provider* out = nullptr;
    const sbx_status status = f->create(f, &state_->host, view(config_json), &out, &sink);
    if (status != SBX_STATUS_OK || !out) {
      throw FakeHostError("provider '" + std::string(id) +
                          "' refused its config: " + (error ? error->message : "(no message)"));
    }
    return FakeProvider(this, out);
  }
  throw FakeHostError("the plugin has no provider '" + std::string(id) + "'");
}

ErrorInfo FakeHost::provider_error(std::string_view id, std::string_view config_json) {
  for (size_t i = 0; i < plugin_->factory_count; ++i) {
    const sbx_provider_factory* f = plugin_->factories[i];
    if (!f || !f->id || std::string_view(f->id) != id) continue;
    std::optional<ErrorInfo> error;
    const sbx_error_sink sink{sizeof(sbx_error_sink), &error, &Callbacks::error_sink};
    sbx_provider* out = nullptr;
    const sbx_status status = f->create(f, &state_->host, view(config_json), &out, &sink);
    if (status == SBX_STATUS_OK) {
      if (out) out->destroy(out);
      throw FakeHostError("provider '" + std::string(id) + "' accepted the config");
    }
    ErrorInfo info = error.value_or(ErrorInfo{});
    info.status = status;
    return info;
  }
  throw FakeHostError("the plugin has no provider '" + std::string(id) + "'");
}

std::chrono::nanoseconds FakeHost::now() const noexcept {
  return std::chrono::nanoseconds(state_->now_ns.load(std::memory_order_acquire));
}

void FakeHost::advance(std::chrono::nanoseconds by) noexcept {
  state_->now_ns.fetch_add(by.count(), std::memory_order_acq_rel);
  sbx::sdk::notify_clock_changed();
}

std::vector<LogLine> FakeHost::logs() const {
  std::lock_guard lock(state_->mutex);
  return state_->logs;
}

bool FakeHost::wait_for_log(std::string_view text, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->mutex);
  return state_->logged.wait_for(lock, timeout, [&] {
    for (const LogLine& line : state_->logs)
      if (line.message.find(text) != std::string::npos) return true;
    return false;
  });
}

size_t FakeHost::count_logs(std::string_view text) const {
  std::lock_guard lock(state_->mutex);
  size_t n = 0;
  for (const LogLine& line : state_->logs)
    n += line.message.find(text) != std::string::npos;
  return n;
}

std::vector<std::string> FakeHost::problems() const {
  std::lock_guard lock(state_->mutex);
  return state_->problems;
}

void FakeHost::add_problem(std::string problem) {
  std::lock_guard lock(state_->mutex);
  state_->problems.push_back(std::move(problem));
}

// ---- Waiting for an operation -------------------------------------------------------------------

namespace {

std::shared_ptr<OpRecord> new_record(FakeHost* host, std::vector<std::shared_ptr<OpRecord>>& all,
                                     std::mutex& mutex, std::string name) {
  auto record = std::make_shared<OpRecord>(host, std::move(name));
  std::lock_guard lock(mutex);
  all.push_back(record);
  return record;
}

// Waits for the first completion; false (and a problem recorded by the caller) when none came.
bool wait_completed(OpRecord& r, std::chrono::milliseconds timeout) {
  std::unique_lock lock(r.mutex);
  return r.changed.wait_for(lock, timeout, [&] { return r.completions > 0; });
}

void release_op(sbx_operation* op, const Misbehaviour& m) {
  if (!op) return;
  // The function pointers are read before the first release: the handle's memory may be gone
  // after it, and the misbehaviour is the second call, not reading freed memory here.
  const auto release = op->release;
  const auto cancel = op->cancel;
  release(op);
  if (m.release_handle_twice) release(op);
  if (m.cancel_after_release) cancel(op);
}

}  // namespace

// ---- FakeProvider -------------------------------------------------------------------------------

FakeProvider::FakeProvider(FakeHost* host, sbx_provider* provider)
    : host_(host), provider_(provider) {}

FakeProvider::FakeProvider(FakeProvider&& other) noexcept
    : misbehave(other.misbehave),
      host_(other.host_),
      provider_(std::exchange(other.provider_, nullptr)),
      live_(std::move(other.live_)) {}

FakeProvider::~FakeProvider() {
  if (!provider_) return;
  for (sbx_sandbox* s : live_)
    provider_->release_sandbox(provider_, s);
  provider_->destroy(provider_);
}

DoneOutcome FakeProvider::wait_done(std::shared_ptr<OpRecord> record, sbx_operation* op) {
  DoneOutcome out;
  bool completed_already;
  {
    std::lock_guard lock(record->mutex);
    completed_already = record->completions > 0;
  }
  if (!op && !completed_already) {
    host_->add_problem("operation '" + record->name + "' started nothing (NULL handle)");
    return out;
  }
  out.completed = wait_completed(*record, host_->options_.completion_timeout);
  if (!out.completed) {
    host_->add_problem("operation '" + record->name + "' did not complete in time");
    if (op) op->cancel(op);  // as a host abandoning it would: the plugin's threads can finish
  }
  release_op(op, misbehave);
  std::lock_guard lock(record->mutex);
  out.error = record->error;
  return out;
}

FakeSandbox FakeProvider::create(const CreateRequest& request) {
  auto record = new_record(host_, host_->state_->records, host_->state_->mutex, "create");
  const KvView env(request.env), labels(request.labels);
  sbx_spec spec{};
  spec.struct_size = sizeof spec;
  spec.image = optional_view(request.image);
  spec.ttl_ms = optional_i64(request.ttl_ms);
  spec.ready_timeout_ms = optional_i64(request.ready_timeout_ms);
  spec.workdir = optional_view(request.workdir);
  spec.env = env.list();
  spec.labels = labels.list();
  spec.provider_options =
      request.provider_options.empty() ? sbx_str{nullptr, 0} : view(request.provider_options);
  sbx_create_callbacks cb{sizeof cb, record.get(),
                          misbehave.null_on_complete ? nullptr : &Callbacks::create_done};
  sbx_operation* op = provider_->create(provider_, &spec, &cb);
  const DoneOutcome done = wait_done(record, op);
  std::lock_guard lock(record->mutex);
  if (!done.completed) throw FakeHostError("create did not complete");
  if (record->error || !record->sandbox) {
    throw FakeHostError("create failed: " +
                        (record->error ? record->error->message : "no sandbox and no error"));
  }
  live_.push_back(record->sandbox);
  return FakeSandbox{record->sandbox, copy(record->sandbox->id)};
}

std::optional<ErrorInfo> FakeProvider::create_error(const CreateRequest& request) {
  try {
    FakeSandbox box = create(request);
    release(box);
    return std::nullopt;
  } catch (const FakeHostError&) {
    for (auto it = host_->state_->records.rbegin(); it != host_->state_->records.rend(); ++it) {
      if ((*it)->name == "create") {
        std::lock_guard lock((*it)->mutex);
        return (*it)->error;
      }
    }
    return std::nullopt;
  }
}

namespace {

struct ExecArgs {
  KvView env;
  sbx_exec_request req{};
  ExecArgs(std::string_view command, const ExecOptions& o) : env(o.env) {
    req.struct_size = sizeof req;
    req.command = view(command);
    req.cwd = optional_view(o.cwd);
    req.env = env.list();
    req.timeout_ms = optional_i64(o.timeout_ms);
    req.user = optional_view(o.user);
  }
};

}  // namespace

PendingExec FakeProvider::start_exec(const FakeSandbox& sandbox, std::string_view command,
                                     const ExecOptions& options) {
  auto record = new_record(host_, host_->state_->records, host_->state_->mutex, "exec");
  const ExecArgs args(command, options);
  sbx_exec_callbacks cb{sizeof cb, record.get(), options.stream ? &Callbacks::exec_output : nullptr,
                        misbehave.null_on_complete ? nullptr : &Callbacks::exec_done};
  sbx_operation* op = provider_->exec(provider_, sandbox.raw, &args.req, &cb);
  return PendingExec(host_, record, op, misbehave);
}

sbx_operation* FakeProvider::raw_exec(const FakeSandbox& sandbox, std::string_view command) {
  auto record = new_record(host_, host_->state_->records, host_->state_->mutex, "exec");
  const ExecArgs args(command, ExecOptions{});
  sbx_exec_callbacks cb{sizeof cb, record.get(), &Callbacks::exec_output,
                        misbehave.null_on_complete ? nullptr : &Callbacks::exec_done};
  return provider_->exec(provider_, sandbox.raw, &args.req, &cb);
}

ExecOutcome FakeProvider::exec(const FakeSandbox& sandbox, std::string_view command,
                               const ExecOptions& options) {
  return start_exec(sandbox, command, options).wait();
}

DoneOutcome FakeProvider::upload(const FakeSandbox& sandbox, std::string_view remote_path,
                                 std::string_view contents, uint32_t mode) {
  auto record = new_record(host_, host_->state_->records, host_->state_->mutex, "upload");
  struct Source {
    std::string_view rest;
    static int64_t SBX_ABI read(void* ctx, uint8_t* buffer, size_t capacity) {
      auto* self = static_cast<Source*>(ctx);
      const size_t n = std::min(capacity, self->rest.size());
      std::copy_n(self->rest.data(), n, reinterpret_cast<char*>(buffer));
      self->rest.remove_prefix(n);
      return static_cast<int64_t>(n);
    }
  } source{contents};
  const sbx_input_stream stream{sizeof(sbx_input_stream), &source,
                                static_cast<int64_t>(contents.size()), &Source::read};
  const sbx_upload_request req{sizeof(sbx_upload_request), view(remote_path), &stream, mode};
  sbx_done_callbacks cb{sizeof cb, record.get(),
                        misbehave.null_on_complete ? nullptr : &Callbacks::done};
  // The stream is on this stack frame: wait_done returns only after the completion (or gives up,
  // and then the plugin may still read it: a test that lets an upload hang is broken anyway).
  return wait_done(record, provider_->upload(provider_, sandbox.raw, &req, &cb));
}

DoneOutcome FakeProvider::download(const FakeSandbox& sandbox, std::string_view remote_path,
                                   std::string& contents) {
  auto record = new_record(host_, host_->state_->records, host_->state_->mutex, "download");
  const sbx_output_stream sink{sizeof(sbx_output_stream), record.get(), &Callbacks::sink_write};
  const sbx_download_request req{sizeof(sbx_download_request), view(remote_path), &sink};
  sbx_done_callbacks cb{sizeof cb, record.get(),
                        misbehave.null_on_complete ? nullptr : &Callbacks::done};
  DoneOutcome out = wait_done(record, provider_->download(provider_, sandbox.raw, &req, &cb));
  std::lock_guard lock(record->mutex);
  contents = record->downloaded;
  return out;
}

int32_t FakeProvider::status(const FakeSandbox& sandbox, std::optional<ErrorInfo>* error) {
  auto record = new_record(host_, host_->state_->records, host_->state_->mutex, "status");
  sbx_status_callbacks cb{sizeof cb, record.get(),
                          misbehave.null_on_complete ? nullptr : &Callbacks::status_done};
  const DoneOutcome out = wait_done(record, provider_->status(provider_, sandbox.raw, &cb));
  if (error) *error = out.error;
  std::lock_guard lock(record->mutex);
  return record->status;
}

DoneOutcome FakeProvider::close(const FakeSandbox& sandbox) {
  auto record = new_record(host_, host_->state_->records, host_->state_->mutex, "close");
  sbx_done_callbacks cb{sizeof cb, record.get(),
                        misbehave.null_on_complete ? nullptr : &Callbacks::done};
  return wait_done(record, provider_->close(provider_, sandbox.raw, &cb));
}

void FakeProvider::release(const FakeSandbox& sandbox) {
  std::erase(live_, sandbox.raw);
  provider_->release_sandbox(provider_, sandbox.raw);
}

// ---- PendingExec --------------------------------------------------------------------------------

PendingExec::PendingExec(FakeHost* host, std::shared_ptr<OpRecord> record, sbx_operation* op,
                         Misbehaviour misbehaviour)
    : host_(host), record_(std::move(record)), op_(op), misbehaviour_(misbehaviour) {}

PendingExec::PendingExec(PendingExec&& other) noexcept
    : host_(other.host_),
      record_(std::move(other.record_)),
      op_(std::exchange(other.op_, nullptr)),
      misbehaviour_(other.misbehaviour_) {}

PendingExec& PendingExec::operator=(PendingExec&& other) noexcept {
  if (this != &other) {
    if (op_) op_->release(op_);
    host_ = other.host_;
    record_ = std::move(other.record_);
    op_ = std::exchange(other.op_, nullptr);
    misbehaviour_ = other.misbehaviour_;
  }
  return *this;
}

PendingExec::~PendingExec() {
  if (op_) op_->release(op_);
}

ExecOutcome PendingExec::wait() {
  if (!op_ && !completed()) {
    host_->add_problem("operation 'exec' started nothing (NULL handle)");
    return ExecOutcome{};
  }
  if (!wait_completed(*record_, host_->options_.completion_timeout)) {
    host_->add_problem("operation 'exec' did not complete in time");
    op_->cancel(op_);  // as a host abandoning it would: the plugin's threads can finish
  }
  release_op(std::exchange(op_, nullptr), misbehaviour_);
  std::lock_guard lock(record_->mutex);
  return record_->exec;
}

bool PendingExec::completed() const {
  std::lock_guard lock(record_->mutex);
  return record_->completions > 0;
}

void PendingExec::cancel() {
  if (op_) op_->cancel(op_);
}

std::vector<OutputChunk> PendingExec::chunks() const {
  std::lock_guard lock(record_->mutex);
  return record_->exec.chunks;
}

}  // namespace sbx::sdk::testing
