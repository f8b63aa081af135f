// Cases: exec (output, exit codes, cwd, env, timeout, streaming, cancellation, concurrency, user).

#include "suite.hpp"

#include <sbx/core/plugin_checks.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

namespace sbx::conformance {
namespace {

using namespace std::chrono_literals;

void output_bytes(T& t) {
  Sandbox box = t.create();
  const auto r = box.exec("printf 'out'; printf 'err' >&2; printf '\\001\\002\\377'");
  CHECK_EQ(r.return_code, 0, "a command that exits 0 must have return code 0");
  CHECK(!r.error_type.has_value(),
        "a command that ran must complete without error_type (set it only for 125)");
  CHECK_EQ(r.stdout_text, std::string("out\x01\x02\xff", 6),
           "stdout must arrive byte for byte, binary bytes too: no decoding, no translation");
  CHECK_EQ(r.stderr_text, "err", "stderr must arrive apart from stdout, byte for byte");
}

void argv(T& t) {
  Sandbox box = t.create();
  // Words with spaces, quotes and what a shell would expand: each arrives as it is, whether the
  // provider runs the argv itself or the quoted command line the host sends beside it (ABI 1.3).
  const auto r =
      box.exec_argv({"printf", "[%s]\\n", "a b", "'q'", "$HOME", "*"}, {.cwd = std::string("/")});
  CHECK_EQ(r.return_code, 0, "an argv exec of printf must exit 0");
  CHECK_EQ(r.stdout_text, "[a b]\n['q']\n[$HOME]\n[*]\n",
           "each argv word must reach the program as it is: no splitting, quoting or expansion");
  const auto missing = box.exec_argv({"/no/such/program"});
  CHECK(missing.return_code == 127 || (missing.return_code == 125 && missing.error_type),
        "an argv exec of a program that does not exist must be 127 (a shell's) or "
        "125/\"sandbox\"");
}

void megabyte(T& t) {
  Sandbox box = t.create();
  const auto r = box.exec(
      "i=0; while [ $i -lt 16384 ]; do echo "
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde; i=$((i+1)); done");
  CHECK_EQ(r.return_code, 0, "a command writing 1 MiB must still exit 0");
  CHECK_EQ(r.stdout_text.size(), 16384u * 64u,
           "1 MiB of stdout must arrive whole: do not truncate or drop output");
}

void exit_code(T& t) {
  Sandbox box = t.create();
  const auto r = box.exec("echo partial; exit 3");
  CHECK_EQ(r.return_code, 3,
           "a command's non-zero exit must be its return code (a result, not an error)");
  CHECK(!r.error_type.has_value(),
        "a non-zero exit must have no error_type: it is the command's outcome, not the "
        "sandbox's");
  CHECK_EQ(r.stdout_text, "partial\n", "a failing command's output must be kept");
  CHECK_EQ(box.exec("false").return_code, 1, "`false` must give return code 1");
}

void cwd(T& t) {
  Sandbox box = t.create();
  box.upload_bytes("in sub\n", "/work/sub/marker.txt");
  box.upload_bytes("in work\n", "/work/marker.txt");
  CHECK_EQ(box.exec("cat marker.txt").stdout_text, "in work\n",
           "an exec without cwd must run in the spec's workdir (/work)");
  CHECK_EQ(box.exec("cat marker.txt", {.cwd = "/work/sub"}).stdout_text, "in sub\n",
           "an exec with cwd /work/sub must run there");
  // A cwd that does not exist: the sandbox cannot start the command there.
  const auto r = box.exec("echo no", {.cwd = "/work/does-not-exist"});
  CHECK_EQ(r.return_code, 125,
           "an exec whose cwd does not exist must be the result 125 (the command could not "
           "start), not run elsewhere");
  CHECK(r.error_type == std::optional<std::string>("sandbox"),
        "an exec whose cwd does not exist must have error_type \"sandbox\"");
}

void env(T& t) {
  auto spec = t.spec();
  spec.env = {{"SPEC_ONLY", "s"}, {"BOTH", "from-spec"}};
  Sandbox box = t.create(spec);
  const auto r = box.exec("echo \"$SPEC_ONLY $BOTH $EXEC_ONLY\"",
                          {.env = {{"BOTH", "from-exec"}, {"EXEC_ONLY", "e"}}});
  CHECK_EQ(r.stdout_text, "s from-exec e\n",
           "a command's environment must be the spec's env with the exec's env over it (the "
           "exec's value wins)");
  CHECK_EQ(box.exec("echo \"$BOTH\"").stdout_text, "from-spec\n",
           "an exec's env must not outlive the exec: the next one sees the spec's value");
}

void timeout(T& t) {
  Sandbox box = t.create();
  const auto start = std::chrono::steady_clock::now();
  const auto r = box.exec("echo before; sleep 30; echo after", {.timeout_s = 1.5});
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK_EQ(r.return_code, 125, "a command past its timeout (1.5 s) must be the result 125");
  CHECK(r.error_type == std::optional<std::string>("timeout"),
        "a command past its timeout must have error_type \"timeout\"");
  CHECK_EQ(r.stdout_text, "before\n",
           "a timed-out command's result must hold the output it wrote before the timeout");
  CHECK(took < 20s,
        "a command with timeout_s 1.5 that sleeps 30 s must be stopped at its timeout: it ran "
        "for " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(took).count()) + " s");
  CHECK_EQ(box.exec("echo still-here").stdout_text, "still-here\n",
           "the sandbox must stay usable after a command timed out");
}

// What an exec's output callback and its end told the case, shared with the host's threads (a
// continuation may run after the case gave up waiting).
struct Watch {
  std::mutex m;
  std::condition_variable cv;
  std::string seen;
  bool ended = false;

  // Waits until `seen` holds `what` or the exec ended, at most `limit`; whether `what` came.
  bool wait_for(std::string_view what, std::chrono::seconds limit) {
    std::unique_lock lock(m);
    cv.wait_for(lock, limit, [&] { return ended || seen.find(what) != std::string::npos; });
    return seen.find(what) != std::string::npos;
  }
};

// Starts `command` with its output (tagged O: and E:) and its end going to a Watch.
Operation<ExecResult> watched_exec(Sandbox& box, const std::shared_ptr<Watch>& watch,
                                   std::string command, double timeout_s = 60) {
  sbx::ExecOptions options;
  options.on_output = [watch](OutputStream stream, std::string_view bytes) {
    std::lock_guard lock(watch->m);
    watch->seen += (stream == OutputStream::err ? "E:" : "O:") + std::string(bytes);
    watch->cv.notify_all();
  };
  options.timeout_s = timeout_s;
  auto op = box.exec_async(std::move(command), options);
  op.then([watch](const Operation<ExecResult>&) {
    std::lock_guard lock(watch->m);
    watch->ended = true;
    watch->cv.notify_all();
  });
  return op;
}

// The outcome of an exec that ended before the case expected it to, for the failure message.
std::string outcome_of(Operation<ExecResult>& op) {
  try {
    const auto r = op.get();
    return "it ended at once with return code " + std::to_string(r.return_code) +
           (r.error_type ? " (" + *r.error_type + ")" : "") + ", stdout " + T::show(r.stdout_text) +
           ", stderr " + T::show(r.stderr_text);
  } catch (const std::exception& e) {
    return "it ended at once with " + T::describe(e);
  }
}

// Output arrives while the command runs: the command waits for a file the suite uploads only once
// the first chunk arrived, so output held back until the end never lets it finish early. An exec
// that ends at once (failed) is reported at once, not after the wait.
void streaming(T& t) {
  Sandbox box = t.create();
  auto watch = std::make_shared<Watch>();
  auto op = watched_exec(
      box, watch,
      "echo one; i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
      "echo two >&2");
  if (!watch->wait_for("O:one\n", 30s)) {
    const bool ended = op.wait_for(std::chrono::seconds(0));
    t.fail(ended ? "a streamed exec must deliver its output to on_output while it runs: " +
                       outcome_of(op)
                 : "the first line of a running command must reach on_output at once (not only "
                   "when the command ends): nothing came within 30 s");
    throw RequireFailed{};
  }
  {
    std::lock_guard lock(watch->m);
    CHECK(watch->seen.find("E:two") == std::string::npos,
          "output must reach on_output as it is written: stderr's line came before the command "
          "could write it");
  }
  box.upload_bytes("", "/work/go");
  const auto r = op.get();
  CHECK_EQ(r.return_code, 0, "the streamed command must exit 0 once it was let go");
  CHECK(r.stdout_text.empty() && r.stderr_text.empty(),
        "with on_output set, output must go only there: the result's stdout and stderr must be "
        "empty");
  std::lock_guard lock(watch->m);
  CHECK_EQ(watch->seen, "O:one\nE:two\n",
           "on_output must get each stream's bytes once, in order, tagged with the right stream");
}

// Cancelled once it is known to run (its first line arrived), not after a guessed delay. The plugin
// itself must end the exec (the suite's host waits kCancelGrace before it would abandon it), and
// the command must be killed: what it would have written 3 s later never appears.
void cancel(T& t) {
  Sandbox box = t.create();
  auto watch = std::make_shared<Watch>();
  auto op = watched_exec(box, watch, "echo started; sleep 3; echo late > late.txt");
  if (!watch->wait_for("O:started\n", 30s)) {
    const bool ended = op.wait_for(std::chrono::seconds(0));
    t.fail(ended ? "the command to cancel must run and stream its first line: " + outcome_of(op)
                 : "the first line of a running command must reach on_output at once: nothing "
                   "came within 30 s, so there was nothing to cancel");
    throw RequireFailed{};
  }
  const auto start = std::chrono::steady_clock::now();
  op.cancel();
  CHECK_THROWS_AS(op.get(), CancelledError,
                  "a cancelled exec must complete with CANCELLED (call on_complete with "
                  "SBX_STATUS_CANCELLED once the command is stopped)");
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 10s,
        "a cancelled exec must end within 10 s of cancel: the plugin's cancel must stop the "
        "command, not wait for it to end");
  // Past the moment the command would have written its file, had it not been killed.
  std::this_thread::sleep_until(start + 5s);
  CHECK_EQ(box.exec("echo alive").return_code, 0,
           "the sandbox must stay usable after a cancelled exec");
  CHECK_EQ(box.exec("test -e late.txt; echo $?").stdout_text, "1\n",
           "a cancelled exec's command must be killed: it went on and wrote late.txt 3 s later");
}

void concurrent(T& t) {
  Sandbox box = t.create();
  std::vector<Operation<ExecResult>> ops;
  for (int i = 0; i < 16; ++i)
    ops.push_back(box.exec_async("echo " + std::to_string(i)));
  for (int i = 0; i < 16; ++i) {
    const auto r = ops[static_cast<size_t>(i)].get();
    CHECK_EQ(r.return_code, 0, "each of 16 concurrent execs on one sandbox must exit 0");
    CHECK_EQ(r.stdout_text, std::to_string(i) + "\n",
             "each of 16 concurrent execs must get its own output, not another's");
  }
}

// Users are offered or not: "not offered" only when the provider says UNIMPLEMENTED. Any other
// refusal, of every user or of this one, is a failure with what to do instead.
void user(T& t) {
  Sandbox box = t.create();
  ExecResult r;
  try {
    r = box.exec("id -u", {.user = "65534"});
  } catch (const Error& e) {
    if (e.status() == SBX_STATUS_UNIMPLEMENTED) {
      t.not_offered("exec with a user is UNIMPLEMENTED: " + std::string(e.what()));
    }
    t.fail("an exec with user \"65534\" failed with " + T::describe(e) +
           ": run the command as uid 65534, or, if the provider cannot run commands as another "
           "user, complete every exec that names a user with UNIMPLEMENTED (then the case is "
           "\"not offered\")");
    throw RequireFailed{};
  }
  CHECK_EQ(r.return_code, 0,
           "an exec with user \"65534\" must run (`id -u` exits 0); a provider without users "
           "completes it with UNIMPLEMENTED instead");
  CHECK_EQ(r.stdout_text, "65534\n",
           "an exec with user \"65534\" must run as uid 65534, never as someone else");
  // Without a user, the sandbox's default user, whoever that is, but not the one asked before.
  CHECK(box.exec("id -u").stdout_text != "65534\n",
        "an exec without a user must run as the sandbox's default user, not the last exec's");
}

// Waits for a command that runs when its sandbox goes away (`how`) to end, and checks how.
void check_ends_with_its_sandbox(T& t, Operation<ExecResult>& op, const std::string& how,
                                 std::chrono::seconds limit) {
  if (!op.wait_for(limit)) {
    op.cancel();
    t.fail("an exec still running when its sandbox " + how +
           " must end then, with NOT_FOUND "
           "(docs/sandbox-semantics.md, \"Closed and gone sandboxes\"): it still ran " +
           std::to_string(limit.count()) + " s later");
    throw RequireFailed{};
  }
  CHECK_THROWS_AS(op.get(), NotFoundError,
                  "an exec still running when its sandbox " + how +
                      " must complete with NOT_FOUND (the sandbox is gone), not with a result");
}

// Starts a command that runs for long and waits for its first line: it runs when this returns.
Operation<ExecResult> start_long_command(T& t, Sandbox& box) {
  auto watch = std::make_shared<Watch>();
  auto op = watched_exec(box, watch, "echo started; sleep 300", 600);
  if (!watch->wait_for("O:started\n", 30s)) {
    t.fail("the command must run and stream its first line: " +
           (op.wait_for(0s) ? outcome_of(op) : std::string("nothing came within 30 s")));
    op.cancel();
    throw RequireFailed{};
  }
  return op;
}

// The sandbox is closed (through the plugin, behind the host) while a command runs.
void closed_under(T& t) {
  Sandbox box = t.create();
  auto op = start_long_command(t, box);
  plugin_checks::close_behind_host(box);
  check_ends_with_its_sandbox(t, op, "is closed", 15s);
}

// The sandbox's TTL passes while a command runs.
void expired_under(T& t) {
  Sandbox box = t.create_with_ttl(3);
  auto op = start_long_command(t, box);
  check_ends_with_its_sandbox(t, op, "expires (ttl_s 3)", 33s);
}

}  // namespace

void add_exec_cases(std::vector<Case>& cases) {
  cases.push_back(
      {{"exec.output",
        "exec keeps stdout and stderr apart and their bytes exact (\\001 \\002 \\377)", ""},
       output_bytes});
  cases.push_back({{"exec.megabyte", "a megabyte of output arrives whole", ""}, megabyte});
  cases.push_back({{"exec.argv",
                    "an argv exec (ABI 1.3) gives each word to the program as it is, with or "
                    "without a shell",
                    ""},
                   argv});
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
  cases.push_back({{"exec.sandbox-closed",
                    "an exec still running when its sandbox is closed ends then with "
                    "NotFoundError",
                    ""},
                   closed_under});
  cases.push_back({{"exec.sandbox-expired",
                    "an exec still running when its sandbox's TTL passes ends then with "
                    "NotFoundError",
                    "create with a ttl_s fails with UNIMPLEMENTED"},
                   expired_under});
}

}  // namespace sbx::conformance
