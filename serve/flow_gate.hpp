// FlowGate: holds a provider's output while too much of it waits for a slow client, and lets it
// flow again once the client has read most of it (sbx.flow/1; docs/flow-control.md). Used by a
// command's event stream and by a download's body.
#pragma once

#include "state.hpp"

#include <spdlog/spdlog.h>

#include <cstddef>
#include <functional>
#include <mutex>
#include <utility>

namespace sbx::serve {

// THREADING: every member may be called from any thread (a plugin's, the connection's strand).
// The provider is asked by one thread at a time and never under a lock of ours (a provider may
// deliver output from inside its hold_output).
class FlowGate {
 public:
  // Holds once more than `hold_above` bytes wait for the client; releases below `release_below`.
  FlowGate(std::size_t hold_above, std::size_t release_below)
      : hold_above_(hold_above), release_below_(release_below) {}

  // The operation's Operation::hold_output, once it exists: a hold wanted before is applied now.
  void set_hold(std::function<bool(bool)> fn, const ChunkSink* sink) {
    {
      std::lock_guard lock(mutex_);
      hold_fn_ = std::move(fn);
    }
    if (sink) update(*sink);
  }

  // Holds or releases to match what waits in `sink`; asks again while the wish changed meanwhile.
  void update(const ChunkSink& sink) {
    for (;;) {
      std::function<bool(bool)> fn;
      bool want = false;
      {
        std::lock_guard lock(mutex_);
        if (!hold_fn_ || unholdable_ || asking_) return;
        const std::size_t waiting = sink.queued();
        want = held_ ? waiting > release_below_ : waiting > hold_above_;
        if (want == held_) return;
        asking_ = true;
        fn = hold_fn_;
      }
      const bool ok = fn(want);
      std::lock_guard lock(mutex_);
      asking_ = false;
      if (!ok) {
        unholdable_ = true;
        spdlog::debug(
            "sbx serve: the provider cannot hold this output; a slow client gets it "
            "cut past the stream's bound");
        return;
      }
      held_ = want;
    }
  }

  // False once the provider said it cannot hold this output (the caller then bounds it).
  bool can_hold() const {
    std::lock_guard lock(mutex_);
    return !unholdable_;
  }
  bool is_held() const {
    std::lock_guard lock(mutex_);
    return held_;
  }

 private:
  const std::size_t hold_above_;
  const std::size_t release_below_;
  mutable std::mutex mutex_;
  std::function<bool(bool)> hold_fn_;
  bool held_ = false;        // what the provider was last asked
  bool asking_ = false;      // a thread is asking it now
  bool unholdable_ = false;  // the provider said it cannot hold this output
};

}  // namespace sbx::serve
