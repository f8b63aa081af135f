// A fake host for a plugin's unit tests: it drives a plugin through the raw C ABI in the test's own
// process, without the sbx command or the host library, and records everything the plugin does.
//
//   sbx::sdk::testing::FakeHost host(&sbx_plugin_entry);     // or FakeHost::load("hello.so")
//   auto provider = host.provider("hello");                   // config "{}"
//   auto box = provider.create();                             // blocking helpers: short tests
//   auto r = provider.exec(box, "echo hi");                   // r.return_code, r.stdout_text
//   host.advance(std::chrono::seconds(30));                   // the plugin's clock, no sleeping
//   CHECK(host.problems().empty());                           // exactly-once completion held
//
// What it does:
// - fills an sbx_host whose log records every line (logs(), wait_for_log()) and whose now_ns is a
//   controllable clock (now(), advance()): plugins built on the SDK measure behaviour on it
//   (sbx/sdk/clock.hpp), so a test advances time instead of sleeping;
// - calls init (and deinit in the destructor), creates providers through their factory;
// - records every callback of every operation (output chunks in order, completions), and counts
//   completions: a second completion, or none before the operation's wait gives up (Options::
//   completion_timeout of real time; the operation is then cancelled), is a problem (problems());
// - a test that advances the clock should do so only once the plugin has taken the deadline it
//   tests (wait_for_log() on a line the plugin writes after that), or the deadline moves too.
// - offers blocking helpers (create, exec, upload, download, status, close, release) and an
//   asynchronous start (start_exec) for tests that cancel or advance the clock while it runs;
// - has switches that break the ABI contract on purpose (Options, Misbehaviour), to test that a
//   plugin or the SDK's checks (SBX_SDK_CHECKS) notice.
//
// THREADING: a FakeHost and its providers are used from the test's thread; the plugin may call the
// host's callbacks from any thread (recording is thread-safe). OWNERSHIP: the FakeHost owns the
// plugin's init/deinit pair and, for load(), the library; FakeProvider owns its sbx_provider and
// must not outlive its FakeHost. Records of callbacks stay alive as long as the FakeHost, so a
// late (second) completion is recorded, never a use after free.
#pragma once

#include <sbx/abi/entry.h>
#include <sbx/abi/host.h>
#include <sbx/abi/provider.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::sdk::testing {

// A failure of the fake host itself or of a plugin's synchronous call (init, a factory); the
// message says which.
class FakeHostError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An sbx_error, copied.
struct ErrorInfo {
  sbx_status status = SBX_STATUS_OK;
  std::string message;
  bool retryable = false;
  int32_t http_status = 0;
  std::string request_id;
  std::string reason;  // ABI 1.2; empty from an older writer
};

struct LogLine {
  int32_t level = SBX_LOG_INFO;
  std::string message;
};

// One output chunk as on_output received it.
struct OutputChunk {
  int32_t stream = 1;  // 1 stdout, 2 stderr
  std::string bytes;
};

struct ExecOutcome {
  bool completed = false;          // false: no completion within the wait
  std::optional<ErrorInfo> error;  // set when the exec failed
  int32_t return_code = 0;
  std::optional<std::string> error_type;
  std::vector<OutputChunk> chunks;  // streamed output, in order
  std::string stdout_text;          // streamed chunks (or the result's bytes) of each stream
  std::string stderr_text;
};

// The outcome of an operation without a value (upload, download, close, pause...).
struct DoneOutcome {
  bool completed = false;
  std::optional<ErrorInfo> error;
  bool ok() const { return completed && !error; }
};

struct CreateRequest {
  std::optional<std::string> image;
  std::optional<int64_t> ttl_ms;
  std::optional<int64_t> ready_timeout_ms;
  std::optional<std::string> workdir;
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;
  std::string provider_options;  // JSON object text; empty = unset
};

struct ExecOptions {
  std::optional<std::string> cwd;
  std::map<std::string, std::string> env;
  std::optional<int64_t> timeout_ms;
  std::optional<std::string> user;
  bool stream = true;  // false: on_output is NULL and the result carries the bytes
};

// Switches that break the contract on purpose, for one provider's next calls.
struct Misbehaviour {
  bool null_on_complete = false;      // callbacks whose on_complete is NULL
  bool release_handle_twice = false;  // sbx_operation.release twice once the operation completed
  bool cancel_after_release = false;  // sbx_operation.cancel after its release
};

class FakeHost;
class FakeProvider;
struct OpRecord;   // fake_host.cpp
struct Callbacks;  // fake_host.cpp

// A sandbox handle from create; released by FakeProvider::release (or the provider's destructor).
struct FakeSandbox {
  sbx_sandbox* raw = nullptr;
  std::string id;
  explicit operator bool() const { return raw != nullptr; }
};

// An exec in flight, started by FakeProvider::start_exec.
class PendingExec {
 public:
  // Waits (real time, at most Options::completion_timeout) for the completion; a missing one is
  // recorded as a problem and the operation is cancelled. Releases the operation handle.
  ExecOutcome wait();
  // True once on_complete was called.
  bool completed() const;
  // sbx_operation.cancel.
  void cancel();
  // The output recorded so far.
  std::vector<OutputChunk> chunks() const;

  PendingExec(PendingExec&&) noexcept;
  PendingExec& operator=(PendingExec&&) noexcept;
  ~PendingExec();

 private:
  friend class FakeProvider;
  PendingExec(FakeHost* host, std::shared_ptr<OpRecord> record, sbx_operation* op,
              Misbehaviour misbehaviour);
  FakeHost* host_;
  std::shared_ptr<OpRecord> record_;
  sbx_operation* op_;
  Misbehaviour misbehaviour_;
};

class FakeProvider {
 public:
  FakeProvider(FakeProvider&&) noexcept;
  FakeProvider& operator=(FakeProvider&&) = delete;
  // Releases the sandboxes not released yet, then destroys the provider.
  ~FakeProvider();

  sbx_provider* raw() const noexcept { return provider_; }
  // The contract-breaking switches for the calls that follow.
  Misbehaviour misbehave;

  // Blocking helpers: each starts the operation, waits for its completion (a missing one is
  // recorded as a problem and the operation cancelled) and releases the operation handle.
  FakeSandbox create(const CreateRequest& request = {});  // throws FakeHostError when create fails
  std::optional<ErrorInfo> create_error(const CreateRequest& request = {});  // expects a failure
  ExecOutcome exec(const FakeSandbox& sandbox, std::string_view command,
                   const ExecOptions& options = {});
  PendingExec start_exec(const FakeSandbox& sandbox, std::string_view command,
                         const ExecOptions& options = {});
  DoneOutcome upload(const FakeSandbox& sandbox, std::string_view remote_path,
                     std::string_view contents, uint32_t mode = 0);
  // The bytes written to the sink (complete only when the outcome is ok()).
  DoneOutcome download(const FakeSandbox& sandbox, std::string_view remote_path,
                       std::string& contents);
  // The sandbox's status (SBX_SANDBOX_*), or the error.
  int32_t status(const FakeSandbox& sandbox, std::optional<ErrorInfo>* error = nullptr);
  DoneOutcome close(const FakeSandbox& sandbox);
  // release_sandbox. Calling it twice on purpose is how a test releases twice.
  void release(const FakeSandbox& sandbox);
  // Starts exec with the current Misbehaviour and returns what the start call returned (NULL
  // when the plugin started nothing), without waiting.
  sbx_operation* raw_exec(const FakeSandbox& sandbox, std::string_view command);

 private:
  friend class FakeHost;
  FakeProvider(FakeHost* host, sbx_provider* provider);
  DoneOutcome wait_done(std::shared_ptr<OpRecord> record, sbx_operation* op);

  FakeHost* host_;
  sbx_provider* provider_;
  std::vector<sbx_sandbox*> live_;  // created, not released through release()
};

// How a FakeHost behaves (FakeHost::Options).
struct FakeHostOptions {
  sbx_version abi_version = SBX_ABI_VERSION_INIT;
  std::string host_name = "sbx-fake-host";
  int64_t start_ns = 1'000'000'000'000;  // the clock's first reading
  // How long (real time) a blocking helper waits for a completion before it gives up and
  // records a problem. Generous: it only bounds a broken plugin.
  std::chrono::milliseconds completion_timeout{30'000};
  // Contract breaking: NULL services in the sbx_host.
  bool null_log = false;
  bool null_now_ns = false;
  bool null_get_extension = false;
  // Also print each log line to stderr (for debugging a test).
  bool echo_logs = false;
};

class FakeHost {
 public:
  using Options = FakeHostOptions;

  // Drives the plugin whose entry function is `entry` (linked into the test); calls its init.
  explicit FakeHost(sbx_plugin_entry_fn entry, Options options);
  explicit FakeHost(sbx_plugin_entry_fn entry);
  // Loads a plugin file (dlopen, RTLD_LOCAL) and drives it as above.
  static std::unique_ptr<FakeHost> load(const std::filesystem::path& file, Options options = {});
  // Calls deinit (providers must be gone), then unloads a loaded library.
  ~FakeHost();
  FakeHost(const FakeHost&) = delete;
  FakeHost& operator=(const FakeHost&) = delete;

  const sbx_host* host() const noexcept;
  const sbx_plugin* plugin() const noexcept { return plugin_; }

  // A provider from the factory with this id. Throws FakeHostError with the plugin's message when
  // the factory refuses the config.
  FakeProvider provider(std::string_view id, std::string_view config_json = "{}");
  // The factory's error for a config it should refuse (throws FakeHostError when it accepts it).
  ErrorInfo provider_error(std::string_view id, std::string_view config_json);

  // ---- The clock behind now_ns
  // --------------------------------------------------------------------
  std::chrono::nanoseconds now() const noexcept;
  // Moves the clock forward and wakes the SDK's sleepers (sbx::sdk::notify_clock_changed).
  void advance(std::chrono::nanoseconds by) noexcept;

  // ---- What the plugin said
  // -----------------------------------------------------------------------
  std::vector<LogLine> logs() const;
  // True once a log line containing `text` was written; waits at most `timeout` of real time.
  bool wait_for_log(std::string_view text, std::chrono::milliseconds timeout) const;
  // Lines containing `text`.
  size_t count_logs(std::string_view text) const;
  // Broken promises seen so far: a second completion of an operation, an operation that did not
  // complete within the wait, a callback after its operation completed.
  std::vector<std::string> problems() const;

  const Options& options() const noexcept { return options_; }

 private:
  friend class FakeProvider;
  friend class PendingExec;
  friend struct Callbacks;
  struct State;
  FakeHost(sbx_plugin_entry_fn entry, Options options, void* library);
  void add_problem(std::string problem);

  Options options_;
  std::unique_ptr<State> state_;
  const sbx_plugin* plugin_ = nullptr;
  void* library_ = nullptr;
};

}  // namespace sbx::sdk::testing
