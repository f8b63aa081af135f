// The table of operations in flight (tokens given to plugins as callback user_data), the deadline
// timer, and the parts of an operation's state that are not about its value. See calls.hpp.

#include "calls.hpp"

#include <sbx/abi/ext/flow.h>
#include <sbx/base/abi_views.hpp>
#include <sbx/base/time.hpp>
#include <sbx/base/utf8.hpp>

#include <spdlog/spdlog.h>

#include <pthread.h>
#include <array>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

namespace sbx::detail {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Tokens -------------------------------------------------------------------------------------
//
// A token is (generation serial << 40) | sequence number: the serial names the plugin even when
// the token is no longer in the table (a second completion). Serial 0 is never used, so no token
// is NULL.

constexpr int kSeqBits = 40;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
constexpr size_t kShards = 16;

class CallTable {
 public:
  void* enroll(std::shared_ptr<CallCtx> ctx) {
    const auto& generation = ctx->op->generation();
    const uint64_t serial = generation->serial;
    generation->operations.fetch_add(1, std::memory_order_relaxed);
    const uint64_t seq = next_.fetch_add(1, std::memory_order_relaxed) & kSeqMask;
    const uint64_t token = (serial << kSeqBits) | seq;
    Shard& shard = shard_of(token);
    std::lock_guard lock(shard.mutex);
    shard.calls.insert_or_assign(token, std::move(ctx));
    return reinterpret_cast<void*>(static_cast<uintptr_t>(token));
  }

  std::shared_ptr<CallCtx> find(void* user_data, CallKind kind, const char* callback, bool take) {
    const auto token = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(user_data));
    std::optional<CallKind> other_kind;
    {
      Shard& shard = shard_of(token);
      std::lock_guard lock(shard.mutex);
      if (auto it = shard.calls.find(token); it != shard.calls.end()) {
        if (it->second->kind == kind) {
          std::shared_ptr<CallCtx> ctx = take ? std::move(it->second) : it->second;
          if (take) {
            shard.calls.erase(it);
            ctx->op->generation()->operations.fetch_sub(1, std::memory_order_relaxed);
          }
          return ctx;
        }
        other_kind = it->second->kind;
      }
    }
    report(token, kind, callback, other_kind);
    return nullptr;
  }

  uint64_t register_generation(std::weak_ptr<Generation> generation, std::string name) {
    std::lock_guard lock(names_mutex_);
    names_.push_back(std::move(name));
    generations_.push_back(std::move(generation));
    return names_.size();  // serials start at 1
  }

  std::shared_ptr<Generation> generation_of(void* user_data) {
    const uint64_t serial =
        static_cast<uint64_t>(reinterpret_cast<uintptr_t>(user_data)) >> kSeqBits;
    std::lock_guard lock(names_mutex_);
    if (serial == 0 || serial > generations_.size()) return nullptr;
    return generations_[serial - 1].lock();
  }

 private:
  struct Shard {
    std::mutex mutex;
    std::unordered_map<uint64_t, std::shared_ptr<CallCtx>> calls;
  };
  Shard& shard_of(uint64_t token) { return shards_[token % kShards]; }

  // A plugin's mistake is logged as an error once per plugin, callback and kind of mistake, then
  // at debug level: a plugin that completes everything twice must not flood the log.
  void report(uint64_t token, CallKind kind, const char* callback,
              std::optional<CallKind> other_kind) {
    const uint64_t serial = token >> kSeqBits;
    std::string who = "an unknown plugin";
    bool first;
    {
      std::lock_guard lock(names_mutex_);
      if (serial >= 1 && serial <= names_.size()) who = names_[serial - 1];
      first = reported_.insert({serial, callback, kind, other_kind.has_value()}).second;
    }
    const std::string what =
        other_kind ? fmt::format("passed the user_data of a {} operation to a {} callback ({})",
                                 call_kind_name(*other_kind), call_kind_name(kind), callback)
                   : fmt::format(
                         "called {} of an operation ({}) that had already completed, "
                         "or that it never started",
                         callback, call_kind_name(kind));
    logger()->log(first ? spdlog::level::err : spdlog::level::debug, "{} {}; the call was ignored",
                  who, what);
  }

  std::array<Shard, kShards> shards_;
  std::atomic<uint64_t> next_{0};
  std::mutex names_mutex_;
  std::deque<std::string> names_;
  std::deque<std::weak_ptr<Generation>> generations_;
  std::set<std::tuple<uint64_t, std::string, CallKind, bool>> reported_;
};

// Never destroyed: plugin threads may call back while the process exits.
CallTable& table() {
  static CallTable* const instance = new CallTable();
  return *instance;
}

// ---- Deadlines ------------------------------------------------------------------------------

std::string seconds_text(std::chrono::milliseconds ms) {
  std::string text = fmt::format("{:.3f}", static_cast<double>(ms.count()) / 1000.0);
  while (text.ends_with('0'))
    text.pop_back();
  if (text.ends_with('.')) text.pop_back();
  return text + " s";
}

// One host thread that wakes at operation deadlines. At a deadline it cancels the operation and
// schedules its abandonment after the cancel grace; at that second point it abandons it if it has
// still not ended. Entries are keyed by time and the operation's timer id, and an operation that
// ends takes its entries out (OpBase::disarm), so the queue holds only operations in flight.
// Never destroyed, like the call table.
class DeadlineTimer {
 public:
  struct Entry {
    std::weak_ptr<OpBase> op;
    std::optional<OpDeadline> deadline;         // set: the deadline itself; unset: the cancel grace
    std::shared_ptr<const Error> abandon_with;  // for the cancel grace
  };

  void schedule(uint64_t id, Clock::time_point at, Entry entry) {
    bool earliest;
    {
      std::lock_guard lock(mutex_);
      const Key key{at, next_key_++};
      // The thread only needs waking when this is due before it wakes anyway. An operation that
      // ends leaves the thread's plan as it was (a wake-up for nothing, later), so a stream of
      // short operations, each due later than the last, costs no wake-up each.
      earliest = at < wakeup_at_;
      queue_.emplace(key, std::move(entry));
      keys_[id].push_back(key);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    if (earliest) wake_.notify_one();  // only an earlier wake-up changes what the thread waits for
  }

  void disarm(uint64_t id) {
    std::lock_guard lock(mutex_);
    auto it = keys_.find(id);
    if (it == keys_.end()) return;
    for (const Key& key : it->second)
      queue_.erase(key);
    keys_.erase(it);
  }

 private:
  using Key = std::pair<Clock::time_point, uint64_t>;

  void run() {
    pthread_setname_np(pthread_self(), "sbx-deadlines");  // one per process, named for a reader
    std::unique_lock lock(mutex_);
    for (;;) {
      const auto now = Clock::now();
      if (wakeup_at_ <= now) wakeup_at_ = Clock::time_point::max();  // that plan is done
      if (!queue_.empty()) wakeup_at_ = std::min(wakeup_at_, queue_.begin()->first.first);
      if (queue_.empty() || now < queue_.begin()->first.first) {
        if (wakeup_at_ == Clock::time_point::max()) {
          wake_.wait(lock);
        } else {
          wake_.wait_until(lock, wakeup_at_);
        }
        continue;
      }
      auto node = queue_.extract(queue_.begin());
      lock.unlock();
      try {
        fire(node.mapped());
      } catch (const std::exception& e) {  // out of memory for a message; keep the timer alive
        logger()->error("deadline timer: {}", e.what());
      }
      lock.lock();
    }
  }

  void fire(Entry& entry) {
    const std::shared_ptr<OpBase> op = entry.op.lock();
    if (!op || op->ready()) return;
    if (!entry.deadline) {
      op->abandon(*entry.abandon_with);
      return;
    }
    const OpDeadline& d = *entry.deadline;
    if (d.from == OpDeadline::From::progress) {
      const Clock::time_point due = op->last_progress() + *d.after;
      if (Clock::now() < due) {  // it moved since: wait for the next quiet period
        schedule(op->timer_id(), due, std::move(entry));
        return;
      }
    }
    const Generation& g = *op->generation();
    const std::chrono::milliseconds grace = g.deadlines.cancel_grace();
    logger()->warn("{} did not complete the {} within {} ({}); cancelling it", describe(g),
                   op->kind(), seconds_text(*d.after), d.why);
    auto error = std::make_shared<const TimeoutError>(
        fmt::format("{} did not complete the {} within {} ({}), nor within {} of being cancelled; "
                    "the host abandoned it",
                    describe(g), op->kind(), seconds_text(*d.after), d.why, seconds_text(grace)));
    op->request_cancel();
    schedule(op->timer_id(), Clock::now() + grace, {op, std::nullopt, std::move(error)});
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  // When the thread wakes next (max: only when notified); schedule() notifies for earlier ones.
  Clock::time_point wakeup_at_ = Clock::time_point::max();
  std::map<Key, Entry> queue_;
  std::unordered_map<uint64_t, std::vector<Key>> keys_;  // by operation timer id
  uint64_t next_key_ = 0;
  std::thread thread_;
};

DeadlineTimer& timer() {
  static DeadlineTimer* const instance = new DeadlineTimer();
  return *instance;
}

}  // namespace

// ---- Public parts ----------------------------------------------------------------------------

const char* call_kind_name(CallKind kind) noexcept {
  switch (kind) {
    case CallKind::create:
      return "create";
    case CallKind::exec:
      return "exec";
    case CallKind::upload:
      return "upload";
    case CallKind::download:
      return "download";
    case CallKind::status:
      return "status";
    case CallKind::close:
      return "close";
    case CallKind::endpoint:
      return "endpoint";
    case CallKind::list:
      return "list";
    case CallKind::reap:
      return "reap";
    case CallKind::pause:
      return "pause";
    case CallKind::resume:
      return "resume";
    case CallKind::serialize:
      return "serialize";
    case CallKind::connect:
      return "connect";
    case CallKind::renew:
      return "renew";
    case CallKind::session_open:
      return "open_session";
    case CallKind::session_close:
      return "close_session";
    case CallKind::pty_open:
      return "open_pty";
    case CallKind::pty_attach:
      return "attach_pty";
    case CallKind::pty_write:
      return "write_pty";
    case CallKind::pty_resize:
      return "resize_pty";
    case CallKind::pty_close:
      return "close_pty";
  }
  return "operation";
}

uint64_t register_generation(const std::shared_ptr<Generation>& generation) {
  return table().register_generation(generation, describe(*generation));
}

std::string describe(const Generation& g) {
  return "provider '" + g.name + "' (plugin " + g.plugin_path + ")";
}

Error plugin_error(const Generation& g, const sbx_error* error, const char* call) {
  if (!error) {
    return InternalError(describe(g) + " ended a " + call + " with neither a result nor an error");
  }
  // Every field of ABI 1.0 is read below.
  if (!SBX_HAS_FIELD(error, sbx_error, request_id)) {
    return InternalError(fmt::format(
        "{} ended the {} with an error in an sbx_error of {} bytes; ABI 1.0 "
        "defines {}",
        describe(g), call, error->struct_size, offsetof(sbx_error, request_id) + sizeof(sbx_str)));
  }
  Error e(error->status == SBX_STATUS_OK ? SBX_STATUS_INTERNAL : error->status,
          base::utf8::sanitize(base::copy_of(error->message)), error->retryable, error->http_status,
          base::utf8::sanitize(base::copy_of(error->request_id)));
  e.set_reason(reason_of(*error));  // ABI 1.2's, when the plugin's struct has it
  return e;
}

}  // namespace sbx::detail

namespace sbx {

std::chrono::milliseconds Deadlines::ms(double seconds) {
  return base::seconds_to_ms(seconds);
}

void Deadlines::validate() const {
  const std::pair<const char*, double> values[] = {
      {"grace_s", grace_s}, {"cancel_grace_s", cancel_grace_s},   {"create_s", create_s},
      {"exec_s", exec_s},   {"transfer_idle_s", transfer_idle_s}, {"call_s", call_s}};
  for (const auto& [name, value] : values) {
    if (!(value > 0)) {
      throw InvalidArgumentError(fmt::format("deadlines.{} must be > 0, got {}", name, value));
    }
  }
}

}  // namespace sbx

namespace sbx::detail {

namespace calls {

void* enroll(std::shared_ptr<CallCtx> ctx) {
  return table().enroll(std::move(ctx));
}

std::shared_ptr<CallCtx> find_any(void* token, CallKind kind, const char* callback) {
  return table().find(token, kind, callback, false);
}

std::shared_ptr<CallCtx> complete_any(void* token, CallKind kind, const char* callback) {
  return table().find(token, kind, callback, true);
}

std::shared_ptr<Generation> generation_of(void* token) {
  return table().generation_of(token);
}

bool late(const CallCtx& ctx) {
  if (!ctx.op->abandoned()) return false;
  logger()->warn("{} completed the {} after the host had abandoned it; the outcome was dropped",
                 describe(*ctx.op->generation()), ctx.op->kind());
  return true;
}

void arm(const std::shared_ptr<OpBase>& op, const OpDeadline& deadline) {
  if (!deadline.after || op->ready()) return;
  op->touch();
  timer().schedule(op->arm_timer(), Clock::now() + *deadline.after, {op, deadline, nullptr});
  if (op->ready()) op->disarm();  // it completed while being armed
}

void abandon_after_cancel(const std::shared_ptr<OpBase>& op) {
  const Generation& g = *op->generation();
  const std::chrono::milliseconds grace = g.deadlines.cancel_grace();
  auto error = std::make_shared<const CancelledError>(fmt::format(
      "cancelled; {} did not end the {} within {} of being cancelled, so the host abandoned it",
      describe(g), op->kind(), seconds_text(grace)));
  timer().schedule(op->arm_timer(), Clock::now() + grace, {op, std::nullopt, std::move(error)});
  if (op->ready()) op->disarm();
}

}  // namespace calls

// ---- OpBase -----------------------------------------------------------------------------------

OpBase::OpBase(std::shared_ptr<Generation> generation, const char* kind)
    : generation_(std::move(generation)), kind_(kind) {}

OpBase::~OpBase() {
  disarm();
  if (handle_) handle_->release(handle_);
}

uint64_t OpBase::arm_timer() {
  static std::atomic<uint64_t> next_id{1};
  uint64_t id = timer_id_.load();
  if (id == 0) {
    uint64_t fresh = next_id.fetch_add(1);
    id = timer_id_.compare_exchange_strong(id, fresh) ? fresh : id;
  }
  return id;
}

void OpBase::disarm() noexcept {
  if (const uint64_t id = timer_id_.load(); id != 0) timer().disarm(id);
}

void OpBase::attach(sbx_operation* handle) {
  // A handle smaller than ABI 1.0 cannot be cancelled or released safely: it is left alone (and
  // leaks), and the operation can only end by completing or by the host abandoning it.
  if (handle &&
      (!SBX_HAS_FIELD(handle, sbx_operation, release) || !handle->cancel || !handle->release)) {
    logger()->error(
        "{} returned an sbx_operation handle of {} bytes or without cancel/release "
        "for a {}; it cannot be cancelled",
        describe(*generation_), handle->struct_size, kind_);
    handle = nullptr;
  }
  bool cancel_now;
  std::optional<bool> hold;
  {
    std::lock_guard lock(mutex_);
    handle_ = handle;
    cancel_now = cancel_requested_ && handle_ && !done_;
    if (handle_ && !done_) hold = hold_;
  }
  if (hold) hold_output(*hold);
  if (cancel_now) handle_->cancel(handle_);
}

bool OpBase::hold_output(bool hold) {
  sbx_operation* handle;
  {
    std::lock_guard lock(mutex_);
    if (done_) return true;
    hold_ = hold;
    handle = handle_;
  }
  const auto* flow = static_cast<const sbx_provider_flow*>(generation_->extension(SBX_EXT_FLOW));
  if (!flow || flow->struct_size < offsetof(sbx_provider_flow, hold_output) + sizeof(void*) ||
      !flow->hold_output) {
    return false;
  }
  if (!handle) return true;  // applied at attach
  // Not under the lock: the plugin may deliver output or complete from inside it.
  return flow->hold_output(generation_->provider, handle, hold);
}

bool OpBase::request_cancel() {
  sbx_operation* handle;
  {
    std::lock_guard lock(mutex_);
    if (done_) return false;
    cancel_requested_ = true;
    handle = handle_;
  }
  // Not under the lock: a plugin may complete the operation from inside cancel().
  if (handle) handle->cancel(handle);
  return true;
}

void OpBase::cancel() {
  bool first;
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    first = !cancel_grace_armed_;
    cancel_grace_armed_ = true;
  }
  if (!request_cancel()) return;
  if (first && !ready()) calls::abandon_after_cancel(shared_from_this());
}

bool OpBase::abandon(const Error& error) {
  {
    std::lock_guard lock(mutex_);
    if (done_ || abandoned_.load()) return false;
    abandoned_.store(true);  // from here on the plugin's completion is dropped (calls::late)
  }
  // Before the caller hears of it: what the host lent the plugin is taken back first.
  if (abandon_hook_) abandon_hook_();
  if (!finish([&] { store_error(error); })) return false;  // it completed meanwhile
  logger()->warn("{}", error.what());
  return true;
}

void OpBase::touch() noexcept {
  last_progress_ns_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(),
      std::memory_order_relaxed);
}

std::chrono::steady_clock::time_point OpBase::last_progress() const noexcept {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(last_progress_ns_.load(std::memory_order_relaxed))));
}

bool OpBase::ready() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void OpBase::wait() const {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
}

void OpBase::then(std::function<void()> fn) {
  {
    std::lock_guard lock(mutex_);
    if (!done_) {
      continuations_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

}  // namespace sbx::detail
