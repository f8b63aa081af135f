// execd's command event stream as the opensandbox plugin reads it: the parser and what its last
// event means. Every byte comes from the sandbox's execd (in direct mode, a process inside the
// sandbox): the parser keeps at most one bounded line. No dependency beyond the SDK's types and
// Boost.JSON, so the fuzz target (fuzz/opensandbox_events.cpp) builds it alone.
//
// THREADING: not thread-safe; one parser per stream.
#pragma once

#include <sbx/sdk/error.hpp>
#include <sbx/sdk/types.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::opensandbox {

// Parses execd's event stream: bare JSON objects separated by blank lines, also tolerating SSE's
// "data:" prefix, ":" comments, event:/id:/retry: lines and "\r\n". Not thread-safe.
class EventStreamParser {
 public:
  // The longest event line kept while it arrives (execd sends at most 8 MiB of output a line; JSON
  // escaping may grow it). Past it the stream is refused: the sandbox's execd is not well.
  static constexpr size_t kMaxEventLine = 64 * 1024 * 1024;
  struct Event {
    std::string type;
    std::string text;
    std::optional<std::string> error_value;  // error.evalue
    std::string error_name;                  // error.ename
    std::optional<std::string> traceback;    // error.traceback[0]
  };
  // Feeds bytes; calls `on_event` for every complete event line. Throws sdk::Error::internal for
  // a line that is not a JSON object, and for one longer than kMaxEventLine.
  void feed(std::string_view bytes, const std::function<void(const Event&)>& on_event);

 private:
  std::string pending_;
};

// The exit status an execd terminal event stands for: `execution_complete` is 0; `error` with a
// numeric evalue N is exit code N when its traceback is execd's "exit status N" (or absent);
// -1 (killed) is a timeout when `timed_out`, else the sandbox's failure; an evalue that is not a
// number (the command could not start) or a numeric one whose traceback says something other than
// "exit status N" (the process did not exit by itself) is 125/"sandbox".
sdk::ExitStatus exit_status_of(const EventStreamParser::Event& terminal, bool timed_out);

}  // namespace sbx::opensandbox
