// sbx run: a sandbox for one command. Creates it, uploads, runs the command with its output
// streamed, downloads, and closes it, also when something fails or on a stop.

#include "commands.hpp"
#include "output.hpp"
#include "shared.hpp"
#include "stop.hpp"

#include <iostream>

namespace sbx::cli {

namespace {

struct RunFields {
  ProviderChoice provider;
  SandboxChoice sandbox;
  sbx::ExecOptions exec;
  std::vector<std::pair<std::string, std::string>> downloads;  // remote, local
  StopChoice stop;
  std::vector<std::string> command;
};

std::vector<Option<RunFields>> run_options() {
  std::vector<Option<RunFields>> options = options_of(&RunFields::provider, provider_options());
  append(options, options_of(&RunFields::sandbox, sandbox_options()));
  append(options, options_of(&RunFields::exec, command_options()));
  options.push_back(repeatable<RunFields>(
      "--download", "REMOTE:LOCAL", "Copy a sandbox file out after the command",
      [](RunFields& f, const Arg& a) { f.downloads.push_back(a.pair(':')); }));
  append(options, options_of(&RunFields::stop, stop_options()));
  return options;
}

// Everything that can be checked here is, before a sandbox exists.
void check(RunFields& f) {
  f.sandbox.check();
  try {
    f.exec.validate();
  } catch (const sbx::InvalidArgumentError& e) {
    throw UsageError(e.what());
  }
}

int run(RunFields& f, const Global& g) {
  Interrupts interrupts(sbx::Deadlines::ms(f.stop.stop_timeout_s));
  sbx::Host host = make_host(g);
  sbx::Provider provider = f.provider.pick(host);

  sbx::Sandbox sandbox;  // closed by RAII on every way out, also a sandbox created despite a stop
  int exit_code = 0;
  try {
    try {
      sandbox = interrupts.step(provider.create_async(f.sandbox.spec));
      if (interrupts.stopped()) {
        interrupts.wait(sandbox.close_async());
        return interrupts.stopped();
      }

      for (const auto& [local, remote] : f.sandbox.uploads)
        interrupts.step(sandbox.upload_async(local, remote));

      f.exec.on_output = stream_output(interrupts);
      const sbx::ExecResult result = interrupts.step(start_exec(sandbox, f.command, f.exec));
      exit_code = exit_status_of(result);
      if (interrupts.stopped()) {
        interrupts.wait(sandbox.close_async());
        return interrupts.stopped();
      }

      for (const auto& [remote, local] : f.downloads) {
        try {
          if (!interrupts.wait_for_fifo_reader(local)) break;
          interrupts.step(sandbox.download_async(remote, local));
        } catch (const sbx::CancelledError&) {
          throw;
        } catch (const sbx::Error& e) {
          std::cerr << "sbx: download of " << remote << " failed: " << e.what() << "\n";
          if (exit_code == 0) exit_code = e.local_errno() != 0 ? kExitLocalIo : kExitFailure;
        }
      }
      interrupts.wait(sandbox.close_async());
      return exit_code;
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

}  // namespace

Command run_command() {
  return make_command<RunFields>({
      .name = "run",
      .summary = "Create a sandbox, run one command in it, close it",
      .usage = "--provider NAME [options] -- COMMAND [ARG...]",
      .description =
          "Creates a sandbox, uploads files, runs COMMAND (one word: a command line for the "
          "sandbox's shell;\nseveral: the program and its arguments, without a shell), prints its "
          "stdout and stderr as they arrive, downloads "
          "files, and closes the\nsandbox, also when something fails or on Ctrl-C. Exits with the "
          "command's return code; 125 when\nthe sandbox could not run it (timeout, backend error, "
          "or a return code no exit status can carry);\n2 for usage errors; 74 when writing the "
          "output or a downloaded file failed (e.g. a full disk; the\ncommand is stopped); 130 "
          "when interrupted (SIGINT, SIGTERM, SIGHUP); 141 when the output's reader\nwent away "
          "(the command is stopped). After a stop, sbx waits at most --stop-timeout seconds for\n"
          "the provider to end the command and close the sandbox (a second Ctrl-C stops waiting "
          "at once),\nthen says what may be left and how to remove it.\n",
      .options = run_options(),
      .trailing = Trailing<RunFields>{"COMMAND [ARG...]",
                                      [](RunFields& f, std::vector<std::string> words) {
                                        f.command = std::move(words);
                                      }},
      .check = check,
      .handler = run,
  });
}

}  // namespace sbx::cli
