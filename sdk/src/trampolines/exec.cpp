// The exec operation: the command's output streamed to the host in order, one call at a time, and
// its completion after the last chunk.

#include "internal.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>

namespace sbx::sdk::detail {
namespace {

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

ExecCompletion make_completion(ExecOp* op) {
  return ExecCompletion(op, op);
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

}  // namespace sbx::sdk::detail
