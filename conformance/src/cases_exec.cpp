// Cases: exec (output, exit codes, cwd, env, timeout, streaming, cancellation, concurrency, user).

#include "suite.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

namespace sbx::conformance {
namespace {

using namespace std::chrono_literals;

void output_bytes(T& t) {
  Sandbox box = t.create();
  const auto r = box.exec("printf 'out'; printf 'err' >&2; printf '\\001\\002\\377'");
  CHECK_EQ(r.return_code, 0);
  CHECK(!r.error_type.has_value());
  CHECK_EQ(r.stdout_text, std::string("out\x01\x02\xff", 6));
  CHECK_EQ(r.stderr_text, "err");
}

void megabyte(T& t) {
  Sandbox box = t.create();
  const auto r = box.exec(
      "i=0; while [ $i -lt 16384 ]; do echo "
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde; i=$((i+1)); done");
  CHECK_EQ(r.return_code, 0);
  CHECK_EQ(r.stdout_text.size(), 16384u * 64u);
}

void exit_code(T& t) {
  Sandbox box = t.create();
  const auto r = box.exec("echo partial; exit 3");
  CHECK_EQ(r.return_code, 3);
  CHECK(!r.error_type.has_value());
  CHECK_EQ(r.stdout_text, "partial\n");
  CHECK_EQ(box.exec("false").return_code, 1);
}

void cwd(T& t) {
  Sandbox box = t.create();
  box.upload_bytes("in sub\n", "/work/sub/marker.txt");
  box.upload_bytes("in work\n", "/work/marker.txt");
  CHECK_EQ(box.exec("cat marker.txt").stdout_text, "in work\n");
  CHECK_EQ(box.exec("cat marker.txt", {.cwd = "/work/sub"}).stdout_text, "in sub\n");
  // A cwd that does not exist: the sandbox cannot start the command there.
  const auto r = box.exec("echo no", {.cwd = "/work/does-not-exist"});
  CHECK_EQ(r.return_code, 125);
  CHECK(r.error_type == std::optional<std::string>("sandbox"));
}

void env(T& t) {
  auto spec = t.spec();
  spec.env = {{"SPEC_ONLY", "s"}, {"BOTH", "from-spec"}};
  Sandbox box = t.create(spec);
  const auto r = box.exec("echo \"$SPEC_ONLY $BOTH $EXEC_ONLY\"",
                          {.env = {{"BOTH", "from-exec"}, {"EXEC_ONLY", "e"}}});
  CHECK_EQ(r.stdout_text, "s from-exec e\n");
  CHECK_EQ(box.exec("echo \"$BOTH\"").stdout_text, "from-spec\n");
}

void timeout(T& t) {
  Sandbox box = t.create();
  const auto start = std::chrono::steady_clock::now();
  const auto r = box.exec("echo before; sleep 30; echo after", {.timeout_s = 1.5});
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK_EQ(r.return_code, 125);
  CHECK(r.error_type == std::optional<std::string>("timeout"));
  CHECK_EQ(r.stdout_text, "before\n");
  CHECK(took < 20s);  // stopped by the timeout, not by the command ending after 30 s
  CHECK_EQ(box.exec("echo still-here").stdout_text, "still-here\n");
}

// Output arrives while the command runs: the command waits for a file the suite uploads only once
// the first chunk arrived, so output held back until the end never lets it finish early.
void streaming(T& t) {
  Sandbox box = t.create();
  std::mutex m;
  std::condition_variable cv;
  std::string seen;
  sbx::ExecOptions options;
  options.on_output = [&](OutputStream stream, std::string_view bytes) {
    std::lock_guard lock(m);
    seen += (stream == OutputStream::err ? "E:" : "O:") + std::string(bytes);
    cv.notify_all();
  };
  options.timeout_s = 60;
  auto op = box.exec_async(
      "echo one; i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
      "echo two >&2",
      options);
  bool first = false;
  {
    std::unique_lock lock(m);
    first = cv.wait_for(lock, 30s, [&] { return seen.find("O:one\n") != std::string::npos; });
    CHECK(seen.find("E:two") == std::string::npos);  // nothing of the end yet
  }
  CHECK(first);  // the first line arrived before the command could end
  box.upload_bytes("", "/work/go");
  const auto r = op.get();
  CHECK_EQ(r.return_code, 0);
  CHECK(r.stdout_text.empty());  // streamed output is not also accumulated
  std::lock_guard lock(m);
  CHECK_EQ(seen, "O:one\nE:two\n");
}

// Cancelled once it is known to run (its first line arrived), not after a guessed delay. The plugin
// itself must end the exec (the suite's host waits kCancelGrace before it would abandon it), and
// the command must be killed: what it would have written 3 s later never appears.
void cancel(T& t) {
  Sandbox box = t.create();
  std::mutex m;
  std::condition_variable cv;
  bool started = false;
  sbx::ExecOptions options;
  options.on_output = [&](OutputStream, std::string_view) {
    std::lock_guard lock(m);
    started = true;
    cv.notify_all();
  };
  auto op = box.exec_async("echo started; sleep 3; echo late > late.txt", options);
  {
    std::unique_lock lock(m);
    REQUIRE(cv.wait_for(lock, 30s, [&] { return started; }));
  }
  const auto start = std::chrono::steady_clock::now();
  op.cancel();
  CHECK_THROWS_AS(op.get(), CancelledError);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 10s);  // the plugin's own answer: the host would wait kCancelGrace (60 s)
  // Past the moment the command would have written its file, had it not been killed.
  std::this_thread::sleep_until(start + 5s);
  CHECK_EQ(box.exec("echo alive").return_code, 0);
  CHECK_EQ(box.exec("test -e late.txt; echo $?").stdout_text, "1\n");
}

void concurrent(T& t) {
  Sandbox box = t.create();
  std::vector<Operation<ExecResult>> ops;
  for (int i = 0; i < 16; ++i)
    ops.push_back(box.exec_async("echo " + std::to_string(i)));
  for (int i = 0; i < 16; ++i) {
    const auto r = ops[static_cast<size_t>(i)].get();
    CHECK_EQ(r.return_code, 0);
    CHECK_EQ(r.stdout_text, std::to_string(i) + "\n");
  }
}

void user(T& t) {
  Sandbox box = t.create();
  ExecResult r;
  try {
    r = box.exec("id -u", {.user = "65534"});
  } catch (const Error& e) {
    if (e.status() == SBX_STATUS_UNIMPLEMENTED) {
      t.not_offered("exec with a user is UNIMPLEMENTED: " + std::string(e.what()));
    }
    throw;
  }
  CHECK_EQ(r.return_code, 0);
  CHECK_EQ(r.stdout_text, "65534\n");
  // Without a user, the sandbox's default user, whoever that is, but not the one asked before.
  CHECK(box.exec("id -u").stdout_text != "65534\n");
}

}  // namespace

void add_exec_cases(std::vector<Case>& cases) {
  cases.push_back(
      {{"exec.output",
        "exec keeps stdout and stderr apart and their bytes exact (\\001 \\002 \\377)", ""},
       output_bytes});
  cases.push_back({{"exec.megabyte", "a megabyte of output arrives whole", ""}, megabyte});
  cases.push_back(
      {{"exec.exit-code", "a non-zero exit code is a result, not an error", ""}, exit_code});
  cases.push_back({{"exec.cwd",
                    "cwd defaults to the spec's workdir and can be set per exec; a cwd that does "
                    "not exist is 125/\"sandbox\"",
                    ""},
                   cwd});
  cases.push_back({{"exec.env", "env comes from the spec and the exec; the exec's wins", ""}, env});
  cases.push_back({{"exec.timeout",
                    "a command past its timeout is 125/\"timeout\" with its output so far; the "
                    "sandbox stays usable",
                    ""},
                   timeout});
  cases.push_back({{"exec.streaming",
                    "streamed output reaches the caller while the command runs, in order, and "
                    "is not also in the result",
                    ""},
                   streaming});
  cases.push_back(
      {{"exec.cancel",
        "cancelling a running exec ends it with CancelledError and kills the command", ""},
       cancel});
  cases.push_back(
      {{"exec.concurrent", "16 concurrent execs on one sandbox each get their own output", ""},
       concurrent});
  cases.push_back({{"exec.user", "exec with user \"65534\" runs as uid 65534",
                    "exec with a user fails with UNIMPLEMENTED"},
                   user});
}

}  // namespace sbx::conformance
