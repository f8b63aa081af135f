#include "frames.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <stdexcept>

namespace sbx::local_docker {

namespace json = boost::json;

void FrameParser::feed(std::string_view bytes,
                       const std::function<void(char, std::string_view)>& on_frame) {
  auto take = [&](std::string_view data) -> size_t {  // whole frames at the start of `data`
    size_t at = 0;
    while (data.size() - at >= 5) {
      uint32_t n = 0;
      for (size_t i = 1; i <= 4; ++i)
        n = (n << 8) | static_cast<unsigned char>(data[at + i]);
      if (n > kMaxFramePayload) {
        throw sdk::Error::internal("the sandbox's agent sent a frame of " + std::to_string(n) +
                                   " bytes (kind '" + std::string(1, data[at]) +
                                   "'); its frames carry at most " +
                                   std::to_string(kMaxFramePayload));
      }
      if (data.size() - at - 5 < n) break;
      on_frame(data[at], data.substr(at + 5, n));
      at += 5 + n;
    }
    return at;
  };
  if (pending_.empty()) {
    const size_t used = take(bytes);
    pending_.assign(bytes.substr(used));
    return;
  }
  pending_.append(bytes);
  const size_t used = take(pending_);
  pending_.erase(0, used);
}

CommandEnd parse_command_end(std::string_view payload) {
  try {
    const json::object end = json::parse(payload).as_object();
    // An exit status is 0-255 and a signal 1-127 (agent/README.md, "Frames").
    auto in_range = [](const json::value& v, int64_t low, int64_t high) {
      const auto n = v.to_number<int64_t>();
      if (n < low || n > high) throw std::out_of_range(std::to_string(n) + " is out of range");
      return n;
    };
    CommandEnd out;
    // Killed because the sandbox expired under it: no result, the sandbox is gone.
    if (const auto* expired = end.if_contains("sandbox_expired")) {
      out.sandbox_expired = in_range(*expired, 1, INT64_MAX / 1000);
    } else if (const auto* code = end.if_contains("exit_code")) {
      out.status = sdk::ExitStatus::exited(static_cast<int32_t>(in_range(*code, 0, 255)));
    } else if (end.contains("timed_out")) {
      out.status = sdk::ExitStatus::timed_out();
    } else if (const auto* signal = end.if_contains("signal")) {
      out.status = sdk::ExitStatus::exited(128 + static_cast<int32_t>(in_range(*signal, 1, 127)));
    } else if (const auto* error = end.if_contains("error"); error && error->is_string()) {
      out.not_started = std::string(std::string_view(error->get_string()).substr(0, 4096));
    } else {
      throw std::invalid_argument("no exit_code, signal, timed_out, sandbox_expired or error");
    }
    return out;
  } catch (const std::exception& e) {
    throw sdk::Error::internal(std::string("the sandbox's agent sent a bad end of command: ") +
                               e.what());
  }
}

}  // namespace sbx::local_docker
