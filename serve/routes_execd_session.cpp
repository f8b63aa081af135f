// The execd API's bash sessions on the gateway (docs/serve.md, "Bash sessions"):
//   POST   /session             {"cwd"?} -> 200 {"session_id": "..."}
//   POST   /session/{id}/run    {"command", "cwd"?, "timeout"? (ms)} -> the event stream of
//                               POST /command (its init event carries the session's id)
//   DELETE /session/{id}        200; a run still going is killed, what it left in the background
//                               lives on
//
// A session is the provider's own (sbx.session/1) when it offers one: POST /session opens it,
// each run is Session::run, DELETE closes it. Otherwise it is the server's: state, not a process,
// each run's script (sbx/base/shell_session.hpp, the one sdk::ShellSessions runs too) first
// restores what the last run of the session left and saves it again after the command. Either
// way a run is a command of its own (routes_execd_command.cpp: the same admission, stream,
// interrupt and limits); `cd` and `export` carry from one run to the next, as in execd's
// sessions, and a background service a run starts (with its output redirected) outlives the run
// and the session. NeMo Gym's `preserve_background_services=True` runs each command this way.
//
// THREADING: handlers run on the connection's strand; a sandbox's SessionTable is guarded by its
// mutex. OWNERSHIP: the Entry owns its SessionTable; the table goes with the sandbox.

#include "state.hpp"

#include <sbx/base/shell_session.hpp>

#include <boost/json.hpp>

#include <deque>
#include <map>
#include <mutex>

namespace sbx::serve {

namespace json = boost::json;

// At most this many sessions per sandbox; POST /session beyond it is answered 429.
constexpr std::size_t kMaxSessions = 256;
// The latest runs of a session kept for DELETE to kill (a run is one client's stream: more than a
// few at once is unusual).
constexpr std::size_t kKeptRuns = 16;

struct SessionTable {
  struct Session {
    std::string cwd;               // the working directory of its first run (may be empty)
    std::deque<std::string> runs;  // ids of its latest commands, oldest first
    sbx::Session native;           // the provider's (valid once opened), or the server's own
    bool opening = false;          // the provider's is being opened: not usable yet
  };
  std::mutex mutex;
  std::map<std::string, Session> sessions;  // by id
};

std::shared_ptr<SessionTable> new_session_table() {
  return std::make_shared<SessionTable>();
}

namespace {

// The body's object (an empty body: {}); nullopt after answering 400 INVALID_REQUEST_BODY.
std::optional<json::object> body_object(const Call& call, bool may_be_empty) {
  const std::string& text = call.request.body();
  if (may_be_empty && text.find_first_not_of(" \t\r\n") == std::string::npos) {
    return json::object{};
  }
  boost::system::error_code ec;
  json::value value = json::parse(text, ec);
  if (ec || !value.is_object()) {
    call.reply(execd_error(call.request, http::status::bad_request, "INVALID_REQUEST_BODY",
                           ec ? "invalid request body: " + ec.message()
                              : "invalid request body: the body must be a JSON object"));
    return std::nullopt;
  }
  return std::move(value.as_object());
}

// An optional string field ("" and null: none); false after answering 400.
bool optional_string(const Call& call, const json::object& body, const char* name,
                     std::optional<std::string>& out) {
  const auto* v = body.if_contains(name);
  if (!v || v->is_null()) return true;
  if (!v->is_string()) {
    call.reply(execd_error(call.request, http::status::bad_request, "INVALID_REQUEST_BODY",
                           std::string("invalid request body: ") + name + " must be a string"));
    return false;
  }
  if (!v->as_string().empty()) out = std::string(v->as_string());
  return true;
}

Response session_not_found(const Request& request, const std::string& id) {
  return execd_error(request, http::status::not_found, "CONTEXT_NOT_FOUND",
                     "session " + id + " not found");
}

}  // namespace

void post_session(const Call& call) {
  const auto body = body_object(call, true);
  if (!body) return;
  std::optional<std::string> cwd;
  if (!optional_string(call, *body, "cwd", cwd)) return;
  std::string id = new_request_id();
  const std::shared_ptr<sbx::Sandbox> box = call.entry->box();
  const bool native = box && box->supports("sbx.session/1");
  {
    std::lock_guard lock(call.entry->sessions->mutex);
    auto& sessions = call.entry->sessions->sessions;
    if (sessions.size() >= kMaxSessions) {
      call.reply(execd_error(call.request, http::status::too_many_requests, "TOO_MANY_SESSIONS",
                             "sandbox " + call.entry->id + " has its maximum of " +
                                 std::to_string(kMaxSessions) +
                                 " sessions; delete one (DELETE /session/{id})"));
      return;
    }
    sessions[id].cwd = cwd.value_or("");
    sessions[id].opening = native;
  }
  if (!native) {
    call.reply(json_response(call.request, http::status::ok, json::object{{"session_id", id}}));
    return;
  }
  // The provider's session, opened off the strand; the answer once it is (or its refusal).
  auto finish = [table = call.entry->sessions, reply = call.reply,
                 request = std::make_shared<const Request>(call.request),
                 id](sbx::Operation<sbx::Session>& op) {
    std::string why;
    try {
      sbx::Session opened = op.get();
      std::lock_guard lock(table->mutex);
      const auto it = table->sessions.find(id);
      if (it != table->sessions.end()) {
        it->second.native = std::move(opened);
        it->second.opening = false;
        reply(json_response(*request, http::status::ok, json::object{{"session_id", id}}));
        return;
      }
      why = "the sandbox's sessions went while session " + id + " was being opened";
    } catch (const sbx::Error& e) {
      why = e.what();
    }
    {
      std::lock_guard lock(table->mutex);
      table->sessions.erase(id);
    }
    reply(execd_error(*request, http::status::internal_server_error, "RUNTIME_ERROR", why));
  };
  try {
    box->open_session_async({.cwd = cwd}).then(std::move(finish));
  } catch (const sbx::Error& e) {
    {
      std::lock_guard lock(call.entry->sessions->mutex);
      call.entry->sessions->sessions.erase(id);
    }
    call.reply(
        execd_error(call.request, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
  }
}

void post_session_run(const Call& call) {
  const std::string& id = call.params.at(0);
  std::string cwd;
  sbx::Session native;
  {
    std::lock_guard lock(call.entry->sessions->mutex);
    const auto it = call.entry->sessions->sessions.find(id);
    if (it == call.entry->sessions->sessions.end() || it->second.opening) {
      call.reply(session_not_found(call.request, id));
      return;
    }
    cwd = it->second.cwd;
    native = it->second.native;
  }
  const auto body = body_object(call, false);
  if (!body) return;
  const auto* command = body->if_contains("command");
  if (!command || !command->is_string() || command->as_string().empty()) {
    call.reply(execd_error(call.request, http::status::bad_request, "INVALID_REQUEST_BODY",
                           "invalid request body: command is required (a non-empty string)"));
    return;
  }
  std::optional<std::string> run_cwd;
  if (!optional_string(call, *body, "cwd", run_cwd)) return;
  CommandRequest run;
  if (const auto* t = body->if_contains("timeout"); t && !t->is_null()) {
    const auto ms = integer_of(*t);
    if (!ms || *ms < 0) {
      call.reply(execd_error(
          call.request, http::status::bad_request, "INVALID_REQUEST_BODY",
          "invalid request body: timeout must be a non-negative integer (milliseconds)"));
      return;
    }
    if (*ms > 0) run.timeout_ms = *ms;  // 0: none, as execd
  }
  if (native.valid()) {  // the provider's session keeps its own working directory
    run.command = std::string(command->as_string());
    run.cwd = run_cwd;
    run.session = std::move(native);
  } else {
    run.command =
        base::shell_session_script(id, run_cwd.has_value(), std::string(command->as_string()));
    if (run_cwd) {
      run.cwd = run_cwd;
    } else if (!cwd.empty()) {
      run.cwd = cwd;
    }
  }
  const auto started = launch_command(call.state, call.entry, call.request, call.reply,
                                      call.open_stream, std::move(run), id);
  if (!started) return;
  std::lock_guard lock(call.entry->sessions->mutex);
  const auto it = call.entry->sessions->sessions.find(id);
  if (it == call.entry->sessions->sessions.end()) {  // deleted while the run was admitted
    cancel_command(*call.entry->execd, *started);
    return;
  }
  it->second.runs.push_back(*started);
  if (it->second.runs.size() > kKeptRuns) it->second.runs.pop_front();
}

void delete_session(const Call& call) {
  const std::string& id = call.params.at(0);
  std::deque<std::string> runs;
  sbx::Session native;
  {
    std::lock_guard lock(call.entry->sessions->mutex);
    const auto it = call.entry->sessions->sessions.find(id);
    if (it == call.entry->sessions->sessions.end() || it->second.opening) {
      call.reply(session_not_found(call.request, id));
      return;
    }
    runs = std::move(it->second.runs);
    native = std::move(it->second.native);
    call.entry->sessions->sessions.erase(it);
  }
  // A run still going is killed (its process group: the plugin's cancellation); one that ended
  // is not touched, nor what it started in the background.
  for (const auto& run : runs)
    cancel_command(*call.entry->execd, run);
  if (!native.valid()) {
    // The state file stays in the sandbox's /tmp (a few hundred bytes; it goes with the sandbox).
    call.reply(empty_response(call.request, http::status::ok));
    return;
  }
  // The provider closes its session (its state goes; background jobs live on).
  native.close_async().then([reply = call.reply, request = std::make_shared<const Request>(
                                                     call.request)](sbx::Operation<void>& op) {
    try {
      op.get();
    } catch (const sbx::NotFoundError&) {  // gone already (the sandbox was): deleted all the same
    } catch (const sbx::Error& e) {
      reply(execd_error(*request, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
      return;
    }
    reply(empty_response(*request, http::status::ok));
  });
}

}  // namespace sbx::serve
