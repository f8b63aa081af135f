// The graceful stop's bookkeeping (internal to serve): StopGate counts what a stop waits for and
// says when the server is finished.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>

namespace sbx::serve {

// What a stop waits for and what it refuses: the requests being answered, the sandbox closes and
// the creates in flight, the commands running and the command streams open. Once the server
// stops (stop()) and no request, close or create is left, it is finished: the `on_finished`
// callback given to the constructor runs, once (it stops the io_context, so run() returns). When
// the grace period passes first, give_up() finishes it instead, with all_closed() false.
//
// THREADING: every member is thread-safe. The gate's mutex is a leaf: no other lock is taken
// under it, and a caller calls it holding no serve lock (nor Registry's). on_finished runs on the
// thread whose call made the finish, after the mutex is released; it must not block.
//
// OWNERSHIP: owned by Server::State (one per server); holds counts only. Each count goes up and
// down through a pair of members; a caller that makes one go up makes it come down once.
class StopGate {
 public:
  explicit StopGate(std::function<void()> on_finished) : on_finished_(std::move(on_finished)) {}

  // --- requests: read and not yet answered (a stop lets them finish) ---------------------
  void enter_request();
  void leave_request();  // may finish

  // --- sandbox closes in flight (deletes, the TTL's, the stop's) -------------------------
  void begin_close();
  void end_close();  // may finish

  // --- creates in flight (a stop waits for them) -----------------------------------------
  // False (nothing counted) once the server stops: the create is refused.
  bool begin_create();
  // The create ended; `then_closing`: its sandbox is closed (counted as a close in the same
  // step, so that it is counted as one or the other throughout). May finish.
  void end_create(bool then_closing);

  // --- commands and their event streams --------------------------------------------------
  enum class StreamAdmit { ok, stopping, full };
  // Counts an open stream and (`command`) a running command, unless the server stops or
  // `max_streams` streams are open already (0: no limit). A stream that is no command (a metrics
  // watch) is not waited for by a stop.
  StreamAdmit try_open_stream(std::size_t max_streams, bool command = true);
  void close_stream();
  void command_ended();  // may finish
  int running_commands() const;
  int open_streams() const;

  // --- the stop --------------------------------------------------------------------------
  // The server stops, with `closing` sandbox closes counted in the same step (the registry's
  // sandboxes the stop took). False (nothing counted) when it was stopping already. Does not
  // finish by itself: finish_if_done() does, once the stop's closes are started.
  bool stop(int closing);
  bool stopping() const;
  // Finishes if the server stops and nothing is left (what each `may finish` member checks).
  void finish_if_done();
  // The grace period passed: finishes now unless finished already, with all_closed() false. What
  // was still in flight, for the log; nullopt when it had finished already.
  struct Left {
    int closing = 0;
    int creating = 0;
  };
  std::optional<Left> give_up();
  // False when the grace period passed before the finish (give_up).
  bool all_closed() const;

 private:
  // Sets finished_ when due; true when this call did (the caller then runs on_finished_).
  bool finish_due_locked();
  void finish_if_due_locked(std::unique_lock<std::mutex>& lock);

  const std::function<void()> on_finished_;
  mutable std::mutex mutex_;  // guards what follows
  int closing_ = 0;
  int creating_ = 0;
  int answering_ = 0;
  int open_streams_ = 0;
  int running_commands_ = 0;
  bool stopping_ = false;
  bool finished_ = false;
  bool all_closed_ = true;
};

}  // namespace sbx::serve
