// ShellSessions: each session call is one exec of the provider's, started with a completion of our
// own (a LocalExec) whose outcome becomes the session call's.

#include <sbx/base/shell_session.hpp>
#include <sbx/sdk/shell_sessions.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <random>

namespace sbx::sdk {
namespace {

// An exec the SDK starts itself: its output collected, its outcome handed to `then`, a callable
// (const ExitStatus*, const std::string& output, const Error*).
template <class Then>
class LocalExec final : public detail::Op<ExitStatus>, public OutputSink {
 public:
  explicit LocalExec(Then then) : then_(std::move(then)) {}

  void write(StdStream, std::string_view bytes) override {
    if (output_.size() < 64 * 1024) output_.append(bytes.substr(0, 64 * 1024 - output_.size()));
  }
  void deliver_value(ExitStatus&& status) noexcept override {
    try {
      then_(&status, output_, nullptr);
    } catch (...) {
    }
  }
  void deliver_error(const Error& error) noexcept override {
    try {
      then_(nullptr, output_, &error);
    } catch (...) {
    }
  }

 private:
  Then then_;
  std::string output_;  // stdout and stderr, the first 64 KiB: for error messages
};

// Runs `request` through `provider.exec`; `then` is called exactly once, on any thread.
template <class Then>
void start_local_exec(Provider& provider, Sandbox& sandbox, ExecRequest request, Then then) {
  auto* op = new LocalExec<Then>(std::move(then));
  std::exception_ptr error;
  try {
    provider.exec(sandbox, std::move(request), ExecCompletion(op, op));
  } catch (...) {
    error = std::current_exception();
  }
  op->end_start(error);
  op->release();
}

bool id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

std::string random_hex() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(rng()));
  return text;
}

// The user a session id carries ("<random>.<user>"), if any.
std::optional<std::string> user_of(const std::string& session_id) {
  const auto dot = session_id.find('.');
  if (dot == std::string::npos) return std::nullopt;
  return session_id.substr(dot + 1);
}

// 'text' for sh, single quotes inside written as '\''.
std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  return text;
}

}  // namespace

void ShellSessions::open_session(Sandbox& sandbox, SessionRequest request,
                                 Completion<std::string> done) {
  std::string id = "s" + random_hex();
  if (request.user) {
    const std::string& user = *request.user;
    if (user.empty() || user.size() > 64 ||
        !std::all_of(user.begin(), user.end(), [](char c) { return id_char(c); })) {
      throw Error::invalid_argument(
          "a session's user must be 1 to 64 bytes of [A-Za-z0-9_.-], got '" + user + "'");
    }
    id += "." + user;
  }
  ExecRequest exec;
  exec.command = base::shell_session_script(id, request.cwd.has_value(), "true");
  exec.cwd = request.cwd;
  exec.env = std::move(request.env);
  exec.user = std::move(request.user);
  exec.timeout = std::chrono::milliseconds(60'000);
  start_local_exec(provider_, sandbox, std::move(exec),
                   [done = std::move(done), id](const ExitStatus* status, const std::string& output,
                                                const Error* error) mutable {
                     if (error) return done.fail(*error);
                     if (status->return_code != 0 || status->error_type) {
                       return done.fail(Error::failed_precondition(
                           "the sandbox could not start a session (exit " +
                           std::to_string(status->return_code) + "): " + trimmed(output)));
                     }
                     done.succeed(id);
                   });
}

void ShellSessions::require_known(const std::string& session_id) {
  const bool made_here_form =
      session_id.size() >= 17 && session_id[0] == 's' &&
      std::all_of(session_id.begin() + 1, session_id.begin() + 17,
                  [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }) &&
      (session_id.size() == 17 || session_id[17] == '.');
  std::lock_guard lock(mutex_);
  if (!made_here_form || closed_.count(session_id)) {
    throw Error::not_found("session " + session_id + " not found");
  }
}

void ShellSessions::run_in_session(Sandbox& sandbox, std::string session_id, ExecRequest request,
                                   ExecCompletion done) {
  require_known(session_id);
  // The run's env as exports after the restore: they win over the session's state, and carry on.
  std::string prelude;
  for (const auto& [name, value] : request.env) {
    const bool identifier = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                            std::all_of(name.begin(), name.end(), [](char c) {
                              return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                            });
    if (!identifier) {
      throw Error::invalid_argument(
          "a session command's env name must be a shell identifier, got '" + name + "'");
    }
    prelude += "export " + name + "=" + shell_quote(value) + "\n";
  }
  request.env.clear();
  request.env["SBX_SESSION_ID"] = session_id;  // for the provider: spare its background jobs
  request.command = base::shell_session_script(session_id, request.cwd.has_value(), request.command,
                                               true, prelude);
  request.user = user_of(session_id);
  provider_.exec(sandbox, std::move(request), std::move(done));
}

void ShellSessions::close_session(Sandbox& sandbox, std::string session_id, Completion<void> done) {
  require_known(session_id);
  ExecRequest exec;
  exec.command = base::shell_session_close_script(session_id);
  exec.user = user_of(session_id);
  exec.timeout = std::chrono::milliseconds(60'000);
  start_local_exec(
      provider_, sandbox, std::move(exec),
      [this, done = std::move(done), session_id](
          const ExitStatus* status, const std::string& output, const Error* error) mutable {
        if (error) return done.fail(*error);
        if (status->return_code == 0 || status->return_code == 3) {
          std::lock_guard lock(mutex_);
          closed_.insert(session_id);
        }
        if (status->return_code == 3) {
          return done.fail(Error::not_found("session " + session_id + " not found"));
        }
        if (status->return_code != 0 || status->error_type) {
          return done.fail(Error::internal("closing session " + session_id + " failed (exit " +
                                           std::to_string(status->return_code) +
                                           "): " + trimmed(output)));
        }
        done.succeed();
      });
}

}  // namespace sbx::sdk
