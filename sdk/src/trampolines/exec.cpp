// The exec operation: the command's output streamed to the host in order, one call at a time, and
// its completion after the last chunk. Also sbx.session/1's run, which completes as an exec.

#include "ordered_op.hpp"

#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace sbx::sdk::detail {
namespace {

// Output streamed in order through OrderedOp (ordered_op.hpp), or accumulated for the result when
// the host did not ask for streaming. Its output can be held (sbx.flow/1) the way the provider
// said (OutputFlow): by its handler, or by writes that wait while held.
class ExecOp final : public OrderedOp<ExitStatus, std::pair<StdStream, std::string>>,
                     public OutputSink {
 public:
  explicit ExecOp(const sbx_exec_callbacks* cb) : cb_(*cb) {}

  void write(StdStream stream, std::string_view bytes) override {
    if (bytes.empty()) return;
    if (cb_.on_output) {
      flow.wait_while_held(*this);
      return emit({stream, std::string(bytes)});
    }
    std::lock_guard lock(collected_mutex_);
    if (claimed()) return;  // output after completion is dropped, never delivered late
    (stream == StdStream::err ? stderr_ : stdout_).append(bytes);
  }

  bool hold_output(bool hold) noexcept override { return flow.hold(*this, hold); }

  OutputFlow flow;

 private:
  void emit_chunk(const std::pair<StdStream, std::string>& chunk) noexcept override {
    cb_.on_output(cb_.user_data, static_cast<int32_t>(chunk.first), to_bytes(chunk.second));
  }
  void complete_value(const ExitStatus& status) noexcept override {
    flow.release_writers();
    std::lock_guard lock(collected_mutex_);  // a late write() may still be appending
    const sbx_exec_result result{
        sizeof(sbx_exec_result), status.return_code,
        status.error_type ? to_sbx(*status.error_type) : sbx_str{nullptr, 0}, to_bytes(stdout_),
        to_bytes(stderr_)};
    cb_.on_complete(cb_.user_data, &result, nullptr);
  }
  void complete_error(const Error& error) noexcept override {
    flow.release_writers();
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, e); });
  }

  sbx_exec_callbacks cb_;
  std::mutex collected_mutex_;
  std::string stdout_;  // accumulated when the host did not ask for streaming
  std::string stderr_;
};

ExecCompletion make_completion(ExecOp* op) {
  return ExecCompletion(op, op, &op->flow);
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
