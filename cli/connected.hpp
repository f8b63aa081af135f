// What the commands on one existing sandbox share (cmd_sandbox.cpp: exec, cp, status, pause,
// resume, close; cmd_shell.cpp: shell): the target (--provider, the ID argument, --stop-timeout)
// and the connect-act-detach frame around each.
#pragma once

#include "args.hpp"
#include "shared.hpp"
#include "stop.hpp"
#include "target.hpp"

#include <sbx/sbx.hpp>

#include <functional>
#include <string>
#include <vector>

namespace sbx::cli {

// The sandbox a command connects to, and how.
struct Target {
  ProviderChoice provider;
  SandboxRef sandbox;
  StopChoice stop;
};

// --provider and --stop-timeout of a command with a Target.
template <class F>
std::vector<Option<F>> target_options(std::vector<Option<F>> own) {
  std::vector<Option<Target>> provider = options_of(&Target::provider, provider_options());
  std::vector<Option<F>> options = options_of(&F::target, provider);
  append(options, std::move(own));
  append(options, options_of(&F::target, options_of(&Target::stop, stop_options())));
  return options;
}

// The ID argument of a command with a Target.
template <class F>
Positional<F> sandbox_argument() {
  return {"ID",
          "The sandbox: its id as sbx create printed it, a descriptor ({...}, as\n"
          "sbx create --json prints it), or @FILE holding one (@- for stdin)",
          [](F& f, const Arg& a) { f.target.sandbox = sandbox_ref(a); }};
}

// What a command does once connected; returns its exit code.
using Act = std::function<int(sbx::Sandbox&, Interrupts&)>;

// Refuses (UnimplementedError) a provider that cannot connect to a sandbox from another process.
void require_connect(const sbx::Provider& provider);

// Connects to the target, runs `act`, and detaches on every way out. A stop cancels the step in
// progress and exits with its code; when the provider does not finish within --stop-timeout,
// sbx leaves saying `unfinished` (what may not have happened) of the sandbox.
int with_sandbox(const Target& target, const Global& g, const std::string& unfinished,
                 const Act& act);

}  // namespace sbx::cli
