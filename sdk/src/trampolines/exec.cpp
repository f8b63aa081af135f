// The exec operation: the command's output streamed to the host in order, one call at a time, and
// its completion after the last chunk. Also sbx.session/1's run, which completes as an exec.

#include "ordered_op.hpp"

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace sbx::sdk::detail {
namespace {

// Output streamed in order through OrderedOp (ordered_op.hpp), or accumulated for the result when
// the host did not ask for streaming. Its output can be held (sbx.flow/1) the way the provider
// said (ExecFlow): by its handler, or by writes that wait while held.
class ExecOp final : public OrderedOp<ExitStatus, std::pair<StdStream, std::string>>,
                     public OutputSink,
                     public ExecFlow {
 public:
  explicit ExecOp(const sbx_exec_callbacks* cb) : cb_(*cb) {}

  void write(StdStream stream, std::string_view bytes) override {
    if (bytes.empty()) return;
    if (cb_.on_output) {
      wait_while_held();
      return emit({stream, std::string(bytes)});
    }
    std::lock_guard lock(collected_mutex_);
    if (claimed()) return;  // output after completion is dropped, never delivered late
    (stream == StdStream::err ? stderr_ : stdout_).append(bytes);
  }

  bool hold_output(bool hold) noexcept override {
    std::function<void(bool)> handler;
    {
      std::lock_guard lock(flow_mutex_);
      held_ = hold;
      if (claimed()) return true;
      if (!handler_ && !blocking_) return false;
      handler = handler_;
    }
    flow_cv_.notify_all();
    if (!handler) return true;
    try {
      handler(hold);
      return true;
    } catch (...) {
      return false;
    }
  }

  void set_hold_handler(std::function<void(bool)> fn) override {
    bool held = false;
    {
      std::lock_guard lock(flow_mutex_);
      handler_ = fn;
      held = held_;
    }
    if (held && fn) fn(true);  // the host held it before the provider could say how
  }
  void set_blocking_hold() override {
    std::lock_guard lock(flow_mutex_);
    blocking_ = true;
  }

 private:
  // A provider that writes from a thread of its own: the write waits while the host holds the
  // output, until released, cancelled or completed.
  void wait_while_held() {
    if (!WritesMayWait::here()) return;  // never on a thread that serves others (an event loop)
    std::unique_lock lock(flow_mutex_);
    if (!blocking_ || !held_) return;
    flow_cv_.wait(lock, token(), [&] { return !held_ || claimed(); });
  }

  void emit_chunk(const std::pair<StdStream, std::string>& chunk) noexcept override {
    cb_.on_output(cb_.user_data, static_cast<int32_t>(chunk.first), to_bytes(chunk.second));
  }
  void complete_value(const ExitStatus& status) noexcept override {
    release_writers();
    std::lock_guard lock(collected_mutex_);  // a late write() may still be appending
    const sbx_exec_result result{
        sizeof(sbx_exec_result), status.return_code,
        status.error_type ? to_sbx(*status.error_type) : sbx_str{nullptr, 0}, to_bytes(stdout_),
        to_bytes(stderr_)};
    cb_.on_complete(cb_.user_data, &result, nullptr);
  }
  void complete_error(const Error& error) noexcept override {
    release_writers();
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, e); });
  }
  void release_writers() noexcept {
    { std::lock_guard lock(flow_mutex_); }
    flow_cv_.notify_all();
  }

  sbx_exec_callbacks cb_;
  std::mutex collected_mutex_;
  std::string stdout_;  // accumulated when the host did not ask for streaming
  std::string stderr_;
  std::mutex flow_mutex_;
  std::condition_variable_any flow_cv_;
  bool held_ = false;
  bool blocking_ = false;
  std::function<void(bool)> handler_;
};

ExecCompletion make_completion(ExecOp* op) {
  return ExecCompletion(op, op, op);
}

}  // namespace

sbx_operation* SBX_ABI provider_exec(sbx_provider* p, sbx_sandbox* s, const sbx_exec_request* req,
                                     const sbx_exec_callbacks* cb) {
  return start_operation<ExecOp>(p, "exec", cb, [&](ExecOp&, ExecCompletion done) {
    Sandbox& sandbox = sandbox_of(p, s);
    if (!req) throw Error::invalid_argument("exec needs a request");
    ExecRequest copy = to_exec_request(*req);
    impl_of(p).exec(sandbox, std::move(copy), std::move(done));
  });
}

sbx_operation* SBX_ABI session_run(sbx_provider* p, sbx_sandbox* s, sbx_str session_id,
                                   const sbx_exec_request* req, const sbx_exec_callbacks* cb) {
  return start_operation<ExecOp>(p, "sbx.session/1 run", cb, [&](ExecOp&, ExecCompletion done) {
    Sandbox& sandbox = sandbox_of(p, s);
    std::string id = session_id_of(session_id);
    if (!req) throw Error::invalid_argument("a session run needs a request");
    ExecRequest copy = to_exec_request(*req);
    copy.user.reset();  // the session's user runs it (ext/session.h)
    session_of(p).run_in_session(sandbox, std::move(id), std::move(copy), std::move(done));
  });
}

}  // namespace sbx::sdk::detail
