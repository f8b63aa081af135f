#include "diagnosis.hpp"

#include <algorithm>
#include <memory>
#include <regex>

namespace sbx::opensandbox {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool says_out_of_memory(const std::string& text) {
  static const std::regex kOom(R"(\boom[\s_-]*killed\b|\bout of memory\b)", std::regex::icase);
  return std::regex_search(text, kOom);
}

// One diagnosis: reads the status until an answer decides, a read fails or the budget is spent.
struct Diagnosis : std::enable_shared_from_this<Diagnosis> {
  LifecycleClient& lifecycle;
  std::string sandbox_id;
  sdk::Error original;
  std::function<void(const sdk::Error&)> done;
  sdk::CancelToken cancel;
  Clock::time_point deadline;

  Diagnosis(LifecycleClient& l, std::string id, sdk::Error e,
            std::function<void(const sdk::Error&)> d, sdk::CancelToken c, Clock::time_point until)
      : lifecycle(l),
        sandbox_id(std::move(id)),
        original(std::move(e)),
        done(std::move(d)),
        cancel(std::move(c)),
        deadline(until) {}

  std::chrono::milliseconds left() const {
    return std::max(0ms,
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  }

  void read() {
    lifecycle.status_async(
        sandbox_id, std::min<std::chrono::milliseconds>(2s, left()),
        [self = shared_from_this()](const SandboxStatusInfo* status, const sdk::Error*) {
          self->on_status(status);
        });
  }

  void on_status(const SandboxStatusInfo* status) {
    if (cancel.stop_requested()) return done(sdk::Error::cancelled());
    if (!status) return done(original);  // the read failed: nothing more to learn
    if (auto oom = oom_error(*status, sandbox_id)) return done(*oom);
    const std::string state = status->state;
    const bool ended = state == "Failed" || state == "Terminated" || state == "Stopped" ||
                       state == "failed" || state == "terminated" || state == "stopped";
    if ((ended && !status->message.empty()) || left() <= 0ms) return done(original);
    lifecycle.after(std::min<std::chrono::milliseconds>(500ms, left()),
                    [self = shared_from_this()] { self->read(); });
  }
};

}  // namespace

bool is_backend_502(const sdk::Error& error) {
  return error.http_status() == 502;
}

std::optional<sdk::Error> oom_error(const SandboxStatusInfo& status,
                                    const std::string& sandbox_id) {
  if (!says_out_of_memory(status.reason + " " + status.message)) return std::nullopt;
  return sdk::Error(SBX_STATUS_UNAVAILABLE,
                    "Sandbox was OOM-killed. OpenSandbox status: state='" + status.state +
                        "', reason='" + status.reason + "', message='" +
                        status.message.substr(0, 500) + "'; sandbox_id=" + sandbox_id,
                    sdk::ErrorDetails{.retryable = false, .http_status = 502});
}

void diagnose_after_502(LifecycleClient& lifecycle, const std::string& sandbox_id,
                        sdk::Error original, std::function<void(const sdk::Error&)> done,
                        sdk::CancelToken cancel, std::chrono::milliseconds budget) {
  std::make_shared<Diagnosis>(lifecycle, sandbox_id, std::move(original), std::move(done),
                              std::move(cancel), Clock::now() + budget)
      ->read();
}

}  // namespace sbx::opensandbox
