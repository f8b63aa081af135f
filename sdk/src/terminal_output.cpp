// TerminalOutput: the kept bytes, the one attachment, and a delivery queue drained by whichever
// thread finds it idle, so that output and completions reach the host in order without a lock
// held during the call.

#include <sbx/abi/ext/pty.h>
#include <sbx/sdk/terminal_output.hpp>

#include <deque>
#include <functional>
#include <mutex>
#include <stop_token>
#include <string>
#include <utility>
#include <variant>

namespace sbx::sdk {

namespace {

struct Chunk {
  StdStream stream;
  uint64_t offset;
  std::string bytes;
};

// One attach: its completion and, while it is live, the stop callback that detaches it.
struct Attachment {
  explicit Attachment(PtyAttachCompletion d) : done(std::move(d)) {}
  PtyAttachCompletion done;
  std::optional<std::stop_callback<std::function<void()>>> on_cancel;
};

}  // namespace

struct TerminalOutput::State : std::enable_shared_from_this<TerminalOutput::State> {
  struct Event {
    std::shared_ptr<Attachment> to;
    // In place (once, first), output, the exit code, or why it ended.
    std::variant<std::monostate, Chunk, int32_t, Error> what;
  };

  mutable std::mutex mutex;
  size_t keep = 0;
  std::deque<Chunk> kept;
  size_t kept_bytes = 0;
  uint64_t end = 0;  // the offset of the next byte
  std::optional<int32_t> exit_code;
  bool closed = false;
  std::optional<Error> closed_by;  // why close() ended it: later attaches are told the same
  std::shared_ptr<Attachment> live;
  std::deque<Event> queue;
  bool draining = false;

  // With the lock held: ends the live attachment (if any) with `why`.
  void end_live_locked(std::variant<std::monostate, Chunk, int32_t, Error> why) {
    if (!live) return;
    queue.push_back({std::exchange(live, nullptr), std::move(why)});
  }

  // Delivers the queue unless another thread (or an outer frame of this one) is at it.
  void drain(std::unique_lock<std::mutex>& lock) {
    if (draining) return;
    draining = true;
    while (!queue.empty()) {
      Event event = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      deliver(event);
      event = Event{};  // the attachment (and its stop callback) may go here, unlocked
      lock.lock();
    }
    draining = false;
  }

  static void deliver(Event& event) {
    PtyAttachCompletion& done = event.to->done;
    if (!done) return;
    if (std::holds_alternative<std::monostate>(event.what)) {
      done.output().attached();
    } else if (auto* chunk = std::get_if<Chunk>(&event.what)) {
      try {
        done.output().write(chunk->stream, chunk->offset, chunk->bytes);
      } catch (...) {
        done.fail_current_exception();
      }
    } else if (auto* code = std::get_if<int32_t>(&event.what)) {
      event.to->on_cancel.reset();
      done.succeed(*code);
    } else {
      event.to->on_cancel.reset();
      done.fail(std::get<Error>(event.what));
    }
  }

  void detach(const std::shared_ptr<Attachment>& attachment) {
    std::unique_lock lock(mutex);
    if (live != attachment) return;  // ended already
    end_live_locked(Error::cancelled("detached"));
    drain(lock);
  }
};

TerminalOutput::TerminalOutput(size_t keep) : state_(std::make_shared<State>()) {
  state_->keep = keep < 64 * 1024 ? 64 * 1024 : keep;
}

TerminalOutput::~TerminalOutput() {
  close();
}

void TerminalOutput::append(StdStream stream, std::string_view bytes) {
  if (bytes.empty()) return;
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  if (s.closed || s.exit_code) return;
  Chunk chunk{stream, s.end, std::string(bytes)};
  s.end += bytes.size();
  if (s.live) s.queue.push_back({s.live, chunk});
  s.kept_bytes += chunk.bytes.size();
  s.kept.push_back(std::move(chunk));
  while (!s.kept.empty() && s.kept_bytes - s.kept.front().bytes.size() >= s.keep) {
    s.kept_bytes -= s.kept.front().bytes.size();
    s.kept.pop_front();
  }
  s.drain(lock);
}

void TerminalOutput::skip_to(uint64_t offset) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (s.kept.empty() && s.end == 0) s.end = offset;
}

void TerminalOutput::exited(int32_t exit_code) {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  if (s.closed || s.exit_code) return;
  s.exit_code = exit_code;
  s.end_live_locked(exit_code);
  s.drain(lock);
}

void TerminalOutput::close() {
  close(Error::not_found("the terminal was closed"));
}

void TerminalOutput::close(Error why) {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  if (s.closed) return;
  s.closed = true;
  s.closed_by = why;
  s.end_live_locked(std::move(why));
  s.drain(lock);
}

void TerminalOutput::attach(uint64_t since, bool takeover, PtyAttachCompletion done) {
  State& s = *state_;
  const CancelToken token = done.cancel_token();
  auto attachment = std::make_shared<Attachment>(std::move(done));
  std::unique_lock lock(s.mutex);
  if (s.closed) {
    const Error why = *s.closed_by;
    lock.unlock();
    return attachment->done.fail(why);
  }
  if (s.live && !takeover) {
    lock.unlock();
    return attachment->done.fail(Error::failed_precondition(
        "the terminal is attached elsewhere; attach with takeover to take it over"));
  }
  ErrorDetails taken;
  taken.reason = SBX_REASON_TAKEN_OVER;
  s.end_live_locked(Error(SBX_STATUS_FAILED_PRECONDITION, "another attach took the terminal over",
                          std::move(taken)));
  s.queue.push_back({attachment, std::monostate{}});  // in place: before its replay
  if (since != SBX_PTY_LIVE) {
    for (const Chunk& chunk : s.kept) {
      const uint64_t chunk_end = chunk.offset + chunk.bytes.size();
      if (chunk_end <= since) continue;
      const size_t skip = since > chunk.offset ? static_cast<size_t>(since - chunk.offset) : 0;
      s.queue.push_back(
          {attachment, Chunk{chunk.stream, chunk.offset + skip, chunk.bytes.substr(skip)}});
    }
  }
  if (s.exit_code) {
    s.queue.push_back({attachment, *s.exit_code});
  } else {
    s.live = attachment;
    std::weak_ptr<State> weak = s.shared_from_this();
    std::weak_ptr<Attachment> weak_attachment = attachment;
    attachment->on_cancel.emplace(token, std::function<void()>([weak, weak_attachment] {
                                    const auto state = weak.lock();
                                    const auto a = weak_attachment.lock();
                                    if (state && a) state->detach(a);
                                  }));
  }
  s.drain(lock);
}

std::optional<int32_t> TerminalOutput::exit_code() const {
  std::lock_guard lock(state_->mutex);
  return state_->exit_code;
}

uint64_t TerminalOutput::end_offset() const {
  std::lock_guard lock(state_->mutex);
  return state_->end;
}

}  // namespace sbx::sdk
