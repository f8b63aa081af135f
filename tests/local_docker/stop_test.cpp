// local_docker: stopping a command that floods its output. The daemon finishes an exec of a
// container only once the output of its other execs has been read, so the kill of a timed-out or
// cancelled command must drain that command's stream while it runs; these cases bound how long a
// stop takes through the host API and through `sbx run`.

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

using namespace std::chrono_literals;
using ldtest::provider;
using ldtest::seconds_since;

namespace {

// The processes of a container whose command line contains `needle` (busybox ps).
std::string processes_matching(sbx::Sandbox& box, const std::string& needle) {
  const auto r = box.exec(
      "ps -o pid,user,args | grep -F -- '" + needle + "' | grep -v grep || true", {.user = "root"});
  REQUIRE(r.return_code == 0);
  return r.stdout_text;
}

struct TempDir : sbx::testing::TempDir {
  TempDir() : sbx::testing::TempDir("sbx-ld-stop") {}
};

// `sbx run` on busybox with the suite label (so leftovers_test sees a leaked sandbox) and a TTL.
std::vector<std::string> sbx_run(std::vector<std::string> options,
                                 const std::vector<std::string>& command) {
  std::vector<std::string> argv{ldtest::sbx_binary(),
                                "run",
                                "--image",
                                ldtest::kBusybox,
                                "--ttl",
                                "120",
                                "--metadata",
                                std::string(ldtest::kSuiteLabel) + "=" + ldtest::kSuiteValue};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.emplace_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

}  // namespace

TEST_CASE(
    "sbx run --timeout 2 on a command that floods its output: 125 within 1 s of the timeout") {
  TempDir dir;
  const std::string err = (dir.path / "stderr").string();
  // The command says when it runs: the bound is counted from there, not from the start of
  // `sbx run` (creating the container takes what it takes on a loaded machine).
  ldtest::Child run(
      {.argv = sbx_run({"--timeout", "2"}, {"sh", "-c", "echo started >&2; exec cat /dev/zero"}),
       .stdout_path = "/dev/null",
       .stderr_path = err});
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (sbx::testing::read_file(err).find("started") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline && run.running()) {
    std::this_thread::sleep_for(5ms);
  }
  const auto started = std::chrono::steady_clock::now();
  const auto code = run.wait_for(30s);
  const double took = seconds_since(started);
  REQUIRE(code);
  CHECK(*code == 125);
  const std::string text = sbx::testing::read_file(err);
  CHECK_MESSAGE(text.find("started") != std::string::npos, text);
  CHECK_MESSAGE(text.find("error_type=timeout") != std::string::npos, text);
  CHECK_MESSAGE(text.find("could not kill") == std::string::npos, text);
  MESSAGE("sbx run --timeout 2 -- cat /dev/zero ended ", took, " s after the command started");
  CHECK(took >= 1.8);  // the timeout runs from the exec's start, just before the marker
  CHECK(took < 2.0 + sbx::testing::slack(1.0));
}

TEST_CASE("sbx run -- yes | head -1: the closed pipe stops the command within 1.5 s") {
  TempDir dir;
  const std::string err = (dir.path / "stderr").string();
  const auto start = std::chrono::steady_clock::now();
  ldtest::Child run({.argv = sbx_run({}, {"yes"}), .stderr_path = err, .pipe_stdout = true});
  // head -1: one line, then the reader goes away.
  std::string line;
  char c = 0;
  while (line.size() < 16 && ::read(run.stdout_fd(), &c, 1) == 1 && c != '\n')
    line += c;
  run.close_stdout();
  const auto code = run.wait_for(30s);
  const double took = seconds_since(start);
  CHECK(line == "y");
  REQUIRE(code);
  CHECK(*code == 141);
  const std::string text = sbx::testing::read_file(err);
  CHECK_MESSAGE(text.find("could not kill") == std::string::npos, text);
  MESSAGE("sbx run -- yes | head -1 took ", took, " s");
  CHECK(took < sbx::testing::slack(1.5));
}

TEST_CASE("an exec cancelled from its own output callback while flooding ends within 1 s") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  std::mutex m;
  std::condition_variable published;
  std::optional<sbx::Operation<sbx::ExecResult>> op;
  std::atomic<size_t> seen{0};
  std::atomic<size_t> after_cancel{0};
  std::atomic<bool> cancelled{false};
  std::chrono::steady_clock::time_point cancelled_at;
  sbx::ExecOptions options;
  options.on_output = [&](sbx::OutputStream, std::string_view bytes) {
    if (cancelled) {
      after_cancel += bytes.size();
      return;
    }
    if ((seen += bytes.size()) < 4 * 1024 * 1024) return;
    std::unique_lock lock(m);
    published.wait(lock, [&] { return op.has_value(); });
    cancelled_at = std::chrono::steady_clock::now();
    cancelled = true;
    op->cancel();  // from inside the callback, as `sbx run` does on EPIPE
  };
  {
    auto started = box.exec_async("cat /dev/zero", options);
    std::lock_guard lock(m);
    op = started;
  }
  published.notify_all();
  CHECK_THROWS_AS(op->get(), sbx::CancelledError);
  REQUIRE(cancelled);
  const double took = seconds_since(cancelled_at);
  MESSAGE("cancel to end: ", took, " s; output delivered after the cancel: ", after_cancel.load(),
          " bytes");
  CHECK(took < 1.0);
  // What was read after the stop is dropped; at most the rest of the chunk in hand gets through.
  CHECK(after_cancel <= 512 * 1024);
  CHECK(processes_matching(box, "/dev/zero") == "");
  CHECK(box.exec("echo still usable").stdout_text == "still usable\n");
  box.close();
}

TEST_CASE("a timed-out exec with a slow output callback stops within 1 s of its timeout") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  sbx::ExecOptions options;
  options.timeout_s = 1.5;
  options.on_output = [](sbx::OutputStream, std::string_view) {
    std::this_thread::sleep_for(20ms);  // a reader slower than the command
  };
  const auto start = std::chrono::steady_clock::now();
  const auto r = box.exec_async("cat /dev/zero", options).get();
  const double took = seconds_since(start);
  CHECK(r.return_code == 125);
  REQUIRE(r.error_type);
  CHECK(*r.error_type == "timeout");
  MESSAGE("timeout 1.5 s, returned after ", took, " s");
  CHECK(took >= 1.5);
  CHECK(took < 1.5 + sbx::testing::slack(1.0));  // as the flood case above (ASan CI: 2.50055 s)
  CHECK(processes_matching(box, "/dev/zero") == "");
  box.close();
}

namespace {

// The daemon's pid (dockerd), for freezing it.
pid_t dockerd_pid() {
  FILE* p = ::popen("pgrep -o -x dockerd", "r");
  REQUIRE(p);
  char line[64] = {};
  const bool read = std::fgets(line, sizeof line, p) != nullptr;
  ::pclose(p);
  REQUIRE_MESSAGE(read, "no dockerd process found");
  return static_cast<pid_t>(std::stol(line));
}

// Freezes the daemon with SIGSTOP for its lifetime. A watchdog process thaws it after 60 s
// whatever happens to this test (a crash here must not leave the machine's daemon frozen).
class FrozenDaemon {
 public:
  explicit FrozenDaemon(pid_t pid) : pid_(pid) {
    watchdog_.emplace(ldtest::Child::Options{
        .argv = {"/bin/sh", "-c", "sleep 60; kill -CONT " + std::to_string(pid)}});
    REQUIRE(::kill(pid_, SIGSTOP) == 0);
  }
  ~FrozenDaemon() {
    ::kill(pid_, SIGCONT);
    watchdog_.reset();
  }
  FrozenDaemon(const FrozenDaemon&) = delete;
  FrozenDaemon& operator=(const FrozenDaemon&) = delete;

 private:
  pid_t pid_;
  std::optional<ldtest::Child> watchdog_;
};

}  // namespace

TEST_CASE(
    "a frozen daemon: Ctrl-C ends sbx run within --stop-timeout, naming what is left and "
    "how to reap it") {
  TempDir dir;
  const std::string err = (dir.path / "stderr").string();
  const std::string run_id = "frozen" + ldtest::unique();
  ldtest::Child run({.argv = sbx_run({"--stop-timeout", "3"}, {"sleep", "100"}),
                     .env = {"SBX_RUN_ID=" + run_id},
                     .stderr_path = err});
  // Wait until the command runs (its container exists and is running), then freeze the daemon.
  bool running = false;
  for (int i = 0; i < 100 && !running; ++i) {
    std::this_thread::sleep_for(100ms);
    for (const auto& name : ldtest::docker().containers_with_label("sbx.run=" + run_id)) {
      const auto inspect = ldtest::docker().inspect(name);
      running = inspect && inspect->at("State").at("Running").as_bool();
    }
  }
  REQUIRE(running);
  std::this_thread::sleep_for(500ms);  // the exec has started
  double took = 0;
  std::optional<int> code;
  {
    FrozenDaemon frozen(dockerd_pid());
    const auto start = std::chrono::steady_clock::now();
    run.kill(SIGINT);
    code = run.wait_for(30s);
    took = seconds_since(start);
  }
  REQUIRE(code);
  CHECK(*code == 130);
  MESSAGE("sbx run with a frozen daemon ended ", took, " s after Ctrl-C (stop timeout 3 s)");
  CHECK(took < 5.0);  // 3 s plus what it takes to notice
  const std::string text = sbx::testing::read_file(err);
  CHECK_MESSAGE(text.find("may still exist. Remove it with: sbx reap --provider local_docker "
                          "--label sbx.run=" +
                          run_id) != std::string::npos,
                text);
  // With the daemon thawed, the reap the message names removes what was left.
  const auto leftovers = ldtest::docker().containers_with_label("sbx.run=" + run_id);
  ldtest::Child reap({.argv = {ldtest::sbx_binary(), "reap", "--provider", "local_docker",
                               "--label", "sbx.run=" + run_id}});
  CHECK(reap.wait_for(60s) == 0);
  for (const auto& name : leftovers)
    CHECK(ldtest::docker().wait_gone(name, 30s));
}
