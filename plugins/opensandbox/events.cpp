#include "events.hpp"

#include <boost/json.hpp>

#include <charconv>

namespace sbx::opensandbox {

namespace json = boost::json;

void EventStreamParser::feed(std::string_view bytes,
                             const std::function<void(const Event&)>& on_event) {
  pending_.append(bytes);
  size_t start = 0;
  for (;;) {
    const size_t end = pending_.find('\n', start);
    if (end == std::string::npos) {
      // A line that never ends is not execd's: its lines carry at most 8 MiB of output, JSON
      // escaped.
      if (pending_.size() - start > kMaxEventLine) {
        throw sdk::Error::internal("execd sent an event line longer than " +
                                   std::to_string(kMaxEventLine) + " bytes");
      }
      break;
    }
    std::string_view line(pending_.data() + start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == ':' || line.starts_with("event:") ||
        line.starts_with("id:") || line.starts_with("retry:")) {
      continue;
    }
    if (line.starts_with("data:")) {
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    }
    json::parse_options options;
    options.allow_invalid_utf8 = true;  // output bytes that are not UTF-8 come through as they are
    boost::system::error_code ec;
    const json::value value = json::parse(line, ec, {}, options);
    if (ec || !value.is_object()) {
      throw sdk::Error::internal("execd sent an event that is not a JSON object: " +
                                 std::string(line.substr(0, 200)));
    }
    const auto& object = value.get_object();
    Event event;
    if (const auto* type = object.if_contains("type"); type && type->is_string()) {
      event.type = std::string(type->get_string());
    }
    if (const auto* text = object.if_contains("text"); text && text->is_string()) {
      event.text = std::string(text->get_string());
    }
    if (const auto* error = object.if_contains("error"); error && error->is_object()) {
      const auto& e = error->get_object();
      if (const auto* v = e.if_contains("evalue"); v && v->is_string()) {
        event.error_value = std::string(v->get_string());
      } else if (v && v->is_number()) {
        event.error_value = json::serialize(*v);
      } else {
        event.error_value = std::string();
      }
      if (const auto* t = e.if_contains("traceback");
          t && t->is_array() && !t->get_array().empty() && t->get_array()[0].is_string()) {
        event.traceback = std::string(t->get_array()[0].get_string());
      }
      if (const auto* n = e.if_contains("ename"); n && n->is_string()) {
        event.error_name = std::string(n->get_string());
      }
    }
    on_event(event);
  }
  pending_.erase(0, start);
}

sdk::ExitStatus exit_status_of(const EventStreamParser::Event& terminal, bool timed_out) {
  if (terminal.type == "execution_complete") return sdk::ExitStatus::exited(0);
  const std::string& value = terminal.error_value.value_or("");
  int64_t code = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), code);
  if (ec != std::errc() || end != value.data() + value.size()) {
    return sdk::ExitStatus::sandbox_failure();
  }
  if (code == -1)
    return timed_out ? sdk::ExitStatus::timed_out() : sdk::ExitStatus::sandbox_failure();
  if (code < 0 || code > 255) return sdk::ExitStatus::sandbox_failure();
  if (terminal.traceback && *terminal.traceback != "exit status " + value) {
    return sdk::ExitStatus::sandbox_failure();
  }
  return sdk::ExitStatus::exited(static_cast<int32_t>(code));
}

}  // namespace sbx::opensandbox
