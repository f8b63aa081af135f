// The execd API of a sandbox (run a command over its event stream, ping, upload, download), over
// the SDK's HTTP client. Every request goes to an ExecdEndpoint (lifecycle.hpp): its absolute base
// URL and headers.
//
// THREADING: ExecdClient is thread-safe. Every transfer runs on the client's one loop thread.
// start() runs a command without holding any thread while it runs: its output and its end are
// handed to the caller's callbacks on that loop thread, in order. The other calls block the
// calling thread (an SDK pool thread) until they end.
// SECRETS: the endpoint's headers (access token, in server-proxy mode the API key) are never
// logged.
#pragma once

#include "events.hpp"
#include "lifecycle.hpp"

#include <sbx/sdk/provider.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::opensandbox {

struct CommandRequest {
  std::string command;
  std::optional<std::string> cwd;
  KeyValues envs;
  std::optional<std::chrono::milliseconds> timeout;  // server-enforced, sent in ms
  std::optional<uint32_t> uid;
};

// How a command's event stream ended.
struct CommandOutcome {
  sdk::ExitStatus status;
  std::string command_id;  // the `init` event's id ("" if none came)
};

// The answer of a SandboxCheckFn: an error ends the command with it; nullopt lets it go on.
using Verdict = std::function<void(std::optional<sdk::Error>)>;
// Asks what became of a command's sandbox when execd is silent or cannot be reached: a paused
// sandbox's execd is frozen (it takes connections and never answers), a deleted sandbox's port is
// closed (connection refused), and neither says so itself. Called on the loop thread; answers
// through `verdict` once, from any thread (the provider reads the lifecycle status).
using SandboxCheckFn = std::function<void(Verdict verdict)>;

// A command's output, one stdout/stderr line at a time (its text plus "\n").
using OutputFn = std::function<void(sdk::StdStream stream, std::string_view text)>;
// A command's end: exactly one of `outcome` and `error` is set.
using CommandDoneFn = std::function<void(const CommandOutcome* outcome, const sdk::Error* error)>;

class ExecdClient {
 public:
  ExecdClient(const ConnectionConfig& connection, const OperationConfig& operations,
              sdk::Logger log);
  // Waits (up to 5 s) for the interrupts of cancelled commands still on their way: a host that
  // cancels a command and exits at once (Ctrl-C on `sbx exec`) must not leave it running.
  ~ExecdClient();
  ExecdClient(const ExecdClient&) = delete;
  ExecdClient& operator=(const ExecdClient&) = delete;

  // Starts a command in the foreground and returns at once: each stdout/stderr line goes to
  // `output` as it arrives, then `done` runs once with how the command ended, both on the loop
  // thread (`done` may also run on the thread that cancels, when it cancels between two
  // submissions). A 502 (the proxy reached no execd) is submitted again up to
  // operations.retries more times (0.25 s doubling to 2 s apart, waited for on the loop, not on
  // a thread), then UNAVAILABLE "backend unreachable". A cwd the sandbox refuses (400) is
  // 125/"sandbox" with the reason on stderr. Cancellation through `cancel` aborts the stream,
  // interrupts the command on the server and ends the run with CANCELLED.
  // With `check`: a submission without an answer 1 s after it was sent, or a stream without a
  // byte for 5 s (then 10, 20, ... up to 60 s: execd pings every 3 s), asks `check` whether to
  // go on; so does a submission that could not connect or lost its connection, before its error
  // is reported (`check`'s error wins).
  void start(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
             const CommandRequest& request, OutputFn output, CommandDoneFn done,
             const sdk::CancelToken& cancel, SandboxCheckFn check = {});

  // start(), waiting for the end on the calling thread (the readiness probe, the workdir).
  CommandOutcome run(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
                     const CommandRequest& request, OutputFn output, const sdk::CancelToken& cancel,
                     SandboxCheckFn check = {});

  // GET /ping: true for 200.
  bool ping(const ExecdEndpoint& endpoint, std::chrono::milliseconds timeout,
            const sdk::CancelToken& cancel);

  // A terminal's HTTP half (its WebSocket is sdk::ExecdTerminal's): POST /pty with the JSON
  // `body`, returning the terminal's id, and DELETE /pty/{id} (NOT_FOUND for an unknown id).
  std::string open_pty(const ExecdEndpoint& endpoint, const std::string& body,
                       const sdk::CancelToken& cancel);
  void delete_pty(const ExecdEndpoint& endpoint, const std::string& id,
                  const sdk::CancelToken& cancel);

  // POST /files/upload (multipart, streamed from `source` on the calling thread).
  // With `check`: a transfer that makes no progress (no byte sent or received) for 1 s, then
  // 5, 10, 20, ... up to 60 s, asks `check` whether to go on; its error ends the transfer (a
  // sandbox paused behind the handle takes the connection and never answers).
  void upload(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
              const sdk::UploadRequest& request, sdk::ByteSource& source,
              const sdk::CancelToken& cancel, SandboxCheckFn check = {});
  // GET /files/download, streamed into `sink` on the calling thread; nothing is written unless
  // the answer is 200. NOT_FOUND for a missing file or sandbox; every error names the path.
  // `check` as for upload().
  void download(const ExecdEndpoint& endpoint, const std::string& sandbox_id,
                const std::string& path, sdk::ByteSink& sink, const sdk::CancelToken& cancel,
                SandboxCheckFn check = {});

 private:
  class Run;
  class TransferWatch;

  ConnectionConfig connection_;
  OperationConfig operations_;
  sdk::Logger log_;
  // Interrupts (DELETE /command) sent and not yet answered.
  std::mutex interrupts_mutex_;
  std::condition_variable interrupts_done_;
  int interrupts_pending_ = 0;
  sdk::http::Client http_;  // last: destroyed first, ending every run while the rest still lives
};

// Whether a request failed before any answer: it could not connect, or lost its connection (an
// UNAVAILABLE transport error, no HTTP status). A paused or deleted sandbox looks like this.
bool reached_no_answer(const sdk::Error& error);

}  // namespace sbx::opensandbox
