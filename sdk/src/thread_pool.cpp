#include <sbx/sdk/thread_pool.hpp>

#include <algorithm>
#include <exception>

namespace sbx::sdk {

ThreadPool::ThreadPool(Options options) : options_(options) {
  options_.max_threads = std::max<size_t>(1, options_.max_threads);
}

ThreadPool::~ThreadPool() {
  std::list<Worker> workers;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  {
    // Workers drain the queue before exiting; wait until each has exited, then join outside the
    // lock. Moving the list is safe: a worker only touches its own node through `self`.
    std::unique_lock lock(mutex_);
    workers.splice(workers.end(), workers_);
  }
  for (Worker& w : workers)
    w.thread.join();
}

void ThreadPool::reap_finished_locked(std::list<Worker>& out) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    auto next = std::next(it);
    if (it->finished) out.splice(out.end(), workers_, it);
    it = next;
  }
}

void ThreadPool::submit(Task task) {
  std::list<Worker> finished;
  std::exception_ptr no_thread;
  Task unrun;
  {
    std::lock_guard lock(mutex_);
    reap_finished_locked(finished);
    queue_.push_back(std::move(task));
    // An idle worker counts as idle until it wakes up, so compare with the queue: more tasks than
    // idle workers means one of them would wait for a busy worker (maybe one blocked for long).
    if (idle_ > 0) wake_.notify_one();
    if (queue_.size() > idle_ && workers_.size() < options_.max_threads) {
      auto it = workers_.emplace(workers_.end());
      try {
        it->thread = std::thread([this, it] { run_worker(it); });
      } catch (...) {
        // No new thread (e.g. EAGAIN at the process's thread limit). A live worker will get to the
        // task later; with none, the task leaves the queue and the caller gets the error.
        workers_.erase(it);
        if (workers_.empty()) {
          no_thread = std::current_exception();
          unrun = std::move(queue_.back());
          queue_.pop_back();
        }
      }
    }
  }
  for (Worker& w : finished)
    w.thread.join();  // already exited; joining is immediate
  if (no_thread) {
    unrun = Task();  // destroyed here, outside the lock, before the caller hears of the failure
    std::rethrow_exception(no_thread);
  }
}

void ThreadPool::run_worker(std::list<Worker>::iterator self) {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (!queue_.empty()) {
      Task task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      task = Task();  // destroy captures before taking the lock again
      lock.lock();
      continue;
    }
    if (stopping_) break;
    ++idle_;
    const bool woke = wake_.wait_for(lock, options_.idle_timeout,
                                     [this] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (!woke) break;  // idle for too long
  }
  self->finished = true;
}

size_t ThreadPool::thread_count() const {
  std::lock_guard lock(mutex_);
  return static_cast<size_t>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.finished; }));
}

bool ThreadPool::on_pool_thread() const {
  std::lock_guard lock(mutex_);
  const auto me = std::this_thread::get_id();
  return std::any_of(workers_.begin(), workers_.end(),
                     [&](const Worker& w) { return w.thread.get_id() == me; });
}

}  // namespace sbx::sdk
