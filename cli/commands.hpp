// The entries of the `sbx` command table, one function per command, defined in one file per group:
//   cmd_plugins.cpp     plugins, providers        (what can be used)
//   cmd_run.cpp         run                       (a sandbox for one command)
//   cmd_sandbox.cpp     create, exec, cp, status, pause, resume, close
//                                                 (one sandbox over several sbx processes)
//   cmd_shell.cpp       shell                     (an interactive terminal in such a sandbox)
//   cmd_list_reap.cpp   list, reap                (a provider's sandboxes by label)
//   cmd_conformance.cpp conformance               (the provider conformance suite)
//   cmd_serve.cpp       serve                     (an OpenSandbox-compatible server, serve)
//   cmd_reload.cpp      reload                    (asks a running sbx serve to reload)
// main.cpp puts them in the table, in the order `sbx --help` lists them.
#pragma once

#include "args.hpp"

namespace sbx::cli {

Command plugins_command();
Command providers_command();
Command run_command();
Command create_command();
Command exec_command();
Command cp_command();
Command status_command();
Command pause_command();
Command resume_command();
Command close_command();
Command shell_command();
Command list_command();
Command reap_command();
Command conformance_command();
Command serve_command();
Command reload_command();

}  // namespace sbx::cli
