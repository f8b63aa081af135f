// Persistent shell sessions as scripts over a provider's plain `sh -c` exec, shared by `sbx
// serve`'s execd `/session` routes (serve/routes_execd_session.cpp) and the SDK's sbx.session/1
// helper (sbx/sdk/shell_sessions.hpp).
//
// A session is state, not a process: each run is a command of its own whose script first
// restores what the session's last run left (its exported variables and its working directory,
// kept in a file in the sandbox), runs the command as given (so `cd`, `export` and `exit` act as
// typed into a shell), then saves the state and exits with the command's status. The state is a
// file of `export -p` lines (the working directory among them, as __sbx_session_pwd) in the
// sandbox's $TMPDIR (else /tmp), replaced whole after each run. A command that ends the shell
// itself (exit, exec) leaves the state as it was, as execd's sessions do. A background job a run
// starts (with its output redirected) outlives the run and the session.
#pragma once

#include <string>

namespace sbx::base {

// The shell expression of a session's state file; `session_id` is [A-Za-z0-9_.:-] only.
inline std::string shell_session_state(const std::string& session_id) {
  return "\"${TMPDIR:-/tmp}/.sbx-session-" + session_id + "\"";
}

// The script of one run. `run_has_cwd`: the exec sets this run's own working directory, which
// then wins over the session's. `tracked`: the session must exist (else the script prints
// "sbx: session ... not found" to stderr and exits 125), and the run's process id is kept in
// "<state>.run.<pid>" while it runs, for shell_session_close_script() to kill.
// `prelude`: shell lines run after the restore, before the command (a run's own exports).
inline std::string shell_session_script(const std::string& session_id, bool run_has_cwd,
                                        const std::string& command, bool tracked = false,
                                        const std::string& prelude = {}) {
  std::string s = "__sbx_session_state=" + shell_session_state(session_id) + "\n";
  if (tracked) {
    s += "[ -r \"$__sbx_session_state\" ] || { echo \"sbx: session " + session_id +
         " not found\" >&2; exit 125; }\n"
         "echo $$ > \"$__sbx_session_state.run.$$\"\n";
  }
  s += "if [ -r \"$__sbx_session_state\" ]; then . \"$__sbx_session_state\" 2>/dev/null; ";
  if (!run_has_cwd) s += "cd -- \"$__sbx_session_pwd\" 2>/dev/null; ";
  s += "unset __sbx_session_pwd; fi\n";
  s += prelude;
  s += command;
  if (command.empty() || command.back() != '\n') s += '\n';
  // SBX_EXEC_ID tags each command's processes for its cancellation (plugins/local_docker,
  // sbx-agent): the next run must keep its own.
  s += "__sbx_session_rc=$?\n"
       "unset SBX_EXEC_ID; __sbx_session_pwd=$(pwd); export __sbx_session_pwd\n"
       "export -p > \"$__sbx_session_state.$$\" 2>/dev/null && "
       "mv -f \"$__sbx_session_state.$$\" \"$__sbx_session_state\" 2>/dev/null\n";
  if (tracked) s += "rm -f \"$__sbx_session_state.run.$$\"\n";
  s += "exit $__sbx_session_rc\n";
  return s;
}

// Ends a session: kills its tracked runs still going (their process groups, else the processes;
// dash wants `--` before a negative pid, busybox refuses it)
// and removes its state; exits 3 when there is no such session.
inline std::string shell_session_close_script(const std::string& session_id) {
  return "__sbx_session_state=" + shell_session_state(session_id) +
         "\n"
         "[ -e \"$__sbx_session_state\" ] || exit 3\n"
         "for f in \"$__sbx_session_state\".run.*; do\n"
         "  [ -f \"$f\" ] || continue\n"
         "  p=$(cat \"$f\"); rm -f \"$f\"\n"
         "  case $p in ''|*[!0-9]*) continue;; esac\n"
         "  kill -s KILL -- \"-$p\" 2>/dev/null || kill -s KILL \"-$p\" 2>/dev/null ||\n"
         "    kill -s KILL \"$p\" 2>/dev/null\n"
         "done\n"
         "rm -f \"$__sbx_session_state\"\n";
}

}  // namespace sbx::base
