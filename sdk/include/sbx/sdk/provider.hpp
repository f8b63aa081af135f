// The asynchronous provider interface: a provider is one C++ class deriving from
// sbx::sdk::Provider. The SDK's trampolines (plugin.hpp) turn the C ABI calls into these virtual
// calls, copy every borrowed argument, catch every exception, and guarantee each operation
// completes exactly once. Authors who prefer blocking code derive from BlockingProvider
// (blocking.hpp).
//
// THREADING: every method may be called concurrently from any host thread, also for one sandbox.
// A method starts the work and returns; it completes the operation later, from any thread, by
// calling succeed() or fail() on its Completion (or by throwing before it hands the Completion
// off). Never hold a lock of your own while completing: the host may start new operations from
// inside its callback.
#pragma once

#include <sbx/sdk/cancel.hpp>
#include <sbx/sdk/error.hpp>
#include <sbx/sdk/log.hpp>
#include <sbx/sdk/types.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::sdk {

// A provider's sandbox. Subclass it to keep backend state; the SDK owns it once create succeeds and
// deletes it when the host releases the handle (after every operation on it has completed).
class Sandbox {
 public:
  explicit Sandbox(std::string id) : id_(std::move(id)) {}
  virtual ~Sandbox() = default;
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  const std::string& id() const noexcept { return id_; }

 private:
  std::string id_;
};

// Receives a command's output as it is produced. Call write() from one thread at a time, in order,
// before completing the exec.
class OutputSink {
 public:
  virtual void write(StdStream stream, std::string_view bytes) = 0;

 protected:
  ~OutputSink() = default;
};

// The contents of an upload (sbx_input_stream). Valid until the upload completes.
class ByteSource {
 public:
  explicit ByteSource(const sbx_input_stream& stream) : stream_(stream) {}
  int64_t size() const noexcept { return stream_.size; }
  // Reads up to `capacity` bytes; returns 0 at the end. Throws Error::internal when the host's
  // stream fails.
  size_t read(char* buffer, size_t capacity);

 private:
  sbx_input_stream stream_;
};

namespace detail {
class OpBase;
template <class T>
class Op;
class OutputFlow;
}  // namespace detail

// Where a download's bytes go (sbx_output_stream). Valid until the download completes.
class ByteSink {
 public:
  explicit ByteSink(const sbx_output_stream& stream, detail::OpBase* op = nullptr,
                    detail::OutputFlow* flow = nullptr)
      : stream_(stream), op_(op), flow_(flow) {}
  // Announces the number of bytes the download will write, before the first write, when the
  // provider knows it (the file's size, a Content-Length): a host may then stream the file on
  // instead of keeping it whole first (ABI 1.3; older hosts are not asked). Writing another
  // number of bytes fails the download. Throws Error::cancelled when the host refuses.
  void expect_size(uint64_t size);
  // Throws Error::cancelled when the host's sink refuses the bytes. With hold_by_blocking_writes,
  // waits while the host holds the download (sbx.flow/1).
  void write(std::string_view bytes);

  // Flow (sbx.flow/1, ABI 1.3; docs/flow-control.md), as ExecCompletion's: a download whose host
  // passes its bytes on slowly is held, the provider then stops reading from its backend. Without
  // either call the download cannot be held. Call before the first write, once.
  //
  // fn(true) stops reading the file from the backend, fn(false) reads again; called from any
  // thread, also from inside write(); must not block. At most SBX_FLOW_SLACK bytes may still be
  // written after fn(true).
  void on_hold(std::function<void(bool hold)> fn);
  // For writes from a thread of the provider's own that may wait (BlockingProvider's downloads
  // are held this way already): write() waits while the download is held.
  void hold_by_blocking_writes();

 private:
  sbx_output_stream stream_;
  detail::OpBase* op_;
  detail::OutputFlow* flow_;
  bool expected_ = false;
};

namespace detail {
// What every Completion shares: one reference to the operation, failing it, and its cancellation.
class CompletionBase {
 public:
  CompletionBase(CompletionBase&& other) noexcept : op_(std::exchange(other.op_, nullptr)) {}
  CompletionBase& operator=(CompletionBase&& other) noexcept;
  ~CompletionBase();

  void fail(const Error& error);
  // Inside a catch block: fails with the exception being handled (any type).
  void fail_current_exception();
  // Cancellation requested by the host for this operation.
  CancelToken cancel_token() const;
  explicit operator bool() const noexcept { return op_ != nullptr; }

 protected:
  explicit CompletionBase(OpBase* op);
  // Gives up the reference, for succeed(); the caller releases it after delivering.
  OpBase* take() noexcept { return std::exchange(op_, nullptr); }

 private:
  void reset() noexcept;
  OpBase* op_ = nullptr;
};
}  // namespace detail

// Completes one operation exactly once, with a value or an error. Move-only. A Completion that is
// destroyed without completing fails the operation with an INTERNAL error (so a provider bug cannot
// leave the host waiting forever). succeed/fail consume it: a second call, or a call on a
// moved-from Completion, does nothing (check with `operator bool`).
template <class T>
class Completion : public detail::CompletionBase {
 public:
  explicit Completion(detail::Op<T>* op);
  void succeed(T value);
};

template <>
class Completion<void> : public detail::CompletionBase {
 public:
  explicit Completion(detail::Op<void>* op);
  void succeed();
};

// An exec's completion plus the sink for its output.
class ExecCompletion : public Completion<ExitStatus> {
 public:
  ExecCompletion(detail::Op<ExitStatus>* op, OutputSink* sink, detail::OutputFlow* flow = nullptr)
      : Completion<ExitStatus>(op), sink_(sink), flow_(flow) {}
  // Valid until the exec completes.
  OutputSink& output() const noexcept { return *sink_; }

  // Output flow (sbx.flow/1, ABI 1.3; docs/flow-control.md): how this exec honours the host's
  // hold of its output, so that a slow reader makes the command wait instead of losing output.
  // Without either call, the exec's output cannot be held (the host then keeps or drops it).
  //
  // A provider that reads its backend itself (a stream on an event loop) registers `fn`:
  // fn(true) stops reading the command's output from the backend, fn(false) reads again. It is
  // called from any thread, also from inside output().write(), must not block, and runs at once
  // when the host held the output before the registration. At most SBX_FLOW_SLACK bytes may
  // still be written after fn(true). Call before completing, once.
  void on_hold(std::function<void(bool hold)> fn) const;
  // For a provider whose writes come from a thread of its own that may wait (the blocking
  // adapter's pool thread, inside a detail::WritesMayWait scope): output().write() on that thread
  // then waits while the output is held, until it is released or the exec is cancelled; writes
  // from other threads never wait. BlockingProvider's exec is held this way already.
  void hold_by_blocking_writes() const;

 private:
  OutputSink* sink_;
  detail::OutputFlow* flow_;
};

// Optional capability sbx.endpoint/1: derive from it alongside Provider to offer it.
class EndpointExtension {
 public:
  virtual void endpoint(Sandbox& sandbox, uint16_t port, Completion<Endpoint> done) = 0;

 protected:
  ~EndpointExtension() = default;
};

// Optional capability sbx.list-reap/1.
class ListReapExtension {
 public:
  // Sandboxes of this provider kind whose labels match `selector` (see ext/list_reap.h).
  virtual void list(KeyValues selector, Completion<std::vector<SandboxInfo>> done) = 0;
  // Force-removes them; completes with the ones removed.
  virtual void reap(KeyValues selector, Completion<std::vector<SandboxInfo>> done) = 0;

 protected:
  ~ListReapExtension() = default;
};

// Optional capability sbx.pause/1 (ABI 1.1, ext/pause.h): freeze and thaw a sandbox. While it is
// paused, status() must report SandboxStatus::paused and exec, upload and download must fail at
// once with Error::failed_precondition.
class PauseExtension {
 public:
  virtual void pause(Sandbox& sandbox, Completion<void> done) = 0;
  virtual void resume(Sandbox& sandbox, Completion<void> done) = 0;

 protected:
  ~PauseExtension() = default;
};

// A sandbox reached through sbx.connect/1, with what its create told the host.
struct Connected {
  std::unique_ptr<Sandbox> sandbox;
  std::optional<std::string> workdir;
  std::vector<uint16_t> ports;
};

// Optional capability sbx.connect/1 (ABI 1.1, ext/connect.h): a sandbox handle as a descriptor
// (JSON text with "format": "sbx.descriptor/1", "provider" and "sandbox_id"), and back.
class ConnectExtension {
 public:
  virtual void serialize(Sandbox& sandbox, Completion<std::string> done) = 0;
  // Fails with INVALID_ARGUMENT for a malformed descriptor or one of another provider, NOT_FOUND
  // for a sandbox that is gone.
  virtual void connect(std::string descriptor, Completion<Connected> done) = 0;

 protected:
  ~ConnectExtension() = default;
};

// Optional capability sbx.renew/1 (ABI 1.1, ext/renew.h): move a sandbox's expiry, for real (a
// provider that cannot honour it without a host process does not offer this).
class RenewExtension {
 public:
  // Completes with the expiry now in force (Unix milliseconds, possibly rounded up).
  virtual void renew(Sandbox& sandbox, int64_t expires_at_unix_ms, Completion<int64_t> done) = 0;

 protected:
  ~RenewExtension() = default;
};

// Receives one attachment's output from a terminal (ext/pty.h): bytes with their offset in the
// terminal's output. Call write() from one thread at a time, in order, before completing.
class PtyOutputSink {
 public:
  // The attachment is in place (the terminal exists and this attachment holds it): once, before
  // any write (ABI 1.3's on_attached). sdk::TerminalOutput calls it.
  virtual void attached() = 0;
  virtual void write(StdStream stream, uint64_t offset, std::string_view bytes) = 0;

 protected:
  ~PtyOutputSink() = default;
};

// An attachment's completion (the process's exit code, or why the attachment ended) plus its
// output. Cancellation (cancel_token()) is the host detaching: fail with Error::cancelled().
class PtyAttachCompletion : public Completion<int32_t> {
 public:
  PtyAttachCompletion(detail::Op<int32_t>* op, PtyOutputSink* sink)
      : Completion<int32_t>(op), sink_(sink) {}
  // Valid until the attachment completes.
  PtyOutputSink& output() const noexcept { return *sink_; }

 private:
  PtyOutputSink* sink_;
};

// Optional capability sbx.session/1 (ABI 1.2, ext/session.h): persistent shells. A provider whose
// exec runs `sh -c` can offer it without code of its own by deriving from sdk::ShellSessions
// (shell_sessions.hpp).
class SessionExtension {
 public:
  // Completes with the new session's id (1..128 bytes of [A-Za-z0-9_.:-]).
  virtual void open_session(Sandbox& sandbox, SessionRequest request,
                            Completion<std::string> done) = 0;
  // One command in the session, with exec's outcomes; `request.user` is ignored.
  virtual void run_in_session(Sandbox& sandbox, std::string session_id, ExecRequest request,
                              ExecCompletion done) = 0;
  // Kills the session's runs still going; NOT_FOUND for an id not known.
  virtual void close_session(Sandbox& sandbox, std::string session_id, Completion<void> done) = 0;

 protected:
  ~SessionExtension() = default;
};

// Optional capability sbx.pty/1 (ABI 1.2, ext/pty.h): terminals. sdk::TerminalOutput
// (terminal_output.hpp) keeps a terminal's output and its attachment as the ABI asks.
class PtyExtension {
 public:
  // Completes with the new terminal's id once its process runs.
  virtual void open_pty(Sandbox& sandbox, PtyRequest request, Completion<std::string> done) = 0;
  // `since`: an offset, or SBX_PTY_LIVE.
  virtual void attach_pty(Sandbox& sandbox, std::string id, uint64_t since, bool takeover,
                          PtyAttachCompletion done) = 0;
  virtual void write_pty(Sandbox& sandbox, std::string id, std::string input,
                         Completion<void> done) = 0;
  // rows and cols are never 0 (the SDK refuses them).
  virtual void resize_pty(Sandbox& sandbox, std::string id, uint16_t rows, uint16_t cols,
                          Completion<void> done) = 0;
  virtual void close_pty(Sandbox& sandbox, std::string id, Completion<void> done) = 0;

 protected:
  ~PtyExtension() = default;
};

// What a provider's constructor receives besides its config.
struct ProviderContext {
  const sbx_host* host = nullptr;  // scoped to this provider; outlives it
  Logger log;
};

class Provider {
 public:
  virtual ~Provider() = default;

  // Creates a sandbox that is ready to run commands, with spec.files written.
  virtual void create(Spec spec, Completion<std::unique_ptr<Sandbox>> done) = 0;
  virtual void exec(Sandbox& sandbox, ExecRequest request, ExecCompletion done) = 0;
  virtual void upload(Sandbox& sandbox, UploadRequest request, ByteSource& source,
                      Completion<void> done) = 0;
  virtual void download(Sandbox& sandbox, std::string remote_path, ByteSink& sink,
                        Completion<void> done) = 0;
  virtual void status(Sandbox& sandbox, Completion<SandboxStatus> done) = 0;
  // Ends the sandbox; a sandbox that is already gone is success.
  virtual void close(Sandbox& sandbox, Completion<void> done) = 0;

  // Extensions offered; by default whatever this object also derives from.
  virtual EndpointExtension* endpoint_extension() { return dynamic_cast<EndpointExtension*>(this); }
  virtual ListReapExtension* list_reap_extension() {
    return dynamic_cast<ListReapExtension*>(this);
  }
  virtual PauseExtension* pause_extension() { return dynamic_cast<PauseExtension*>(this); }
  virtual ConnectExtension* connect_extension() { return dynamic_cast<ConnectExtension*>(this); }
  virtual RenewExtension* renew_extension() { return dynamic_cast<RenewExtension*>(this); }
  virtual SessionExtension* session_extension() { return dynamic_cast<SessionExtension*>(this); }
  virtual PtyExtension* pty_extension() { return dynamic_cast<PtyExtension*>(this); }
};

}  // namespace sbx::sdk

#include <sbx/sdk/detail/operation.hpp>
