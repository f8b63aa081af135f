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

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace sbx::plugin_checks {

// Ends the sandbox through the plugin's close while `box` stays open on the host's side: later
// calls on `box` (and a later close()) reach the plugin with the same handle, which must answer as
// for a sandbox that is gone (docs/conformance.md). Throws the plugin's error when its close
// fails, FailedPreconditionError when `box` is empty or closed.
void close_behind_host(Sandbox& box);

// An upload that does not go through: its source announces `size` bytes of 'x', gives the first
// `given` and then fails its next read (returns -1, as a local file that cannot be read does).
// When `hold` is set the failing read first waits until release() (or 30 s): meanwhile the
// upload is known to be under way (held() says so), so the caller can cancel it there. Either
// way the plugin must fail the upload and leave no partial file (docs/sandbox-semantics.md,
// "Paths").
class FailingUpload {
 public:
  struct Source;  // the stream's state, shared with the plugin's reading thread

  FailingUpload(Sandbox& box, std::string remote_path, int64_t size, int64_t given, bool hold);
  ~FailingUpload();  // releases a held read
  FailingUpload(const FailingUpload&) = delete;
  FailingUpload& operator=(const FailingUpload&) = delete;

  Operation<void>& operation() { return op_; }
  // Waits (at most `limit`) until the source holds its read, i.e. the plugin read `given` bytes
  // and asked for more; false if it did not (e.g. the upload ended first).
  bool held(std::chrono::milliseconds limit);
  // Lets a held read fail now.
  void release();

 private:
  std::shared_ptr<Source> source_;
  Operation<void> op_;
};

}  // namespace sbx::plugin_checks
