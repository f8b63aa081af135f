// Services the host passes to plugins (logging into spdlog, a monotonic clock), the callback scope
// marker, and deferred destruction.

#include "internal.hpp"

#include <sbx/core/detail/op_state.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <pthread.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace sbx::detail {
namespace {

thread_local int g_callback_depth = 0;
// Plugin callbacks running now, on every thread: what the janitor waits for at exit.
std::atomic<int> g_callbacks_running{0};

spdlog::level::level_enum to_spdlog(int32_t level) {
  switch (level) {
    case SBX_LOG_TRACE:
      return spdlog::level::trace;
    case SBX_LOG_DEBUG:
      return spdlog::level::debug;
    case SBX_LOG_INFO:
      return spdlog::level::info;
    case SBX_LOG_WARN:
      return spdlog::level::warn;
    default:
      return spdlog::level::err;
  }
}

spdlog::logger& logger_of(const sbx_host* host) {
  return **static_cast<std::shared_ptr<spdlog::logger>*>(host->host_data);
}

// A plugin's line below the logger's level (--log-level, SBX_LOG_LEVEL) is dropped here, also
// when the plugin did not ask log_enabled first.
void SBX_ABI host_log(const sbx_host* host, int32_t level, sbx_str message) {
  auto& logger = logger_of(host);
  if (!logger.should_log(to_spdlog(level))) return;
  logger.log(to_spdlog(level), "{}",
             std::string_view(message.data ? message.data : "", message.len));
}

bool SBX_ABI host_log_enabled(const sbx_host* host, int32_t level) {
  return logger_of(host).should_log(to_spdlog(level));
}

int64_t SBX_ABI host_now_ns(const sbx_host*) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const void* SBX_ABI host_get_extension(const sbx_host*, const char*) {
  return nullptr;
}

// One host thread that destroys what was released inside plugin callbacks. At exit it finishes
// what was posted and stops; the object itself is never destroyed, because a plugin thread may
// still post while the process exits: that last work is left undone (the process is ending).
class Janitor {
 public:
  void close() {
    // A plugin thread still inside a host callback may be about to post the last release of a
    // provider, whose destroy joins that thread: let such callbacks return first (bounded: a
    // callback that never returns does not hold the exit), so that the post is run, not abandoned.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (g_callbacks_running.load() > g_callback_depth &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void post(std::function<void()> fn) {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      abandoned_.push_back(std::move(fn));  // never run: the process is ending
      return;
    }
    queue_.push_back(std::move(fn));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    wake_.notify_one();
  }

 private:
  void run() {
    pthread_setname_np(pthread_self(), "sbx-janitor");  // one per process, named for a reader
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::function<void()>> abandoned_;
  std::thread thread_;
  bool stopping_ = false;
};

Janitor& janitor() {
  static Janitor* const instance = [] {
    auto* created = new Janitor();
    std::atexit([] { janitor().close(); });
    return created;
  }();
  return *instance;
}

}  // namespace

CallbackScope::CallbackScope() noexcept {
  ++g_callback_depth;
  ++g_callbacks_running;
}
CallbackScope::~CallbackScope() {
  --g_callbacks_running;
  --g_callback_depth;
}
bool CallbackScope::active() noexcept {
  return g_callback_depth > 0;
}

void destroy_later(std::function<void()> destroy) {
  janitor().post(std::move(destroy));
}

// Loggers are named children of "sbx" and share its sinks and, when made, its level; a plugin's
// lines go through one of them (provider.<name>, plugin.<name>), so they follow that level too. An
// application that registers its own "sbx" logger before using the library decides where
// everything goes and at which level; otherwise it is stderr, at $SBX_LOG_LEVEL when that names a
// level (spdlog's names: trace, debug, info, warn, error, critical, off), else spdlog's default.
std::shared_ptr<spdlog::logger> logger(const std::string& name) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (auto existing = spdlog::get(name)) return existing;
  auto base = spdlog::get("sbx");
  if (!base) {
    base = std::make_shared<spdlog::logger>(
        "sbx", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    if (const char* env = std::getenv("SBX_LOG_LEVEL"); env && *env) {
      const auto level = spdlog::level::from_str(env);
      if (level != spdlog::level::off || std::string_view(env) == "off") base->set_level(level);
    }
    spdlog::register_logger(base);
    if (name == "sbx") return base;
  }
  auto created = std::make_shared<spdlog::logger>(name, base->sinks().begin(), base->sinks().end());
  created->set_level(base->level());
  spdlog::register_logger(created);
  return created;
}

HostBinding::HostBinding(const std::string& logger_name) : logger_(logger(logger_name)) {
  static constexpr std::string_view kName = "sbx";
  static constexpr std::string_view kVersion = SBX_VERSION;
  host_.struct_size = sizeof(sbx_host);
  host_.abi_version = SBX_ABI_VERSION_INIT;
  host_.host_name = {kName.data(), kName.size()};
  host_.host_version = {kVersion.data(), kVersion.size()};
  host_.host_data = &logger_;
  host_.log = &host_log;
  host_.log_enabled = &host_log_enabled;
  host_.now_ns = &host_now_ns;
  host_.get_extension = &host_get_extension;
}

}  // namespace sbx::detail
