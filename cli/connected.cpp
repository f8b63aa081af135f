// The connect-act-detach frame of the commands on one existing sandbox (connected.hpp).

#include "connected.hpp"

#include <iostream>

namespace sbx::cli {

namespace {

constexpr const char* kConnectExtension = "sbx.connect/1";

// Connects to the sandbox `ref` names. A sandbox argument the provider refuses is a usage error;
// a sandbox it does not find is a NotFoundError saying so.
sbx::Sandbox connect(Interrupts& interrupts, const sbx::Provider& provider, const SandboxRef& ref) {
  try {
    return interrupts.step(provider.connect_async(ref.descriptor));
  } catch (const sbx::InvalidArgumentError& e) {
    throw UsageError("provider '" + provider.name() +
                     "' refused the sandbox argument: " + e.what());
  } catch (const sbx::NotFoundError& e) {
    throw sbx::NotFoundError("sandbox " + ref.id + " not found by provider '" + provider.name() +
                             "' (closed, expired, or never created): " + e.what());
  }
}

}  // namespace

void require_connect(const sbx::Provider& provider) {
  if (!provider.supports(kConnectExtension)) {
    throw sbx::UnimplementedError("provider '" + provider.name() +
                                  "' does not support connecting to an existing sandbox (" +
                                  kConnectExtension +
                                  "), which sbx create, exec, cp, status, pause, resume, close and "
                                  "shell need; sbx run works with "
                                  "every provider");
  }
}

int with_sandbox(const Target& target, const Global& g, const std::string& unfinished,
                 const Act& act) {
  Interrupts interrupts(sbx::Deadlines::ms(target.stop.stop_timeout_s));
  sbx::Host host = make_host(g);
  sbx::Provider provider = target.provider.pick(host);
  require_connect(provider);
  sbx::Sandbox sandbox;
  struct Detach {
    sbx::Sandbox& sandbox;
    ~Detach() { sandbox.detach(); }  // never closed here: this process did not make it
  } detach{sandbox};
  try {
    try {
      sandbox = connect(interrupts, provider, target.sandbox);
      if (interrupts.stopped()) return interrupts.stopped();
      const int code = act(sandbox, interrupts);
      return interrupts.stopped() ? interrupts.stopped() : code;
    } catch (const sbx::CancelledError&) {
      if (!interrupts.stopped()) throw;
      if (interrupts.stopped() == kExitInterrupted) std::cerr << "sbx: interrupted\n";
      return interrupts.stopped();
    }
  } catch (const GaveUp&) {
    leave_now(interrupts.stopped(), provider.name(),
              sandbox.valid() ? unfinished + " (sandbox " + target.sandbox.id + ")"
                              : "sandbox " + target.sandbox.id + " was not reached");
  }
}

}  // namespace sbx::cli
