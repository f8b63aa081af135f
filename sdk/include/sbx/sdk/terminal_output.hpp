// sbx::sdk::TerminalOutput: a terminal's output kept and delivered as sbx.pty/1 asks
// (sbx/abi/ext/pty.h), for a provider that reads the terminal itself. The provider appends what
// the process writes and says when it exited; TerminalOutput numbers the bytes, keeps the latest
// `keep` of them, replays from an offset on attach, holds at most one attachment (takeover ends
// the old one with FAILED_PRECONDITION and reason taken_over), ends it with the exit code, and
// treats the host's cancel as a detach.
//
// THREADING: every member is thread-safe. append() must be called from one thread at a time (the
// reader), in the order the bytes were written. Attachments hear their output in order, one call
// at a time, and never while a lock of TerminalOutput is held (a host may attach, write or cancel
// from inside its callback).
#pragma once

#include <sbx/sdk/provider.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

namespace sbx::sdk {

class TerminalOutput {
 public:
  explicit TerminalOutput(size_t keep = size_t{1} << 20);  // the ABI asks for at least 64 KiB
  // Ends an attachment still live with NOT_FOUND, as close() does.
  ~TerminalOutput();
  TerminalOutput(const TerminalOutput&) = delete;
  TerminalOutput& operator=(const TerminalOutput&) = delete;

  // What the process wrote (stdout, or stderr in pipe mode). Ignored after exited() or close().
  void append(StdStream stream, std::string_view bytes);
  // The next byte's offset is `offset`: for a terminal taken up with its first bytes already
  // gone (a replay that starts later). Only before the first append; a smaller offset is ignored.
  void skip_to(uint64_t offset);
  // The process ended (its exit code, or 128 + the signal): the attachment completes with it,
  // after its last output, and later attachments replay, then complete at once.
  void exited(int32_t exit_code);
  // `since`: the offset to replay from, or SBX_PTY_LIVE. With takeover false and an attachment
  // live, fails `done` at once with FAILED_PRECONDITION.
  void attach(uint64_t since, bool takeover, PtyAttachCompletion done);
  // The terminal is gone: the attachment ends with NOT_FOUND, and so does every later attach.
  void close();
  // The same, but the attachment, and every later attach, ends with `why` (say, the server's
  // reason for ending it, or FAILED_PRECONDITION with reason taken_over when a client elsewhere
  // took the terminal over).
  void close(Error why);

  std::optional<int32_t> exit_code() const;
  uint64_t end_offset() const;  // how many bytes the process has written

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace sbx::sdk
