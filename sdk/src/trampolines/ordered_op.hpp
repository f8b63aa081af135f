// An operation that streams chunks to the host before its completion: exec's output (exec.cpp)
// and a terminal attachment's (terminals.cpp). Chunks and the completion reach the host one call
// at a time and in order, without a lock of ours held during the call (a host may cancel from
// inside a chunk's callback, and cancelling may run the provider's stop callbacks, which may write
// or complete on this very thread). A chunk or completion made re-entrantly from inside our own
// callback is queued and delivered when that call returns.
#pragma once

#include "internal.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>

namespace sbx::sdk::detail {

// T: the operation's value; Chunk: what one output call carries. A subclass says how a chunk and
// each outcome reach the host (emit_chunk, complete_value, complete_error), all noexcept and
// called without our lock.
template <class T, class Chunk>
class OrderedOp : public Op<T> {
 public:
  void deliver_value(T&& value) noexcept override {
    if (wait_for_turn(Outcome(std::in_place_index<0>, std::move(value)))) complete_value(value_);
  }
  void deliver_error(const Error& error) noexcept override {
    if (wait_for_turn(Outcome(std::in_place_index<1>, error))) complete_error(error);
  }

 protected:
  // Delivers one chunk in its turn; dropped once the operation is claimed (never late).
  void emit(Chunk chunk) {
    std::unique_lock lock(mutex_);
    if (this->completed()) return;
    if (delivering_ && deliverer_ == std::this_thread::get_id()) {
      queued_.push_back(std::move(chunk));
      return;
    }
    turn_.wait(lock, [&] { return !delivering_; });
    if (this->completed()) return;
    delivering_ = true;
    deliverer_ = std::this_thread::get_id();
    lock.unlock();
    emit_chunk(chunk);
    lock.lock();
    end_turn(lock);
  }
  bool claimed() const noexcept { return this->completed(); }

  virtual void emit_chunk(const Chunk& chunk) noexcept = 0;
  virtual void complete_value(const T& value) noexcept = 0;
  virtual void complete_error(const Error& error) noexcept = 0;

 private:
  using Outcome = std::variant<T, Error>;

  // With the lock held after a chunk's call returned: delivers what was queued meanwhile, then
  // hands the turn on (and the completion, if it arrived re-entrantly).
  void end_turn(std::unique_lock<std::mutex>& lock) noexcept {
    while (!queued_.empty()) {
      const Chunk chunk = std::move(queued_.front());
      queued_.pop_front();
      lock.unlock();
      emit_chunk(chunk);
      lock.lock();
    }
    delivering_ = false;
    std::optional<Outcome> outcome = std::exchange(parked_, std::nullopt);
    lock.unlock();
    turn_.notify_all();
    if (!outcome) return;
    if (outcome->index() == 0) {
      value_ = std::get<0>(std::move(*outcome));
      complete_value(value_);
    } else {
      complete_error(std::get<1>(*outcome));
    }
  }
  // The operation is claimed, so no new chunk starts. Returns false when the outcome was parked
  // for the chunk's call this thread is inside of; true (with a value kept in value_) otherwise.
  bool wait_for_turn(Outcome&& outcome) noexcept {
    std::unique_lock lock(mutex_);
    if (delivering_ && deliverer_ == std::this_thread::get_id()) {
      try {
        parked_.emplace(std::move(outcome));
      } catch (...) {
        parked_.emplace(std::in_place_index<1>,
                        Error(SBX_STATUS_RESOURCE_EXHAUSTED, "out of memory"));
      }
      return false;
    }
    turn_.wait(lock, [&] { return !delivering_; });
    if (outcome.index() == 0) value_ = std::get<0>(std::move(outcome));
    return true;
  }

  std::mutex mutex_;
  std::condition_variable turn_;
  bool delivering_ = false;  // a chunk's call is in progress
  std::thread::id deliverer_;
  std::deque<Chunk> queued_;
  std::optional<Outcome> parked_;
  T value_{};
};

}  // namespace sbx::sdk::detail
