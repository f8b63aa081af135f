#include "execd.hpp"

#include <sbx/sdk/retry.hpp>

#include <boost/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <mutex>
#include <stop_token>

namespace sbx::opensandbox {

namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

// The finished call's response; a transport error after `cancel` fired is the cancellation.
sdk::http::Response finish(sdk::http::Call& call, const sdk::CancelToken& cancel) {
  try {
    return call.get();
  } catch (const sdk::Error&) {
    if (cancel.stop_requested()) throw sdk::Error::cancelled();
    throw;
  }
}

std::string what_of(const std::string& operation, const std::string& sandbox_id) {
  return "OpenSandbox " + operation + " (sandbox " + sandbox_id + ")";
}

// An answer from the execd routes that is not a success.
sdk::Error execd_error(const sdk::http::Response& response, const std::string& what) {
  return to_error(parse_api_error(response), what,
                  response.status == 502 || response.status == 503);
}

sdk::http::Request to(const ExecdEndpoint& endpoint, std::string method, std::string path) {
  sdk::http::Request request;
  request.method = std::move(method);
  request.target = endpoint.base_url + path;
  request.headers = endpoint.headers;
  return request;
}

// The marker thrown from the body callback once the terminal event is in: the rest of the stream
// (execd holds it open about a second more) is not waited for.
constexpr std::string_view kStreamDone = "opensandbox: event stream complete";

}  // namespace

std::string shell_quote(std::string_view word) {
  std::string out = "'";
  for (const char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

void EventStreamParser::feed(std::string_view bytes,
                             const std::function<void(const Event&)>& on_event) {
  pending_.append(bytes);
  size_t start = 0;
  for (;;) {
    const size_t end = pending_.find('\n', start);
    if (end == std::string::npos) break;
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

ExecdClient::ExecdClient(const ConnectionConfig& connection, const OperationConfig& operations,
                         sdk::Logger log)
    : connection_(connection),
      operations_(operations),
      log_(std::move(log)),
      http_(client_options(connection, "")) {}

bool ExecdClient::ping(const ExecdEndpoint& endpoint, std::chrono::milliseconds timeout,
                       const sdk::CancelToken& cancel) {
  auto request = to(endpoint, "GET", "/ping");
  request.timeout = timeout;
  return http_.send(std::move(request), cancel).status == 200;
}

CommandOutcome ExecdClient::run(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
                                const CommandRequest& command,
                                const std::function<void(sdk::StdStream, std::string_view)>& output,
                                const sdk::CancelToken& cancel) {
  json::object body{{"command", command.command}};
  if (command.cwd) body["cwd"] = *command.cwd;
  if (command.timeout) body["timeout"] = std::max<int64_t>(1, command.timeout->count());
  if (!command.envs.empty()) {
    json::object envs;
    for (const auto& [k, v] : command.envs)
      envs[k] = v;
    body["envs"] = std::move(envs);
  }
  if (command.uid) body["uid"] = *command.uid;
  const std::string body_text = json::serialize(body);

  // The seed's per-request budget: timeout + 60 s, and a hard cap of twice that plus 30 s on the
  // whole stream; without a timeout only the idle timeout (execd pings every 3 s) bounds it.
  std::chrono::milliseconds hard_cap{0};
  if (command.timeout) hard_cap = 2 * (*command.timeout + 60s) + 30s;

  const int submissions = static_cast<int>(operations_.retries) + 1;
  for (int attempt = 1;; ++attempt) {
    // State shared with the loop thread's callbacks.
    struct Shared {
      std::mutex mutex;
      std::string command_id;
      long status = 0;
      std::string error_body;
      bool terminal = false;
      EventStreamParser::Event last;
      EventStreamParser parser;
    };
    auto shared = std::make_shared<Shared>();
    auto request = to(endpoint, "POST", "/command");
    request.headers.emplace_back("Content-Type", "application/json");
    request.headers.emplace_back("Accept", "text/event-stream");
    request.body = body_text;
    request.timeout = hard_cap;
    request.idle_timeout = seconds_ms(operations_.stream_idle_timeout_s);
    request.on_headers = [shared](long status, const sdk::http::Headers&) {
      std::lock_guard lock(shared->mutex);
      shared->status = status;
    };
    request.on_body = [shared, &output](std::string_view bytes) {
      std::unique_lock lock(shared->mutex);
      if (shared->status != 200) {
        if (shared->error_body.size() < 64 * 1024) shared->error_body.append(bytes);
        return;
      }
      if (shared->terminal) return;
      std::vector<std::pair<sdk::StdStream, std::string>> lines;
      shared->parser.feed(bytes, [&](const EventStreamParser::Event& event) {
        if (shared->terminal) return;
        if (event.type == "init") {
          shared->command_id = event.text;
        } else if (event.type == "stdout" || event.type == "stderr") {
          const auto stream = event.type == "stdout" ? sdk::StdStream::out : sdk::StdStream::err;
          lines.emplace_back(stream, event.text == "\n" ? event.text : event.text + "\n");
        } else if (event.type == "execution_complete" || event.type == "error") {
          shared->terminal = true;
          shared->last = event;
        }
      });
      const bool terminal = shared->terminal;
      lock.unlock();
      for (const auto& [stream, text] : lines)
        output(stream, text);
      if (terminal) throw sdk::Error::cancelled(std::string(kStreamDone));
    };

    const auto started = std::chrono::steady_clock::now();
    sdk::http::Call call = http_.start(std::move(request));
    {
      // Cancellation: abort the stream and interrupt the command on the server (the interrupt is
      // not waited for; the server also ends a command whose client went away).
      std::stop_callback on_cancel(cancel, [&, shared] {
        call.cancel();
        std::string id;
        {
          std::lock_guard lock(shared->mutex);
          id = shared->command_id;
        }
        if (!id.empty()) {
          auto interrupt = to(endpoint, "DELETE", "/command?id=" + sdk::http::url_encode(id));
          interrupt.timeout = 10s;
          http_.start(std::move(interrupt));
        }
      });
      call.wait_until(std::chrono::steady_clock::time_point::max());
    }
    std::optional<sdk::Error> failure;
    try {
      call.get();
    } catch (const sdk::Error& e) {
      failure = e;
    }
    std::lock_guard lock(shared->mutex);
    if (shared->terminal) {
      const bool timed_out =
          command.timeout && std::chrono::steady_clock::now() - started >= *command.timeout;
      const sdk::ExitStatus status = exit_status_of(shared->last, timed_out);
      if (shared->last.type == "error" && status.error_type == SBX_EXEC_ERROR_SANDBOX) {
        // The command did not run (or was killed): the server's reason goes to stderr.
        const std::string reason =
            shared->last.traceback.value_or(shared->last.error_value.value_or(""));
        if (!reason.empty()) output(sdk::StdStream::err, reason + "\n");
      }
      return {status, shared->command_id};
    }
    if (cancel.stop_requested()) throw sdk::Error::cancelled();
    if (failure) {
      if (failure->status() == SBX_STATUS_TIMEOUT && command.timeout) {
        throw sdk::Error::timeout("OpenSandbox exec exceeded hard cap of " +
                                  std::to_string(hard_cap.count() / 1000) +
                                  "s; the command wedged (sandbox_id=" + sandbox_id + ")");
      }
      throw *failure;
    }
    if (shared->status == 200) {
      throw sdk::Error::unavailable(what_of("command run", sandbox_id) +
                                        ": the event stream ended without execution_complete "
                                        "or error",
                                    false);
    }
    sdk::http::Response response;
    response.status = shared->status;
    response.body = shared->error_body;
    if (shared->status == 502 && attempt < submissions) {
      const auto delay =
          std::min<std::chrono::milliseconds>(250ms * (1 << std::min(attempt - 1, 4)), 2s);
      log_.warn("Backend-connect 502 on command run (sandbox_id=", sandbox_id, "); submission ",
                attempt, "/", submissions, ", again in ", delay.count(), " ms");
      sdk::sleep_for(delay, cancel);
      continue;
    }
    if (shared->status == 502) {
      throw sdk::Error::unavailable(
          "Sandbox backend unreachable through " + std::to_string(submissions) +
              " submissions of 'command run' (proxy 502: no TCP connection to execd); the sandbox "
              "is likely dead; sandbox_id=" +
              sandbox_id,
          false);
    }
    const ApiError error = parse_api_error(response);
    if (shared->status == 400 && error.code == "INVALID_REQUEST_BODY") {
      // execd refuses the command before starting it, e.g. a cwd that does not exist.
      output(sdk::StdStream::err, error.message + "\n");
      return {sdk::ExitStatus::sandbox_failure(), {}};
    }
    throw to_error(error, what_of("command run", sandbox_id), false);
  }
}

void ExecdClient::upload(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
                         const sdk::UploadRequest& request, sdk::ByteSource& source,
                         const sdk::CancelToken& cancel) {
  sdk::http::Multipart multipart;
  // execd takes the octal mode written as a decimal number (0644 is 644).
  char mode[16];
  const auto end = std::to_chars(mode, mode + sizeof mode, request.mode & 07777, 8).ptr;
  json::object metadata{{"path", request.remote_path},
                        {"mode", std::stoll(std::string(mode, end))}};
  multipart.add({.name = "metadata",
                 .filename = "metadata",
                 .content_type = "application/json",
                 .bytes = json::serialize(metadata)});
  multipart.add(
      {.name = "file",
       .filename = request.remote_path,
       .content_type = "application/octet-stream",
       .source = [&source](char* buffer, size_t capacity) { return source.read(buffer, capacity); },
       .size = source.size()});
  auto http_request = to(endpoint, "POST", "/files/upload");
  http_request.push_body = true;
  http_request.idle_timeout = seconds_ms(operations_.stream_idle_timeout_s);
  multipart.prepare_push(http_request);
  sdk::http::Call call = http_.start(std::move(http_request));
  std::stop_callback on_cancel(cancel, [&call] { call.cancel(); });
  multipart.pump(call);
  sdk::http::Response response = finish(call, cancel);
  if (response.status != 200) {
    throw execd_error(response, what_of("upload to " + request.remote_path, sandbox_id));
  }
}

void ExecdClient::download(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
                           const std::string& path, sdk::ByteSink& sink,
                           const sdk::CancelToken& cancel) {
  auto request = to(endpoint, "GET", "/files/download?path=" + sdk::http::url_encode(path));
  request.idle_timeout = seconds_ms(operations_.stream_idle_timeout_s);
  request.pull_body_limit = 256 * 1024;
  auto status = std::make_shared<std::atomic<long>>(0);
  request.on_headers = [status](long code, const sdk::http::Headers&) { status->store(code); };
  sdk::http::Call call = http_.start(std::move(request));
  std::stop_callback on_cancel(cancel, [&call] { call.cancel(); });
  std::string chunk, error_body;
  for (bool done = false; !done;) {
    done = call.read_body(chunk, std::chrono::steady_clock::time_point::max());
    if (chunk.empty()) continue;
    if (status->load() == 200) {
      sink.write(chunk);
    } else if (error_body.size() < 64 * 1024) {
      error_body += chunk;
    }
  }
  sdk::http::Response response = finish(call, cancel);
  if (response.status != 200) {
    response.body = std::move(error_body);
    throw execd_error(response, what_of("download of " + path, sandbox_id));
  }
}

}  // namespace sbx::opensandbox
