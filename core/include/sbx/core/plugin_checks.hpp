// For the provider conformance suite (conformance, `sbx conformance`): ways to reach a
// plugin's own answers past the host's guards. Applications have no use for them.
//
// The host answers some calls itself: after close() it refuses exec, upload and download with
// FailedPreconditionError, says `stopped` without asking, and does not call the plugin's close
// again. A plugin must still answer those calls right for a sandbox that went away behind the
// host's back (expired, closed by another process, reaped), and these hooks let the suite ask it.
//
// THREADING: as the Sandbox calls (any thread).
#pragma once

#include <sbx/core/sandbox.hpp>

namespace sbx::plugin_checks {

// Ends the sandbox through the plugin's close while `box` stays open on the host's side: later
// calls on `box` (and a later close()) reach the plugin with the same handle, which must answer as
// for a sandbox that is gone (docs/conformance.md). Throws the plugin's error when its close
// fails, FailedPreconditionError when `box` is empty or closed.
void close_behind_host(Sandbox& box);

}  // namespace sbx::plugin_checks
