// A helper script the server runs in a sandbox and reads whole (stat for /files/info, find for a
// listing, the reads of /metrics, chown): its output kept up to a bound. What runs in a
// sandbox is the sandbox's (its root may have replaced stat or find with anything), so a script
// that prints more than the bound is stopped and its call fails, instead of the server keeping
// whatever it prints.
//
// THREADING: start on any thread; the continuation runs on the plugin thread that ends the exec
// (or at once, if it has ended). OWNERSHIP: shared by the caller and the exec's output callback.
#pragma once

#include <sbx/core/sandbox.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace sbx::serve {

class KeptExec : public std::enable_shared_from_this<KeptExec> {
 public:
  // Starts `script` (Sandbox::exec_async, whose errors it throws) with its stdout and stderr kept
  // here, `limit` bytes of the two together at most.
  static std::shared_ptr<KeptExec> start(sbx::Sandbox& box, std::string script,
                                         sbx::ExecOptions options, std::size_t limit);

  // The exec, to cancel it.
  sbx::Operation<sbx::ExecResult> operation() const { return op_; }

  // Runs `fn` once the script ended, with this.
  void then(std::function<void(KeptExec&)> fn);

  // In then(): the result, with the output kept; or throws what ended the exec, or
  // ResourceExhaustedError when the script printed past the bound (it was cancelled). Once.
  sbx::ExecResult get();

  explicit KeptExec(std::size_t limit) : limit_(limit) {}

 private:
  void keep(sbx::OutputStream stream, std::string_view bytes);

  const std::size_t limit_;
  std::mutex mutex_;
  std::string out_, err_;
  bool over_ = false;
  sbx::Operation<sbx::ExecResult> op_;
};

}  // namespace sbx::serve
