// Logging for provider code, routed to the host through sbx_host::log (plugins link no logging
// library). Arguments are concatenated with operator<<; nothing is formatted when the level is off:
//   log.info("pulled ", image, " in ", ms, " ms");
#pragma once

#include <sbx/abi/host.h>

#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace sbx::sdk {

class Logger {
 public:
  Logger() = default;  // discards everything
  explicit Logger(const sbx_host* host) : host_(host) {}

  bool enabled(int32_t level) const {
    return host_ && host_->log && (!host_->log_enabled || host_->log_enabled(host_, level));
  }
  void write(int32_t level, std::string_view message) const {
    if (host_ && host_->log) host_->log(host_, level, sbx_str{message.data(), message.size()});
  }

  template <class... Args>
  void log(int32_t level, Args&&... args) const {
    if (!enabled(level)) return;
    std::ostringstream out;
    (out << ... << std::forward<Args>(args));
    write(level, out.str());
  }
  template <class... Args>
  void trace(Args&&... args) const {
    log(SBX_LOG_TRACE, std::forward<Args>(args)...);
  }
  template <class... Args>
  void debug(Args&&... args) const {
    log(SBX_LOG_DEBUG, std::forward<Args>(args)...);
  }
  template <class... Args>
  void info(Args&&... args) const {
    log(SBX_LOG_INFO, std::forward<Args>(args)...);
  }
  template <class... Args>
  void warn(Args&&... args) const {
    log(SBX_LOG_WARN, std::forward<Args>(args)...);
  }
  template <class... Args>
  void error(Args&&... args) const {
    log(SBX_LOG_ERROR, std::forward<Args>(args)...);
  }

  const sbx_host* host() const noexcept { return host_; }

 private:
  const sbx_host* host_ = nullptr;
};

}  // namespace sbx::sdk
