// The graceful stop's bookkeeping (stop_gate.hpp).

#include "stop_gate.hpp"

namespace sbx::serve {

bool StopGate::finish_due_locked() {
  // Finished: stopping, and no create, close or unanswered request left. Running commands are
  // not counted here: the stop's drain (server.cpp) gives them the grace period, then closes their
  // sandboxes, which cancels them.
  if (!stopping_ || finished_ || creating_ != 0 || closing_ != 0 || answering_ != 0) return false;
  finished_ = true;
  return true;
}

void StopGate::finish_if_due_locked(std::unique_lock<std::mutex>& lock) {
  if (!finish_due_locked()) return;
  lock.unlock();
  on_finished_();
}

void StopGate::enter_request() {
  std::lock_guard lock(mutex_);
  ++answering_;
}

void StopGate::leave_request() {
  std::unique_lock lock(mutex_);
  --answering_;
  finish_if_due_locked(lock);
}

void StopGate::begin_close() {
  std::lock_guard lock(mutex_);
  ++closing_;
}

void StopGate::end_close() {
  std::unique_lock lock(mutex_);
  --closing_;
  finish_if_due_locked(lock);
}

bool StopGate::begin_create() {
  std::lock_guard lock(mutex_);
  if (stopping_) return false;
  ++creating_;
  return true;
}

void StopGate::end_create(bool then_closing) {
  std::unique_lock lock(mutex_);
  --creating_;
  if (then_closing) ++closing_;
  finish_if_due_locked(lock);
}

StopGate::StreamAdmit StopGate::try_open_stream(std::size_t max_streams, bool command) {
  std::lock_guard lock(mutex_);
  if (stopping_) return StreamAdmit::stopping;
  if (max_streams > 0 && static_cast<std::size_t>(open_streams_) >= max_streams) {
    return StreamAdmit::full;
  }
  ++open_streams_;
  if (command) ++running_commands_;
  return StreamAdmit::ok;
}

void StopGate::close_stream() {
  std::lock_guard lock(mutex_);
  --open_streams_;
}

void StopGate::command_ended() {
  std::unique_lock lock(mutex_);
  --running_commands_;
  finish_if_due_locked(lock);
}

int StopGate::running_commands() const {
  std::lock_guard lock(mutex_);
  return running_commands_;
}

int StopGate::open_streams() const {
  std::lock_guard lock(mutex_);
  return open_streams_;
}

bool StopGate::stop(int closing) {
  std::lock_guard lock(mutex_);
  if (stopping_) return false;
  stopping_ = true;
  closing_ += closing;
  return true;
}

bool StopGate::stopping() const {
  std::lock_guard lock(mutex_);
  return stopping_;
}

void StopGate::finish_if_done() {
  std::unique_lock lock(mutex_);
  finish_if_due_locked(lock);
}

std::optional<StopGate::Left> StopGate::give_up() {
  std::lock_guard lock(mutex_);
  if (finished_) return std::nullopt;
  finished_ = true;
  all_closed_ = false;
  return Left{closing_, creating_};
}

bool StopGate::all_closed() const {
  std::lock_guard lock(mutex_);
  return all_closed_;
}

}  // namespace sbx::serve
