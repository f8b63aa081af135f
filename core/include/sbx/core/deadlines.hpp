// sbx::Deadlines: how long the host waits for a provider before it gives up on an operation.
//
// A provider enforces its own timeouts (an exec's timeout_s, a sandbox's ready_timeout_s). The
// host does not trust it to: every operation also has a host-side deadline derived from those
// timeouts. When it passes, the host cancels the operation; if the provider has still not ended
// it after `cancel_grace_s`, the host abandons it: the caller gets a TimeoutError naming the
// provider, and whatever the provider does later is ignored. A caller's own cancel() is bounded
// the same way (CancelledError after `cancel_grace_s`). See docs/decisions.md.
#pragma once

#include <chrono>

namespace sbx {

struct Deadlines {
  double grace_s = 30;           // added to an operation's own timeout (exec timeout_s)
  double cancel_grace_s = 5;     // after a cancel, how long a provider may take to end the op
  double create_s = 1800;        // create; ready_timeout_s + grace_s when that is longer
  double exec_s = 3600;          // exec without timeout_s (the provider's default is unknown)
  double transfer_idle_s = 300;  // upload and download: time without a byte moving
  double call_s = 120;           // status, close, endpoint, list and reap

  // Throws InvalidArgumentError unless every value is a positive number.
  void validate() const;
  // Written out (not defaulted): the public headers stay usable from C++17 hosts.
  bool operator==(const Deadlines& o) const {
    return grace_s == o.grace_s && cancel_grace_s == o.cancel_grace_s && create_s == o.create_s &&
           exec_s == o.exec_s && transfer_idle_s == o.transfer_idle_s && call_s == o.call_s;
  }
  bool operator!=(const Deadlines& o) const { return !(*this == o); }

  std::chrono::milliseconds grace() const { return ms(grace_s); }
  std::chrono::milliseconds cancel_grace() const { return ms(cancel_grace_s); }
  std::chrono::milliseconds create() const { return ms(create_s); }
  std::chrono::milliseconds exec() const { return ms(exec_s); }
  std::chrono::milliseconds transfer_idle() const { return ms(transfer_idle_s); }
  std::chrono::milliseconds call() const { return ms(call_s); }
  // Seconds as milliseconds, rounded up and capped (no overflow for huge values).
  static std::chrono::milliseconds ms(double seconds);
};

}  // namespace sbx
