// For provider authors who prefer blocking code: derive from BlockingProvider and write each method
// as a plain function that returns or throws. The SDK's adapter runs every call on an SDK-owned
// thread pool and completes the operation with what the method returned or threw.
//
// THREADING: methods run concurrently on pool threads, also for one sandbox. Honour `cancel`: poll
// it, or register a std::stop_callback that interrupts whatever the method is blocked on.
#pragma once

#include <sbx/sdk/provider.hpp>
#include <sbx/sdk/thread_pool.hpp>

#include <memory>
#include <string>
#include <vector>

namespace sbx::sdk {

class BlockingProvider {
 public:
  virtual ~BlockingProvider() = default;

  // Returns a ready sandbox. Startup files are written afterwards by write_startup_files().
  virtual std::unique_ptr<Sandbox> create(const Spec& spec, const CancelToken& cancel) = 0;
  // Runs a command, writing its output to `out` as it arrives.
  virtual ExitStatus exec(Sandbox& sandbox, const ExecRequest& request, OutputSink& out,
                          const CancelToken& cancel) = 0;
  virtual void upload(Sandbox& sandbox, const UploadRequest& request, ByteSource& source,
                      const CancelToken& cancel) = 0;
  virtual void download(Sandbox& sandbox, const std::string& remote_path, ByteSink& sink,
                        const CancelToken& cancel) = 0;
  virtual SandboxStatus status(Sandbox& sandbox, const CancelToken& cancel) = 0;
  virtual void close(Sandbox& sandbox, const CancelToken& cancel) = 0;

  // Writes the spec's startup files into a sandbox create() just returned. The default uploads them
  // one by one; override to do better (e.g. one archive). If it throws, the adapter closes the
  // sandbox and fails the create with CREATE_FAILED (CANCELLED if the create was cancelled).
  virtual void write_startup_files(Sandbox& sandbox, const std::vector<StartupFile>& files,
                                   const CancelToken& cancel);

  // Size of the adapter's pool: calls beyond `max_threads` in flight wait in a queue.
  virtual ThreadPool::Options pool_options() const { return {}; }
};

// Optional capabilities, blocking style: derive from these alongside BlockingProvider.
class BlockingEndpoint {
 public:
  virtual Endpoint endpoint(Sandbox& sandbox, uint16_t port, const CancelToken& cancel) = 0;

 protected:
  ~BlockingEndpoint() = default;
};

// `selector`: every pair must match a sandbox's label, key and value; the SDK passes the ABI's
// unset value ("any value", ext/list_reap.h) as an empty string, so an empty value matches any
// value (a label whose value is empty cannot be selected alone). Each SandboxInfo's `id` is the
// same string as that sandbox's Sandbox::id() (the conformance suite's labels.list-reap checks it).
class BlockingListReap {
 public:
  virtual std::vector<SandboxInfo> list(const KeyValues& selector, const CancelToken& cancel) = 0;
  virtual std::vector<SandboxInfo> reap(const KeyValues& selector, const CancelToken& cancel) = 0;

 protected:
  ~BlockingListReap() = default;
};

// ABI 1.1 capabilities (see PauseExtension, ConnectExtension, RenewExtension in provider.hpp).
class BlockingPause {
 public:
  virtual void pause(Sandbox& sandbox, const CancelToken& cancel) = 0;
  virtual void resume(Sandbox& sandbox, const CancelToken& cancel) = 0;

 protected:
  ~BlockingPause() = default;
};

class BlockingConnect {
 public:
  virtual std::string serialize(Sandbox& sandbox, const CancelToken& cancel) = 0;
  virtual Connected connect(const std::string& descriptor, const CancelToken& cancel) = 0;

 protected:
  ~BlockingConnect() = default;
};

class BlockingRenew {
 public:
  virtual int64_t renew(Sandbox& sandbox, int64_t expires_at_unix_ms,
                        const CancelToken& cancel) = 0;

 protected:
  ~BlockingRenew() = default;
};

// sbx.session/1 (ABI 1.2) over the provider's own exec (sdk::ShellSessions, shell_sessions.hpp):
// derive from this too, and the adapter offers persistent shells with no code of the provider's.
// The provider's exec must run `sh -c` in the sandbox and spare the background jobs of a run whose
// env has SBX_SESSION_ID.
class BlockingShellSessions {
 protected:
  ~BlockingShellSessions() = default;
};

// sbx.pty/1 (ABI 1.2) for a BlockingProvider: derive from this too. open_pty and close_pty run on
// the adapter's pool. attach_pty, write_pty and resize_pty run on the host's calling thread and
// must return quickly (hand the completion to an sdk::TerminalOutput, terminal_output.hpp; send
// input without waiting for the process to read it), so the keys one host thread writes reach
// the terminal in the order it wrote them. An exception from any of them fails the call.
class BlockingPty {
 public:
  // Whether this provider offers terminals at all (say, not without its agent). Asked once, when
  // the adapter is made.
  virtual bool offers_pty() const { return true; }
  // Returns the new terminal's id once its process runs.
  virtual std::string open_pty(Sandbox& sandbox, const PtyRequest& request,
                               const CancelToken& cancel) = 0;
  virtual void attach_pty(Sandbox& sandbox, const std::string& id, uint64_t since, bool takeover,
                          PtyAttachCompletion done) = 0;
  virtual void write_pty(Sandbox& sandbox, const std::string& id, std::string_view input) = 0;
  virtual void resize_pty(Sandbox& sandbox, const std::string& id, uint16_t rows,
                          uint16_t cols) = 0;
  virtual void close_pty(Sandbox& sandbox, const std::string& id, const CancelToken& cancel) = 0;

 protected:
  ~BlockingPty() = default;
};

// For a BlockingProvider whose exec need not hold a thread while the command runs (its output
// arrives on an event loop, e.g. the SDK's HTTP client): derive from this too, and the adapter
// calls exec_async() directly on the host's calling thread instead of running
// BlockingProvider::exec on a pool thread, so a thousand commands in flight cost no thousand
// threads. The rules are Provider::exec's (provider.hpp): return quickly, complete `done` exactly
// once from any thread, write output before completing; an exception thrown before `done` is
// handed off fails the exec. BlockingProvider::exec stays for the provider's own blocking callers.
class AsyncExec {
 public:
  // Whether exec_async() runs this sandbox's commands; false sends them to BlockingProvider::exec
  // on the pool, as without AsyncExec (e.g. a sandbox reached by a slower path). Called on the
  // host's calling thread for every exec: it must be quick and must not block.
  virtual bool takes_exec(Sandbox& sandbox) {
    (void)sandbox;
    return true;
  }
  virtual void exec_async(Sandbox& sandbox, ExecRequest request, ExecCompletion done) = 0;

 protected:
  ~AsyncExec() = default;
};

// Runs a BlockingProvider behind the asynchronous Provider interface.
std::unique_ptr<Provider> make_blocking_adapter(std::unique_ptr<BlockingProvider> provider,
                                                Logger log);

}  // namespace sbx::sdk
