// The fake host (sbx/sdk/testing/fake_host.hpp) as a plugin author uses it: a provider defined here
// (linked in, through its sbx_plugin_entry) and the hello example (loaded from its .so) driven
// through the raw ABI in process; time-dependent code tested by advancing the fake clock; the
// SDK's contract checks seen from a host that breaks the contract on purpose; and the fake host's
// own exactly-once checks, against a raw plugin that completes twice or never.

#include <doctest/doctest.h>

#include <sbx/sdk/clock.hpp>
#include <sbx/sdk/plugin.hpp>
#include <sbx/sdk/probe.hpp>
#include <sbx/sdk/retry.hpp>
#include <sbx/sdk/testing/fake_host.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace sbx::sdk;
using namespace sbx::sdk::testing;
using namespace std::chrono_literals;

namespace {

constexpr auto kLogWait = 30s;  // real time; only bounds a broken test

// download("/shorthand/NAME") throws Error::NAME("NAME failed"): the shorthands seen by a host.
constexpr std::string_view kShorthandPath = "/shorthand/";
Error shorthand(const std::string& name) {
  const std::string m = name + " failed";
  if (name == "invalid_argument") return Error::invalid_argument(m);
  if (name == "not_found") return Error::not_found(m);
  if (name == "timeout") return Error::timeout(m);
  if (name == "cancelled") return Error::cancelled(m);
  if (name == "unavailable") return Error::unavailable(m);
  if (name == "unavailable_final") return Error::unavailable(m, false);
  if (name == "resource_exhausted") return Error::resource_exhausted(m);
  if (name == "resource_exhausted_retryable") return Error::resource_exhausted(m, true);
  if (name == "failed_precondition") return Error::failed_precondition(m);
  if (name == "unimplemented") return Error::unimplemented(m);
  if (name == "permission_denied") return Error::permission_denied(m);
  if (name == "internal") return Error::internal(m);
  if (name == "create_failed") return Error::create_failed(m);
  if (name == "create_failed_retryable") return Error::create_failed(m, true);
  if (name == "create_verification_failed") return Error::create_verification_failed(m);
  return Error::internal("no shorthand " + name);
}

// Sandboxes are names; files live in a map. `exec` understands three commands:
//   nap     sleeps one hour of the host's clock (sdk::sleep_until), then prints the host time it
//   took flaky   fails once with a retryable error, retried after a random backoff of up to an hour
//   probe   a readiness probe that never passes, with a deadline of 60 s of the host's clock
//   other   printed back on stdout
class ClockProvider final : public BlockingProvider {
 public:
  static constexpr const char* kId = "clocked";
  static constexpr const char* kDescription = "Test: time-dependent behaviour on the host clock";
  static constexpr const char* kConfigSchema = R"({"type": "object"})";

  ClockProvider(const ProviderContext& context, const boost::json::object& config)
      : log_(context.log) {
    json::ObjectReader r(config);
    greeting_ = r.string("greeting", "hello");
    r.finish();
  }

  std::unique_ptr<Sandbox> create(const Spec&, const CancelToken&) override {
    return std::make_unique<Sandbox>("box-" + std::to_string(++count_));
  }
  ExitStatus exec(Sandbox&, const ExecRequest& req, OutputSink& out,
                  const CancelToken& cancel) override {
    const auto started = now();
    if (req.command == "nap") {
      // The deadline first, then the line the test waits for: a clock advanced on that line
      // cannot have moved before the deadline was taken.
      const auto until = host_deadline_after(std::chrono::hours(1));
      log_.info("napping for an hour");
      sleep_until(until, cancel);
    } else if (req.command == "probe") {
      ProbeConfig config;
      config.command = "check";
      config.timeout_s = 5;
      config.deadline_s = 60;
      run_readiness_probe(
          config, "box",
          [&](std::chrono::milliseconds) {
            // Logged from the attempt, after the probe took its deadline: a test that advances
            // the clock when it reads this cannot move the deadline with it.
            log_.info("probing");
            return ProbeAttempt{1, "", "not yet"};
          },
          cancel, std::chrono::seconds(1));
    } else if (req.command == "flaky") {
      int attempts = 0;
      retry(
          RetryPolicy{1, std::chrono::hours(1), std::chrono::hours(1)},
          [&] {
            if (++attempts == 1) throw Error::unavailable("busy");
          },
          cancel, {},
          [&](int, const Error&, std::chrono::milliseconds delay) {
            log_.info("retrying in ", delay.count(), " ms");
          });
      out.write(StdStream::out, "attempts=" + std::to_string(attempts) + "\n");
    } else {
      out.write(StdStream::out, greeting_ + " " + req.command);
      return ExitStatus::exited(0);
    }
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(now() - started);
    out.write(StdStream::out, "took_ms=" + std::to_string(took.count()));
    return ExitStatus::exited(0);
  }
  void upload(Sandbox& box, const UploadRequest& req, ByteSource& in, const CancelToken&) override {
    std::string data;
    char buf[7];  // small, so that the stream is read in several pieces
    for (size_t n; (n = in.read(buf, sizeof buf)) > 0;)
      data.append(buf, n);
    std::lock_guard lock(mutex_);
    files_[box.id() + ":" + req.remote_path] = data;
  }
  void download(Sandbox& box, const std::string& path, ByteSink& sink,
                const CancelToken&) override {
    std::lock_guard lock(mutex_);
    const auto it = files_.find(box.id() + ":" + path);
    if (path == "/reasoned") {
      throw Error(SBX_STATUS_UNAVAILABLE, "a reasoned failure",
                  ErrorDetails{.retryable = true,
                               .http_status = 503,
                               .request_id = "req-1",
                               .reason = "backend:BUSY"});
    }
    if (path.starts_with(kShorthandPath)) throw shorthand(path.substr(kShorthandPath.size()));
    if (it == files_.end()) throw Error::not_found("no such file: " + path);
    sink.write(it->second);
  }
  SandboxStatus status(Sandbox&, const CancelToken&) override { return SandboxStatus::running; }
  void close(Sandbox&, const CancelToken&) override {}

 private:
  Logger log_;
  std::string greeting_;
  std::atomic<int> count_{0};
  std::mutex mutex_;
  std::map<std::string, std::string> files_;
};

int64_t number_after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  REQUIRE(at != std::string::npos);
  return std::stoll(text.substr(at + key.size()));
}

// A blocking provider whose exec is asynchronous (sdk::AsyncExec): exec_async records the thread
// it was called on and finishes on a thread of its own; "refuse" throws before handing `done`
// off. Its blocking exec must never be called.
class AsyncExecProvider final : public BlockingProvider, public AsyncExec {
 public:
  static constexpr const char* kId = "async-exec";
  static constexpr const char* kDescription = "Test: exec without a pool thread";
  static constexpr const char* kConfigSchema = R"({"type": "object"})";

  AsyncExecProvider(const ProviderContext&, const boost::json::object&) {}
  ~AsyncExecProvider() override {
    for (auto& t : threads_)
      t.join();
  }

  static inline std::atomic<std::thread::id> called_on{};

  void exec_async(Sandbox&, ExecRequest request, ExecCompletion done) override {
    called_on = std::this_thread::get_id();
    if (request.command == "refuse") throw Error::invalid_argument("refused before starting");
    std::lock_guard lock(mutex_);
    threads_.emplace_back([done = std::move(done), command = request.command]() mutable {
      done.output().write(StdStream::out, "async " + command);
      done.succeed(ExitStatus::exited(7));
    });
  }
  ExitStatus exec(Sandbox&, const ExecRequest&, OutputSink&, const CancelToken&) override {
    throw Error::internal("the blocking exec was called");
  }
  std::unique_ptr<Sandbox> create(const Spec&, const CancelToken&) override {
    return std::make_unique<Sandbox>("async-box");
  }
  void upload(Sandbox&, const UploadRequest&, ByteSource&, const CancelToken&) override {}
  void download(Sandbox&, const std::string&, ByteSink&, const CancelToken&) override {}
  SandboxStatus status(Sandbox&, const CancelToken&) override { return SandboxStatus::running; }
  void close(Sandbox&, const CancelToken&) override {}

 private:
  std::mutex mutex_;
  std::vector<std::thread> threads_;
};

}  // namespace

SBX_PLUGIN("clocked", "1.0.0", "Test plugin for the fake host", factory<ClockProvider>(),
           factory<AsyncExecProvider>())

TEST_CASE(
    "blocking adapter: a provider with AsyncExec runs exec on the caller's thread, not the "
    "pool; a throw before the hand-off fails the exec") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("async-exec", "{}");
  const FakeSandbox box = provider.create();
  const ExecOutcome r = provider.exec(box, "hello");
  CHECK(r.completed);
  CHECK_FALSE(r.error);
  CHECK(r.return_code == 7);
  CHECK(r.stdout_text == "async hello");
  CHECK(AsyncExecProvider::called_on.load() == std::this_thread::get_id());
  const ExecOutcome refused = provider.exec(box, "refuse");
  CHECK(refused.completed);
  REQUIRE(refused.error);
  CHECK(refused.error->status == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(refused.error->message.find("refused before starting") != std::string::npos);
  CHECK(provider.close(box).ok());
  provider.release(box);
  CHECK(host.problems().empty());
}

TEST_CASE("fake host: blocking helpers drive a provider through the ABI and record its callbacks") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked", R"({"greeting": "hi"})");
  const FakeSandbox box = provider.create();
  CHECK(box.id == "box-1");

  const ExecOutcome r = provider.exec(box, "there");
  CHECK(r.completed);
  CHECK_FALSE(r.error);
  CHECK(r.return_code == 0);
  CHECK(r.stdout_text == "hi there");
  REQUIRE(r.chunks.size() == 1);
  CHECK(r.chunks[0].stream == 1);

  const ExecOutcome unstreamed = provider.exec(box, "again", {.stream = false});
  CHECK(unstreamed.chunks.empty());
  CHECK(unstreamed.stdout_text == "hi again");

  CHECK(provider.upload(box, "/work/a b.txt", "some bytes to upload").ok());
  std::string back;
  CHECK(provider.download(box, "/work/a b.txt", back).ok());
  CHECK(back == "some bytes to upload");
  const DoneOutcome missing = provider.download(box, "/nope", back);
  CHECK(missing.completed);
  REQUIRE(missing.error);
  CHECK(missing.error->status == SBX_STATUS_NOT_FOUND);
  CHECK(missing.error->reason.empty());
  // Every detail of an sdk::Error crosses the ABI, the reason (1.2) too.
  const DoneOutcome reasoned = provider.download(box, "/reasoned", back);
  REQUIRE(reasoned.error);
  CHECK(reasoned.error->status == SBX_STATUS_UNAVAILABLE);
  CHECK(reasoned.error->message == "a reasoned failure");
  CHECK(reasoned.error->retryable);
  CHECK(reasoned.error->http_status == 503);
  CHECK(reasoned.error->request_id == "req-1");
  CHECK(reasoned.error->reason == "backend:BUSY");

  CHECK(provider.status(box) == SBX_SANDBOX_RUNNING);
  CHECK(provider.close(box).ok());
  provider.release(box);
  CHECK(host.problems().empty());
  CHECK(host.count_logs("broke the ABI contract") == 0);
}

TEST_CASE("fake host: each Error shorthand reaches the host with its status and retryable flag") {
  struct Expected {
    const char* name;
    sbx_status status;
    bool retryable;
  };
  const Expected expected[] = {
      {"invalid_argument", SBX_STATUS_INVALID_ARGUMENT, false},
      {"not_found", SBX_STATUS_NOT_FOUND, false},
      {"timeout", SBX_STATUS_TIMEOUT, true},
      {"cancelled", SBX_STATUS_CANCELLED, false},
      {"unavailable", SBX_STATUS_UNAVAILABLE, true},
      {"unavailable_final", SBX_STATUS_UNAVAILABLE, false},
      {"resource_exhausted", SBX_STATUS_RESOURCE_EXHAUSTED, false},
      {"resource_exhausted_retryable", SBX_STATUS_RESOURCE_EXHAUSTED, true},
      {"failed_precondition", SBX_STATUS_FAILED_PRECONDITION, false},
      {"unimplemented", SBX_STATUS_UNIMPLEMENTED, false},
      {"permission_denied", SBX_STATUS_PERMISSION_DENIED, false},
      {"internal", SBX_STATUS_INTERNAL, false},
      {"create_failed", SBX_STATUS_CREATE_FAILED, false},
      {"create_failed_retryable", SBX_STATUS_CREATE_FAILED, true},
      {"create_verification_failed", SBX_STATUS_CREATE_VERIFICATION_FAILED, true},
  };
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked");
  const FakeSandbox box = provider.create();
  for (const Expected& e : expected) {
    CAPTURE(e.name);
    std::string ignored;
    const DoneOutcome r = provider.download(box, std::string(kShorthandPath) + e.name, ignored);
    REQUIRE(r.completed);
    REQUIRE(r.error);
    CHECK(r.error->status == e.status);
    CHECK(sbx_status_name(r.error->status) == status_name(e.status));
    CHECK(r.error->retryable == e.retryable);
    CHECK(r.error->message == std::string(e.name) + " failed");
  }
  provider.release(box);
  CHECK(host.problems().empty());
}

TEST_CASE("fake host: init refuses a host of another ABI major, naming both versions") {
  const std::string plugin_abi =
      std::to_string(SBX_ABI_VERSION_MAJOR) + "." + std::to_string(SBX_ABI_VERSION_MINOR);
  const std::string host_abi = std::to_string(SBX_ABI_VERSION_MAJOR + 1) + ".0";
  FakeHost::Options options;
  options.abi_version = {SBX_ABI_VERSION_MAJOR + 1, 0, 0};
  std::string message;
  try {
    FakeHost host(&sbx_plugin_entry, options);
  } catch (const FakeHostError& e) {
    message = e.what();
  }
  CHECK(message.find("this plugin speaks sbx ABI " + plugin_abi + " and the host " + host_abi +
                     ": the major versions differ") != std::string::npos);

  // The raw call: FAILED_PRECONDITION, the same message in the error sink.
  sbx_host h{};
  h.struct_size = sizeof h;
  h.abi_version = {SBX_ABI_VERSION_MAJOR + 1, 3, 0};
  std::string reported;
  sbx_status reported_status = SBX_STATUS_OK;
  struct Report {
    std::string* message;
    sbx_status* status;
  } report{&reported, &reported_status};
  const sbx_error_sink sink{sizeof sink, &report, [](void* ctx, const sbx_error* e) {
                              auto* r = static_cast<Report*>(ctx);
                              *r->message = std::string(e->message.data, e->message.len);
                              *r->status = e->status;
                            }};
  CHECK(sbx_plugin_entry()->init(&h, &sink) == SBX_STATUS_FAILED_PRECONDITION);
  CHECK(reported_status == SBX_STATUS_FAILED_PRECONDITION);
  CHECK(reported.find("this plugin speaks sbx ABI " + plugin_abi + " and the host " +
                      std::to_string(SBX_ABI_VERSION_MAJOR + 1) + ".3") != std::string::npos);
  CHECK(sbx_plugin_entry()->init(nullptr, &sink) == SBX_STATUS_FAILED_PRECONDITION);
  CHECK(reported.find("init was given no host") != std::string::npos);
}

TEST_CASE("fake host: a config the factory refuses names the JSON path") {
  FakeHost host(&sbx_plugin_entry);
  const ErrorInfo e = host.provider_error("clocked", R"({"greeting": 5})");
  CHECK(e.status == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(e.message.find("$.greeting") != std::string::npos);
  CHECK_THROWS_AS(host.provider("clocked", R"({"colour": 1})"), FakeHostError);
}

TEST_CASE("fake host: the SDK's sleep follows the fake clock, not the wall clock") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked");
  const FakeSandbox box = provider.create();
  const auto real_start = std::chrono::steady_clock::now();
  const auto host_start = host.now();

  PendingExec nap = provider.start_exec(box, "nap");
  REQUIRE(host.wait_for_log("napping", kLogWait));
  host.advance(59min);
  CHECK_FALSE(nap.completed());  // 59 minutes of the host's clock are not an hour
  host.advance(1min);
  const ExecOutcome r = nap.wait();
  REQUIRE(r.completed);
  CHECK_FALSE(r.error);
  CHECK(number_after(r.stdout_text, "took_ms=") == 3'600'000);  // measured on the host's clock
  CHECK(host.now() - host_start == 1h);
  // An hour of the plugin's time passed without an hour of real time: nothing slept it out.
  CHECK(std::chrono::steady_clock::now() - real_start < 10min);
  provider.release(box);
  CHECK(host.problems().empty());
}

TEST_CASE("fake host: retry/backoff waits on the fake clock") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked");
  const FakeSandbox box = provider.create();

  PendingExec flaky = provider.start_exec(box, "flaky");
  REQUIRE(host.wait_for_log("retrying in", kLogWait));
  int64_t delay_ms = -1;
  for (const LogLine& line : host.logs())
    if (line.message.find("retrying in") != std::string::npos)
      delay_ms = number_after(line.message, "retrying in ");
  REQUIRE(delay_ms >= 0);
  REQUIRE(delay_ms <= 3'600'000);
  host.advance(1h);  // at least the random backoff, whatever it was
  const ExecOutcome r = flaky.wait();
  REQUIRE(r.completed);
  CHECK(r.stdout_text.find("attempts=2") != std::string::npos);
  CHECK(number_after(r.stdout_text, "took_ms=") >= delay_ms);
  provider.release(box);
  CHECK(host.problems().empty());
}

TEST_CASE("fake host: a readiness probe's deadline passes on the fake clock") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked");
  const FakeSandbox box = provider.create();
  PendingExec probe = provider.start_exec(box, "probe");
  REQUIRE(host.wait_for_log("probing", kLogWait));
  host.advance(61s);  // past the 60 s deadline in one step: no attempt fits in between
  const ExecOutcome r = probe.wait();
  REQUIRE(r.completed);
  REQUIRE(r.error);
  CHECK(r.error->status == SBX_STATUS_CREATE_VERIFICATION_FAILED);
  CHECK(r.error->message.find("deadline_s=60") != std::string::npos);
  CHECK(r.error->message.find("attempts=1,") != std::string::npos);
  CHECK(r.error->message.find("last failure:") != std::string::npos);
  provider.release(box);
  CHECK(host.problems().empty());
}

TEST_CASE("fake host: cancelling a sleep on the fake clock ends it at once") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked");
  const FakeSandbox box = provider.create();
  PendingExec nap = provider.start_exec(box, "nap");
  REQUIRE(host.wait_for_log("napping", kLogWait));
  nap.cancel();
  const ExecOutcome r = nap.wait();
  REQUIRE(r.completed);
  REQUIRE(r.error);
  CHECK(r.error->status == SBX_STATUS_CANCELLED);
  provider.release(box);
  CHECK(host.problems().empty());
}

TEST_CASE("fake host: the hello example, loaded from its .so") {
  auto host = FakeHost::load(SBX_HELLO_PLUGIN);
  FakeProvider provider = host->provider("hello");
  const FakeSandbox box = provider.create();
  CHECK(provider.upload(box, "/in/greeting.txt", "hello, world\n").ok());
  const ExecOutcome r = provider.exec(box, "tr a-z A-Z < in/greeting.txt > out.txt; echo done");
  CHECK(r.completed);
  CHECK(r.return_code == 0);
  CHECK(r.stdout_text == "done\n");
  std::string out;
  CHECK(provider.download(box, "/out.txt", out).ok());
  CHECK(out == "HELLO, WORLD\n");
  CHECK(provider.exec(box, "exit 3").return_code == 3);
  CHECK(provider.close(box).ok());
  provider.release(box);
  CHECK(host->count_logs("created ") == 1);  // hello logs each sandbox it makes
  CHECK(host->problems().empty());
}

// ---- The SDK's checks of the host's side of the contract ----------------------------------------

TEST_CASE("checks: releasing a sandbox twice is reported, not a double free") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked");
  const FakeSandbox box = provider.create();
  provider.release(box);
  CHECK(host.count_logs("broke the ABI contract") == 0);
  provider.release(box);  // again, on purpose
  CHECK(host.count_logs("release_sandbox of a sandbox already released") == 1);
}

TEST_CASE("checks: an operation on a released sandbox fails FAILED_PRECONDITION and is reported") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked");
  const FakeSandbox box = provider.create();
  provider.release(box);
  const ExecOutcome r = provider.exec(box, "anything");
  REQUIRE(r.completed);
  REQUIRE(r.error);
  CHECK(r.error->status == SBX_STATUS_FAILED_PRECONDITION);
  CHECK(host.count_logs("used after release_sandbox") == 1);
  std::optional<ErrorInfo> error;
  CHECK(provider.status(box, &error) == SBX_SANDBOX_UNKNOWN);
  REQUIRE(error);
  CHECK(error->status == SBX_STATUS_FAILED_PRECONDITION);
  CHECK(host.count_logs("used after release_sandbox") == 2);
  CHECK(host.problems().empty());  // each failed operation still completed exactly once
}

TEST_CASE("checks: a call without usable callbacks starts nothing and is reported") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked");
  const FakeSandbox box = provider.create();
  provider.misbehave.null_on_complete = true;
  CHECK(provider.raw_exec(box, "x") == nullptr);
  CHECK(host.count_logs("exec: called without usable callbacks") == 1);
  provider.misbehave.null_on_complete = false;
  provider.release(box);
}

TEST_CASE("checks: an operation handle released twice, or cancelled after release, is reported") {
  FakeHost host(&sbx_plugin_entry);
  FakeProvider provider = host.provider("clocked");
  const FakeSandbox box = provider.create();
  provider.misbehave.release_handle_twice = true;
  CHECK(provider.exec(box, "x").stdout_text == "hello x");
  CHECK(host.count_logs("sbx_operation.release on a handle already released") == 1);
  provider.misbehave = {};
  provider.misbehave.cancel_after_release = true;
  CHECK(provider.exec(box, "y").stdout_text == "hello y");
  CHECK(host.count_logs("sbx_operation.cancel on a handle already released") == 1);
  provider.misbehave = {};
  provider.release(box);
}

TEST_CASE("checks: a host with NULL services is reported, and the SDK goes on without them") {
  FakeHost::Options options;
  options.null_now_ns = true;
  FakeHost host(&sbx_plugin_entry, options);
  CHECK(host.count_logs("init: the sbx_host has NULL functions (now_ns )") == 1);
  FakeProvider provider = host.provider("clocked");
  CHECK(host.count_logs("create_provider: the sbx_host has NULL functions (now_ns )") == 1);
  const FakeSandbox box = provider.create();
  CHECK(provider.exec(box, "x").stdout_text == "hello x");  // the steady clock stands in
  provider.release(box);
}

// The mode is read from the environment once per plugin library, so the child sets it before it
// loads a fresh copy of the hello plugin, then breaks the contract: a sandbox released twice.
TEST_CASE("checks: SBX_SDK_CHECKS=strict aborts on a violation") {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    setenv("SBX_SDK_CHECKS", "strict", 1);
    const int devnull = open("/dev/null", O_WRONLY);  // the child's report of its abort is expected
    if (devnull >= 0) {
      dup2(devnull, 1);
      dup2(devnull, 2);
    }
    auto host = FakeHost::load(SBX_HELLO_PLUGIN);
    FakeProvider provider = host->provider("hello");
    const FakeSandbox box = provider.create();
    provider.release(box);
    provider.release(box);  // strict: aborts here
    _exit(0);               // not aborted: the parent's check fails
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
}

// ---- The fake host's own checks, against a raw plugin that breaks its promises ------------------

namespace {

// A plain-C-style plugin: exec completes twice, status never completes.
struct RawOp {
  sbx_operation handle{sizeof(sbx_operation), nullptr, [](sbx_operation*) {},
                       [](sbx_operation* op) { delete static_cast<RawOp*>(op->plugin_data); }};
  RawOp() { handle.plugin_data = this; }
};
sbx_sandbox g_raw_box{sizeof(sbx_sandbox), {"raw", 3}, nullptr};

sbx_provider* make_raw_provider() {
  static sbx_provider p{};
  p.struct_size = sizeof p;
  p.create = [](sbx_provider*, const sbx_spec*, const sbx_create_callbacks* cb) {
    cb->on_complete(cb->user_data, &g_raw_box, nullptr);
    return &(new RawOp)->handle;
  };
  p.exec = [](sbx_provider*, sbx_sandbox*, const sbx_exec_request*, const sbx_exec_callbacks* cb) {
    const sbx_exec_result result{
        sizeof(sbx_exec_result), 0, {nullptr, 0}, {nullptr, 0}, {nullptr, 0}};
    cb->on_complete(cb->user_data, &result, nullptr);
    cb->on_complete(cb->user_data, &result, nullptr);  // broken on purpose
    return &(new RawOp)->handle;
  };
  p.status = [](sbx_provider*, sbx_sandbox*, const sbx_status_callbacks*) {
    return &(new RawOp)->handle;  // never completes
  };
  p.release_sandbox = [](sbx_provider*, sbx_sandbox*) {};
  p.get_extension = [](const sbx_provider*, const char*) -> const void* { return nullptr; };
  p.destroy = [](sbx_provider*) {};
  return &p;
}

const sbx_provider_factory kRawFactory{sizeof(sbx_provider_factory), "raw", "breaks its promises",
                                       "{}",
                                       [](const sbx_provider_factory*, const sbx_host*, sbx_str,
                                          sbx_provider** out, const sbx_error_sink*) {
                                         *out = make_raw_provider();
                                         return SBX_STATUS_OK;
                                       }};
const sbx_provider_factory* const kRawFactories[] = {&kRawFactory};
const sbx_plugin kRawPlugin{sizeof(sbx_plugin),
                            SBX_ABI_VERSION_INIT,
                            "raw",
                            "1",
                            "raw",
                            [](const sbx_host*, const sbx_error_sink*) { return SBX_STATUS_OK; },
                            [] {},
                            1,
                            kRawFactories};
const sbx_plugin* SBX_ABI raw_entry() {
  return &kRawPlugin;
}

}  // namespace

TEST_CASE("fake host: a second completion, and a missing one, are problems") {
  FakeHost::Options options;
  options.completion_timeout = 200ms;  // the status below never completes
  FakeHost host(&raw_entry, options);
  FakeProvider provider = host.provider("raw");
  const FakeSandbox box = provider.create();
  CHECK(provider.exec(box, "x").completed);
  std::vector<std::string> problems = host.problems();
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "operation 'exec' completed a second time");
  std::optional<ErrorInfo> error;
  provider.status(box, &error);
  problems = host.problems();
  REQUIRE(problems.size() == 2);
  CHECK(problems[1] == "operation 'status' did not complete in time");
  provider.release(box);
}
