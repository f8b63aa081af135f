// sbx create, exec, cp, status, pause, resume, close: one sandbox used over several sbx processes.
//
// `create` makes a sandbox, prints its id (or its descriptor) and leaves it running (detached).
// Every other command connects to the sandbox its ID argument names (target.hpp), does one thing,
// and detaches: the sandbox is left as it is, also when the command fails or is stopped; only
// `close` ends it. All of them need the provider's sbx.connect/1 extension, `create` included (a
// sandbox no later command could reach would only wait for its TTL). Exit codes: those of
// `sbx run` (docs/decisions.md, 63).

#include "commands.hpp"
#include "connected.hpp"
#include "output.hpp"
#include "shared.hpp"
#include "stop.hpp"
#include "target.hpp"

#include <boost/json.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

namespace sbx::cli {

namespace {

// ---- create ------------------------------------------------------------------------------------

struct CreateFields {
  ProviderChoice provider;
  SandboxChoice sandbox;
  StopChoice stop;
  bool json = false;
};

int create(CreateFields& f, const Global& g) {
  Interrupts interrupts(sbx::Deadlines::ms(f.stop.stop_timeout_s));
  sbx::Host host = make_host(g);
  sbx::Provider provider = f.provider.pick(host);
  require_connect(provider);

  // Closed by RAII on every way out until its id is printed, then detached.
  sbx::Sandbox sandbox;
  try {
    try {
      sandbox = interrupts.step(provider.create_async(f.sandbox.spec));
      for (const auto& [local, remote] : f.sandbox.uploads) {
        if (!interrupts.stopped()) interrupts.step(sandbox.upload_async(local, remote));
      }
      std::string text;
      if (!interrupts.stopped()) {
        text = f.json ? interrupts.step(sandbox.serialize_async()) : sandbox.id();
      }
      if (interrupts.stopped()) {
        interrupts.wait(sandbox.close_async());
        return interrupts.stopped();
      }
      if (const int err = write_all(STDOUT_FILENO, text + "\n"); err != 0) {
        std::cerr << "sbx: writing the sandbox's " << (f.json ? "descriptor" : "id")
                  << " failed: " << std::strerror(err) << "; closing the sandbox\n";
        interrupts.wait(sandbox.close_async());
        return err == EPIPE ? kExitBrokenPipe : kExitLocalIo;
      }
      sandbox.detach();  // its id is out: it lives on until sbx close or its TTL
      return 0;
    } catch (const sbx::CancelledError&) {
      if (!interrupts.stopped()) throw;
      if (interrupts.stopped() == kExitInterrupted) {
        std::cerr << "sbx: interrupted; closing the sandbox\n";
      }
      if (sandbox.valid()) interrupts.wait(sandbox.close_async());
      return interrupts.stopped();
    }
  } catch (const GaveUp&) {
    leave_now(interrupts.stopped(), provider.name(),
              created_sandbox_left(host, provider.name(), sandbox.valid() ? sandbox.id() : ""));
  }
}

// ---- exec --------------------------------------------------------------------------------------

struct ExecFields {
  Target target;
  sbx::ExecOptions exec;
  std::vector<std::string> command;
};

std::vector<Option<ExecFields>> exec_options() {
  using E = sbx::ExecOptions;
  std::vector<Option<E>> own = command_options();
  own.push_back(
      repeatable<E>("--env", "K=V", "Environment variable of the command", [](E& e, const Arg& a) {
        auto [k, v] = a.pair('=');
        e.env[k] = v;
      }));
  own.push_back(value<E>("--workdir", "DIR",
                         "Working directory of the command (default: the sandbox's)",
                         [](E& e, const Arg& a) { e.cwd = a.text; }));
  return target_options<ExecFields>(options_of(&ExecFields::exec, own));
}

int exec(ExecFields& f, const Global& g) {
  return with_sandbox(
      f.target, g, "the command may still be running",
      [&](sbx::Sandbox& sandbox, Interrupts& interrupts) {
        f.exec.on_output = stream_output(interrupts);
        return exit_status_of(interrupts.step(start_exec(sandbox, f.command, f.exec)));
      });
}

// ---- cp ----------------------------------------------------------------------------------------

struct CopyFields {
  Target target;
  std::string source;
  std::string destination;
  CopyPaths paths;
};

int copy(CopyFields& f, const Global& g) {
  const CopyPaths& p = f.paths;
  return with_sandbox(f.target, g, "the copy may not have finished",
                      [&](sbx::Sandbox& sandbox, Interrupts& interrupts) {
                        if (p.upload) {
                          interrupts.step(sandbox.upload_async(p.local, p.remote));
                        } else if (interrupts.wait_for_fifo_reader(p.local)) {
                          interrupts.step(sandbox.download_async(p.remote, p.local));
                        }
                        return interrupts.stopped();
                      });
}

// ---- status, pause, resume, close --------------------------------------------------------------

struct StatusFields {
  Target target;
  bool json = false;
};

int status(StatusFields& f, const Global& g) {
  return with_sandbox(
      f.target, g, "the status was not read", [&](sbx::Sandbox& sandbox, Interrupts& interrupts) {
        const std::string text(sbx::to_string(interrupts.step(sandbox.status_async())));
        if (f.json) {
          std::cout << boost::json::serialize(
                           boost::json::object{{"id", sandbox.id()}, {"status", text}})
                    << "\n";
        } else {
          std::cout << text << "\n";
        }
        return 0;
      });
}

// The fields of pause, resume and close.
struct SandboxFields {
  Target target;
};

Command one_step_command(std::string name, std::string summary, std::string description,
                         std::string unfinished,
                         std::function<void(sbx::Sandbox&, Interrupts&)> step) {
  return make_command<SandboxFields>({
      .name = std::move(name),
      .summary = std::move(summary),
      .usage = "[options] ID",
      .description = std::move(description),
      .options = target_options<SandboxFields>({}),
      .positionals = {sandbox_argument<SandboxFields>()},
      .handler =
          [unfinished, step](SandboxFields& f, const Global& g) {
            return with_sandbox(f.target, g, unfinished,
                                [&](sbx::Sandbox& sandbox, Interrupts& interrupts) {
                                  step(sandbox, interrupts);
                                  return 0;
                                });
          },
  });
}

const char* const kSandboxExitCodes =
    "Exits 0 when done; 125 when the sandbox is not found (closed, expired, never created) or\n"
    "the provider fails; 2 for usage errors (including a sandbox argument the provider refuses);\n"
    "130 when interrupted.\n";

}  // namespace

Command create_command() {
  return make_command<CreateFields>({
      .name = "create",
      .summary = "Create a sandbox, print its id and leave it running",
      .usage = "[options]",
      .description = std::string(
          "Creates a sandbox, uploads files, prints its id (with --json: its descriptor) and "
          "leaves it\nrunning for sbx exec, cp, status, pause, resume and close, until sbx "
          "close or its --ttl (give\none: without it the sandbox runs until closed). Needs a "
          "provider that can connect to a sandbox\nfrom another process (sbx.connect/1). "
          "Until the id is printed, a failure or a stop closes the\nsandbox. Exits 0; 125 "
          "when the sandbox could not be made; 2 for usage errors; 74 when the id\ncannot be "
          "written; 130 when interrupted.\n"),
      .options =
          [] {
            std::vector<Option<CreateFields>> options =
                options_of(&CreateFields::provider, provider_options());
            append(options, options_of(&CreateFields::sandbox, sandbox_options()));
            options.push_back(flag("--json",
                                   "Print the sandbox's descriptor (JSON) instead of its id",
                                   &CreateFields::json));
            append(options, options_of(&CreateFields::stop, stop_options()));
            return options;
          }(),
      .check = [](CreateFields& f) { f.sandbox.check(); },
      .handler = create,
  });
}

Command exec_command() {
  return make_command<ExecFields>({
      .name = "exec",
      .summary = "Run a command in a sandbox made by sbx create",
      .usage = "[options] ID -- COMMAND [ARG...]",
      .description =
          "Runs COMMAND in the sandbox (one word: a command line for its shell; several: the "
          "program and\nits arguments, without a shell, as docker exec runs them), printing "
          "its\nstdout and stderr as they arrive, and leaves the sandbox running. Exits "
          "with the command's return\ncode; 125 when the sandbox could not run it (timeout, "
          "sandbox not found, backend error); 2 for\nusage errors; 74 when writing the output "
          "failed; 130 when interrupted; 141 when the output's\nreader went away. A stop ends "
          "the command, not the sandbox.\n",
      .options = exec_options(),
      .positionals = {sandbox_argument<ExecFields>()},
      .trailing = Trailing<ExecFields>{"COMMAND [ARG...]",
                                       [](ExecFields& f, std::vector<std::string> words) {
                                         f.command = std::move(words);
                                       }},
      .check =
          [](ExecFields& f) {
            try {
              f.exec.validate();
            } catch (const sbx::InvalidArgumentError& e) {
              throw UsageError(e.what());
            }
          },
      .handler = exec,
  });
}

Command cp_command() {
  return make_command<CopyFields>({
      .name = "cp",
      .summary = "Copy a file into or out of a sandbox made by sbx create",
      .usage = "[options] (LOCAL ID:REMOTE | ID:REMOTE LOCAL)",
      .description = std::string(
          "Copies one file between this machine and the sandbox. The sandbox side is "
          "ID:REMOTE (or\n{DESCRIPTOR}:REMOTE, @FILE:REMOTE); an argument is local when it "
          "has no ':' or starts with '/'\nor '.' (./a:b is a local file). A LOCAL that is a "
          "directory gets the remote file's name; a REMOTE\nending in '/' gets the local "
          "file's name. A relative REMOTE is relative to the sandbox's workdir.\nA download "
          "appears complete or not at all. Exits 0 when done; 74 when the local side failed\n"
          "(e.g. a full disk); 125 when the sandbox is not found or the provider fails; 2 for "
          "usage\nerrors; 130 when interrupted.\n"),
      .options = target_options<CopyFields>({}),
      .positionals = {{"SOURCE", "The file to copy: LOCAL or ID:REMOTE",
                       [](CopyFields& f, const Arg& a) { f.source = a.text; }},
                      {"TARGET", "Where to copy it: ID:REMOTE or LOCAL",
                       [](CopyFields& f, const Arg& a) { f.destination = a.text; }}},
      .check =
          [](CopyFields& f) {
            f.paths = copy_paths(f.source, f.destination);
            f.target.sandbox = f.paths.sandbox;
            if (f.paths.upload) require_readable_file(f.paths.local, "cp");
          },
      .handler = copy,
  });
}

Command status_command() {
  return make_command<StatusFields>({
      .name = "status",
      .summary = "Print a sandbox's status (starting, running, paused, stopped, error, unknown)",
      .usage = "[options] ID",
      .description = std::string("Prints the sandbox's status as the provider reports it.\n") +
                     kSandboxExitCodes,
      .options = target_options<StatusFields>({flag(
          "--json", "Print {\"id\": ..., \"status\": ...} instead of text", &StatusFields::json)}),
      .positionals = {sandbox_argument<StatusFields>()},
      .handler = status,
  });
}

Command pause_command() {
  return one_step_command(
      "pause", "Freeze every process of a sandbox",
      std::string("Freezes every process of the sandbox (sbx.pause/1); its status is then paused, "
                  "and exec and\ncp fail at once until sbx resume. The TTL keeps running.\n") +
          kSandboxExitCodes,
      "the pause may not have happened", [](sbx::Sandbox& sandbox, Interrupts& interrupts) {
        interrupts.step(sandbox.pause_async());
      });
}

Command resume_command() {
  return one_step_command(
      "resume", "Let the processes of a paused sandbox run again",
      std::string("Lets the processes of a sandbox frozen by sbx pause run again.\n") +
          kSandboxExitCodes,
      "the resume may not have happened", [](sbx::Sandbox& sandbox, Interrupts& interrupts) {
        interrupts.step(sandbox.resume_async());
      });
}

Command close_command() {
  return one_step_command(
      "close", "End a sandbox",
      std::string("Ends the sandbox. A first Ctrl-C does not cancel the close: sbx waits for it at "
                  "most\n--stop-timeout seconds (a second Ctrl-C stops waiting).\n") +
          kSandboxExitCodes,
      "the sandbox may still exist; run sbx close again",
      [](sbx::Sandbox& sandbox, Interrupts& interrupts) {
        interrupts.wait(sandbox.close_async());
      });
}

}  // namespace sbx::cli
