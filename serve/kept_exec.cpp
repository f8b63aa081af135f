// KeptExec (kept_exec.hpp): a helper script's output, kept up to a bound.

#include "kept_exec.hpp"

#include <sbx/core/errors.hpp>

namespace sbx::serve {

std::shared_ptr<KeptExec> KeptExec::start(sbx::Sandbox& box, std::string script,
                                          sbx::ExecOptions options, std::size_t limit) {
  auto self = std::make_shared<KeptExec>(limit);
  options.on_output = [weak = std::weak_ptr<KeptExec>(self)](sbx::OutputStream stream,
                                                             std::string_view bytes) {
    if (auto s = weak.lock()) s->keep(stream, bytes);
  };
  auto op = box.exec_async(std::move(script), std::move(options));
  bool over = false;
  {
    std::lock_guard lock(self->mutex_);
    self->op_ = op;
    over = self->over_;
  }
  if (over) op.cancel();  // past the bound before the operation was kept
  return self;
}

void KeptExec::keep(sbx::OutputStream stream, std::string_view bytes) {
  sbx::Operation<sbx::ExecResult> stop;
  {
    std::lock_guard lock(mutex_);
    if (over_) return;
    if (out_.size() + err_.size() + bytes.size() > limit_) {
      over_ = true;
      out_.clear();
      err_.clear();
      stop = op_;
    } else {
      (stream == sbx::OutputStream::out ? out_ : err_).append(bytes);
    }
  }
  if (stop.valid()) stop.cancel();
}

void KeptExec::then(std::function<void(KeptExec&)> fn) {
  op_.then([self = shared_from_this(), fn = std::move(fn)](sbx::Operation<sbx::ExecResult>&) {
    fn(*self);
  });
}

sbx::ExecResult KeptExec::get() {
  std::lock_guard lock(mutex_);
  if (over_) {
    throw sbx::ResourceExhaustedError(
        "the command the server ran in the sandbox printed more than " + std::to_string(limit_) +
        " bytes; it was stopped (are the sandbox's tools its own?)");
  }
  sbx::ExecResult result = op_.get();
  result.stdout_text = std::move(out_);
  result.stderr_text = std::move(err_);
  return result;
}

}  // namespace sbx::serve
