// local_docker through the host API: lifecycle, exec semantics, streaming, timeouts, cancellation,
// concurrency, shell detection, labels, containers that vanish, list and reap.

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

using namespace std::chrono_literals;
using ldtest::docker;
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

}  // namespace

TEST_CASE("create, exec, status and close") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  const std::string id = box.id();
  CHECK(id.rfind("sbx-", 0) == 0);
  auto inspect = docker().inspect(id);
  REQUIRE(inspect);
  CHECK(inspect->at("State").at("Status").as_string() == "running");
  CHECK(inspect->at("HostConfig").at("NetworkMode").as_string() == "none");
  // With the agent, it is the init (PID 1); with Docker exec, Docker's init is.
  CHECK(inspect->at("HostConfig").at("Init").as_bool() == !ldtest::agent_mode());
  if (ldtest::agent_mode()) {
    CHECK(box.exec("tr '\\0' ' ' </proc/1/cmdline").stdout_text.starts_with("/.sbx/sbx-agent "));
  }

  CHECK(box.status() == sbx::SandboxStatus::running);
  const auto r = box.exec("echo hello; echo oops >&2");
  CHECK(r.return_code == 0);
  CHECK(r.stdout_text == "hello\n");
  CHECK(r.stderr_text == "oops\n");
  CHECK_FALSE(r.error_type);

  box.close();
  CHECK_FALSE(docker().exists(id));
  CHECK(box.status() == sbx::SandboxStatus::stopped);
}

TEST_CASE("labels are stamped: sbx.sandbox, host labels, metadata, expiry") {
  auto spec = ldtest::spec();
  spec.metadata["team"] = "infra";
  spec.metadata["sbx.provider"] = "metadata-must-not-win";
  sbx::Sandbox box = provider().create(spec);
  const auto labels = docker().inspect(box.id())->at("Config").at("Labels").as_object();
  CHECK(labels.at("sbx.sandbox").as_string() == "1");
  CHECK(labels.at("team").as_string() == "infra");
  CHECK(labels.at("sbx.provider").as_string() == "docker");  // the host's label wins
  CHECK(labels.contains("sbx.run"));
  CHECK(labels.contains("sbx.host"));
  CHECK(labels.at(ldtest::kSuiteLabel).as_string() == ldtest::kSuiteValue);
  // TTL: the expiry is stamped as unix seconds, about now + ttl.
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  const auto expires = std::stoll(std::string(labels.at("sbx.expires_at").as_string()));
  CHECK(expires > now + 800);
  CHECK(expires <= now + 901);
  box.close();
}

TEST_CASE("env, cwd and user") {
  auto spec = ldtest::spec();
  spec.env = {{"FROM_SPEC", "spec value with spaces"}, {"BOTH", "spec"}};
  spec.workdir = "/work/dir";
  sbx::Sandbox box = provider().create(spec);

  SUBCASE("spec env, exec env, and the exec wins") {
    const auto r = box.exec("echo \"$FROM_SPEC|$BOTH|$FROM_EXEC\"",
                            {.env = {{"BOTH", "exec"}, {"FROM_EXEC", "x=y"}}});
    CHECK(r.stdout_text == "spec value with spaces|exec|x=y\n");
    CHECK(box.exec("echo \"$BOTH\"").stdout_text == "spec\n");
  }
  SUBCASE("cwd defaults to the workdir (created) and can be set per exec") {
    CHECK(box.exec("pwd").stdout_text == "/work/dir\n");
    CHECK(box.exec("pwd", {.cwd = "/tmp"}).stdout_text == "/tmp\n");
  }
  SUBCASE("user by name, by uid, uid:gid, root") {
    CHECK(box.exec("id -u").stdout_text == "0\n");
    CHECK(box.exec("id -u", {.user = "sbx"}).stdout_text == "1000\n");
    CHECK(box.exec("id -un", {.user = "1000"}).stdout_text == "sbx\n");
    CHECK(box.exec("id -u; id -g", {.user = "1000:1000"}).stdout_text == "1000\n1000\n");
    CHECK(box.exec("id -u", {.user = "root"}).stdout_text == "0\n");
    CHECK(box.exec("id -u", {.user = "4242"}).stdout_text == "4242\n");  // not in passwd
  }
  SUBCASE("an unknown user name: the runtime cannot start it (125, sandbox)") {
    const auto r = box.exec("echo never", {.user = "no-such-user"});
    CHECK(r.return_code == 125);
    REQUIRE(r.error_type);
    CHECK(*r.error_type == "sandbox");
    CHECK(r.stdout_text.empty());
    CHECK(r.stderr_text.find("no-such-user") != std::string::npos);
  }
  box.close();
}

TEST_CASE("exit codes are results, not errors") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  auto r = box.exec("echo partial; exit 3");
  CHECK(r.return_code == 3);
  CHECK(r.stdout_text == "partial\n");
  CHECK_FALSE(r.error_type);
  CHECK(box.exec("false").return_code == 1);
  r = box.exec("no-such-command-xyz");
  CHECK(r.return_code == 127);
  CHECK_FALSE(r.error_type);  // the shell ran and said so: a result of the command
  CHECK(box.exec("kill -9 $$").return_code == 137);
  // Output that merely starts like the runtime's failure message is still the command's output.
  r = box.exec("printf 'OCI runtime exec failed? no'; exit 126");
  CHECK(r.return_code == 126);
  CHECK_FALSE(r.error_type);
  CHECK(r.stdout_text == "OCI runtime exec failed? no");
  box.close();
}

TEST_CASE("a command whose arguments are too long for execve: 125/sandbox with a clear reason") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  // One argument of up to 131071 bytes (MAX_ARG_STRLEN with its NUL) is fine...
  auto command_of = [](size_t size) {  // exactly `size` bytes
    const std::string tail = "; echo ran";
    return ": " + std::string(size - 2 - tail.size(), 'a') + tail;
  };
  REQUIRE(command_of(131071).size() == 131071);
  auto r = box.exec(command_of(131071));
  CHECK(r.return_code == 0);
  CHECK(r.stdout_text == "ran\n");
  // ... one byte more is E2BIG: sh -c gets the command as one argument.
  r = box.exec(command_of(131072));
  CHECK(r.return_code == 125);
  REQUIRE(r.error_type);
  CHECK(*r.error_type == "sandbox");
  CHECK(r.stdout_text.empty());
  CHECK_MESSAGE(r.stderr_text.find("could not start") != std::string::npos, r.stderr_text);
  CHECK(r.stderr_text.find("131071") != std::string::npos);
  // The same for one environment string of the exec.
  r = box.exec("echo ran", {.env = {{"BIG", std::string(140000, 'b')}}});
  CHECK(r.return_code == 125);
  CHECK(r.error_type == std::optional<std::string>("sandbox"));
  CHECK(r.stderr_text.find("BIG") != std::string::npos);
  // Each string within the limit, all together over the kernel's 2 MiB: the daemon's answer (runc's
  // "exec ...: argument list too long", exit 1) is recognised.
  sbx::ExecOptions many;
  for (int i = 0; i < 24; ++i)
    many.env["V" + std::to_string(i)] = std::string(100000, 'v');
  r = box.exec("echo ran", many);
  CHECK(r.return_code == 125);
  CHECK(r.error_type == std::optional<std::string>("sandbox"));
  CHECK(r.stdout_text.empty());
  CHECK_MESSAGE(r.stderr_text.find("argument list too long") != std::string::npos, r.stderr_text);
  CHECK(r.stderr_text.find("could not start") != std::string::npos);
  // A command printing the same line itself, with another exit code, is a result.
  r = box.exec("echo 'exec /bin/sh: argument list too long' >&2; exit 3");
  CHECK(r.return_code == 3);
  CHECK_FALSE(r.error_type);
  CHECK(r.stderr_text == "exec /bin/sh: argument list too long\n");
  CHECK(box.exec("echo still usable").stdout_text == "still usable\n");
  box.close();
}

TEST_CASE("output streams as it is produced, stdout and stderr apart") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  std::mutex m;
  std::vector<std::pair<sbx::OutputStream, std::string>> chunks;
  std::vector<double> arrival;
  const auto start = std::chrono::steady_clock::now();
  sbx::ExecOptions options;
  options.on_output = [&](sbx::OutputStream s, std::string_view bytes) {
    std::lock_guard lock(m);
    chunks.emplace_back(s, std::string(bytes));
    arrival.push_back(seconds_since(start));
  };
  const auto r =
      box.exec_async("echo one; sleep 1; echo two >&2; sleep 1; echo three", options).get();
  const double total = seconds_since(start);
  CHECK(r.return_code == 0);
  CHECK(r.stdout_text.empty());
  std::lock_guard lock(m);
  std::string out, err;
  for (const auto& [s, text] : chunks)
    (s == sbx::OutputStream::out ? out : err) += text;
  CHECK(out == "one\nthree\n");
  CHECK(err == "two\n");
  REQUIRE_FALSE(arrival.empty());
  CHECK(total - arrival.front() >= 1.5);  // "one" came two seconds before the end
  CHECK(total >= 2.0);
  box.close();
}

TEST_CASE("a first line ending in CRLF streams at once (a server's \"ready\r\n\")") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  std::mutex m;
  std::optional<double> arrived;
  const auto start = std::chrono::steady_clock::now();
  sbx::ExecOptions options;
  options.on_output = [&](sbx::OutputStream, std::string_view) {
    std::lock_guard lock(m);
    if (!arrived) arrived = seconds_since(start);
  };
  const auto r = box.exec_async("printf 'ready\\r\\n'; sleep 2", options).get();
  const double total = seconds_since(start);
  CHECK(r.return_code == 0);
  std::lock_guard lock(m);
  REQUIRE(arrived);
  CHECK(total - *arrived >= 1.5);  // not held back until the end
  box.close();
}

TEST_CASE("a slow output consumer slows its own exec only, not the provider's other sandboxes") {
  sbx::Sandbox a = provider().create(ldtest::spec());
  sbx::Sandbox b = provider().create(ldtest::spec());
  std::atomic<bool> a_started{false};
  sbx::ExecOptions slow;
  slow.on_output = [&](sbx::OutputStream, std::string_view) {
    a_started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a full pipe, a busy caller
  };
  auto running = a.exec_async("for i in 1 2 3 4 5 6; do echo $i; sleep 0.1; done", slow);
  while (!a_started)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Three seconds of A's callbacks to come; B's command must not wait for them.
  const auto r = b.exec("echo hi", {.timeout_s = 2});
  CHECK(r.return_code == 0);
  CHECK_FALSE(r.error_type);
  CHECK(r.stdout_text == "hi\n");
  CHECK(running.get().return_code == 0);
  a.close();
  b.close();
}

TEST_CASE("a large output arrives whole") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  const auto r =
      box.exec("head -c 5000000 /dev/zero | tr '\\0' x; head -c 300000 /dev/zero | tr '\\0' y >&2");
  CHECK(r.return_code == 0);
  CHECK(r.stdout_text.size() == 5000000u);
  CHECK(r.stderr_text.size() == 300000u);
  CHECK(r.stdout_text.find_first_not_of('x') == std::string::npos);
  box.close();
}

TEST_CASE("timeout: 125/timeout with the output so far, and the processes inside are killed") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  for (const char* user : {"root", "sbx"}) {
    CAPTURE(user);
    const std::string marker = std::to_string(40000 + std::rand() % 20000);
    // A child in the background, one in its own session (out of the process group), and the
    // foreground sleep: all carry the exec's tag and must all die.
    const std::string command = "echo before; echo err >&2; sleep " + marker + "1 & setsid sleep " +
                                marker + "2 & sleep " + marker + "3; echo after";
    const auto start = std::chrono::steady_clock::now();
    const auto r = box.exec(command, {.timeout_s = 1.5, .user = std::string(user)});
    const double took = seconds_since(start);
    CHECK(r.return_code == 125);
    REQUIRE(r.error_type);
    CHECK(*r.error_type == "timeout");
    CHECK(r.stdout_text == "before\n");
    CHECK(r.stderr_text == "err\n");
    CHECK(took >= 1.4);
    CHECK(took < 8.0);
    CHECK(processes_matching(box, "sleep " + marker) == "");
    CHECK(box.exec("echo still usable").stdout_text == "still usable\n");
  }
  box.close();
}

TEST_CASE("cancellation kills the command inside and throws CancelledError") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  const std::string marker = std::to_string(60000 + std::rand() % 9000);
  auto op = box.exec_async("sleep " + marker + " & sleep " + marker);
  std::this_thread::sleep_for(700ms);
  CHECK(processes_matching(box, "sleep " + marker) != "");  // it is running
  const auto start = std::chrono::steady_clock::now();
  op.cancel();
  CHECK_THROWS_AS(op.get(), sbx::CancelledError);
  CHECK(seconds_since(start) < 8.0);
  CHECK(processes_matching(box, "sleep " + marker) == "");
  box.close();
}

TEST_CASE("many concurrent execs on one sandbox and on several") {
  std::vector<sbx::Sandbox> boxes;
  std::vector<sbx::Operation<sbx::Sandbox>> creating;
  for (int i = 0; i < 4; ++i)
    creating.push_back(provider().create_async(ldtest::spec()));
  for (auto& op : creating)
    boxes.push_back(op.get());

  std::vector<std::pair<size_t, sbx::Operation<sbx::ExecResult>>> ops;
  for (int i = 0; i < 48; ++i)
    ops.emplace_back(0, boxes[0].exec_async("echo one-" + std::to_string(i)));
  for (size_t b = 0; b < boxes.size(); ++b) {
    for (int i = 0; i < 16; ++i) {
      ops.emplace_back(b, boxes[b].exec_async("echo $HOSTNAME-" + std::to_string(i)));
    }
  }
  size_t ok = 0;
  for (size_t n = 0; n < ops.size(); ++n) {
    auto& [b, op] = ops[n];
    const auto r = op.get();
    CHECK(r.return_code == 0);
    if (n < 48) {
      ok += r.stdout_text == "one-" + std::to_string(n) + "\n";
    } else {
      ok += r.stdout_text.find("-" + std::to_string((n - 48) % 16) + "\n") != std::string::npos;
    }
  }
  CHECK(ok == ops.size());
  for (auto& box : boxes)
    box.close();
}

TEST_CASE("exec.concurrency caps the execs in flight; status is not stuck behind them") {
  sbx::Sandbox box = provider("docker_small").create(ldtest::spec());  // concurrency 2
  const auto start = std::chrono::steady_clock::now();
  std::vector<sbx::Operation<sbx::ExecResult>> ops;
  for (int i = 0; i < 6; ++i)
    ops.push_back(box.exec_async("sleep 1"));
  std::this_thread::sleep_for(200ms);
  const auto status_start = std::chrono::steady_clock::now();
  CHECK(box.status() == sbx::SandboxStatus::running);
  CHECK(seconds_since(status_start) < 1.0);
  for (auto& op : ops)
    CHECK(op.get().return_code == 0);
  // Six one-second commands, two at a time: three rounds.
  CHECK(seconds_since(start) >= 2.9);
  box.close();
}

TEST_CASE("shell detection: bash when the image has it, else sh; a configured shell wins") {
  sbx::Sandbox bash_box = provider().create(ldtest::spec(ldtest::kBash));
  CHECK(bash_box.exec("echo ${BASH_VERSION:+bash}").stdout_text == "bash\n");
  CHECK(bash_box.exec("[[ 1 == 1 ]] && echo bash-syntax").stdout_text == "bash-syntax\n");
  bash_box.close();

  sbx::Sandbox busybox_box = provider().create(ldtest::spec());
  CHECK(busybox_box.exec("echo ${BASH_VERSION:-sh}").stdout_text == "sh\n");
  busybox_box.close();

  sbx::Sandbox configured = provider("docker_sh").create(ldtest::spec(ldtest::kBash));
  CHECK(configured.exec("echo ${BASH_VERSION:-sh}").stdout_text == "sh\n");
  configured.close();
}

TEST_CASE("a shell the runtime cannot start: 125/sandbox with the runtime's reason") {
  sbx::Sandbox box = provider("docker_noshell").create(ldtest::spec());
  const auto r = box.exec("echo never");
  CHECK(r.return_code == 125);
  REQUIRE(r.error_type);
  CHECK(*r.error_type == "sandbox");
  CHECK(r.stdout_text.empty());
  CHECK(r.stderr_text.find("/no/such/shell") != std::string::npos);
  // Output of a command that ran and ends like the daemon's message is still its output.
  sbx::Sandbox normal = provider().create(ldtest::spec());
  const auto crlf = normal.exec("printf 'line\r\n'; exit 126");
  CHECK(crlf.return_code == 126);
  CHECK_FALSE(crlf.error_type);
  CHECK(crlf.stdout_text == "line\r\n");
  normal.close();
  box.close();
}

TEST_CASE("a container removed from outside: status stopped, exec fails, close succeeds") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  docker().remove(box.id());
  CHECK(box.status() == sbx::SandboxStatus::stopped);
  try {
    box.exec("echo gone");
    FAIL("exec on a removed container must throw");
  } catch (const sbx::NotFoundError& e) {
    CHECK(std::string(e.what()).find(box.id()) != std::string::npos);
  }
  CHECK_THROWS_AS(box.upload_bytes("x", "/x"), sbx::NotFoundError);
  CHECK_NOTHROW(box.close());
  CHECK_NOTHROW(box.close());  // twice
}

TEST_CASE("a container killed from outside: status stopped, exec fails, close removes it") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  const std::string id = box.id();
  docker().kill(id);
  for (int i = 0; i < 50 && box.status() != sbx::SandboxStatus::stopped; ++i) {
    std::this_thread::sleep_for(100ms);
  }
  CHECK(box.status() == sbx::SandboxStatus::stopped);
  // Stopped (409) or, once AutoRemove got to it, gone (404): an error either way, not a result.
  try {
    box.exec("echo dead");
    FAIL("exec in a killed container must throw");
  } catch (const sbx::Error& e) {
    CHECK((e.status() == SBX_STATUS_FAILED_PRECONDITION || e.status() == SBX_STATUS_NOT_FOUND));
    CHECK(std::string(e.what()).find(id) != std::string::npos);
  }
  CHECK_NOTHROW(box.close());
  CHECK(docker().wait_gone(id, 10s));
}

TEST_CASE("an exec in flight when the container is removed or killed from outside: NOT_FOUND") {
  // The sandbox ended under the command (docs/sandbox-semantics.md, "Closed and gone
  // sandboxes"): no result, not the 137 of the kill. Docker exec's path asks the daemon, which
  // records the container's end a moment after the command's.
  for (const bool remove : {true, false}) {
    CAPTURE(remove);
    sbx::Sandbox box = provider().create(ldtest::spec());
    std::promise<void> started;
    sbx::ExecOptions options;
    options.on_output = [&started, once = true](sbx::OutputStream, std::string_view) mutable {
      if (std::exchange(once, false)) started.set_value();
    };
    auto op = box.exec_async("echo started; sleep 30", options);
    REQUIRE(started.get_future().wait_for(30s) == std::future_status::ready);
    if (remove) {
      docker().remove(box.id());
    } else {
      docker().kill(box.id());
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      const auto r = op.get();
      FAIL("a command whose sandbox ended under it has no result, got " << r.return_code);
    } catch (const sbx::NotFoundError& e) {
      CHECK_MESSAGE(std::string(e.what()).find(box.id()) != std::string::npos, e.what());
    }
    CHECK(seconds_since(start) < 10.0);
    box.close();
  }
}

TEST_CASE("list and reap by label") {
  const std::string run = ldtest::unique();
  std::vector<sbx::Sandbox> boxes;
  for (int i = 0; i < 2; ++i) {
    auto spec = ldtest::spec();
    spec.metadata["sbx.test.reap"] = run;
    spec.metadata["index"] = std::to_string(i);
    boxes.push_back(provider().create(spec));
  }
  sbx::Sandbox other = provider().create(ldtest::spec());

  auto listed = provider().list({{"sbx.test.reap", run}});
  REQUIRE(listed.size() == 2);
  for (const auto& info : listed) {
    CHECK((info.id == boxes[0].id() || info.id == boxes[1].id()));
    CHECK(info.status == sbx::SandboxStatus::running);
    CHECK(info.labels.at("sbx.test.reap") == run);
    CHECK(info.labels.at("sbx.sandbox") == "1");
    const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    CHECK(info.created_unix_ms > now_ms - 120'000);
    CHECK(info.created_unix_ms <= now_ms + 1'000);
  }
  // Key present, any value; and a selector on two keys.
  CHECK(provider().list({{"sbx.test.reap", ""}}).size() >= 2);
  CHECK(provider().list({{"sbx.test.reap", run}, {"index", "1"}}).size() == 1);
  CHECK(provider().list({{"sbx.test.reap", "no-such-run"}}).empty());

  const auto reaped = provider().reap({{"sbx.test.reap", run}});
  CHECK(reaped.size() == 2);
  CHECK_FALSE(docker().exists(boxes[0].id()));
  CHECK_FALSE(docker().exists(boxes[1].id()));
  CHECK(provider().list({{"sbx.test.reap", run}}).empty());
  CHECK(docker().exists(other.id()));  // not selected, not touched
  for (auto& box : boxes)
    CHECK_NOTHROW(box.close());
  other.close();
}

TEST_CASE("kill -9 -1 as root inside: the command ends, the host never hangs on the sandbox") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  // Every process the sandbox's root may signal dies but the shell that sends it (and PID 1).
  std::optional<sbx::ExecResult> r;
  try {
    r = box.exec("sleep 300 & kill -9 -1; echo after", {.timeout_s = 60});
  } catch (const sbx::NotFoundError& e) {
    // Docker exec: the sandbox ended under the command before its echo (below).
    CHECK_FALSE_MESSAGE(ldtest::agent_mode(), e.what());
  }
  if (ldtest::agent_mode()) {
    // The agent is PID 1, which a signal from inside its namespace cannot kill: it still serves.
    REQUIRE(r);
    CHECK(r->stdout_text == "after\n");
    CHECK(r->return_code == 0);
    CHECK(box.exec("echo alive").stdout_text == "alive\n");
    // SIGKILL's delivery and the exit it causes are asynchronous: a process being killed can
    // still be listed for a moment (seen under TSan). It must be gone soon, and stay gone.
    CHECK(sbx::testing::eventually([&] { return processes_matching(box, "sleep 300").empty(); },
                                   std::chrono::seconds(10)));
    CHECK(box.status() == sbx::SandboxStatus::running);
  } else {
    // Docker's init survives, its child (the keep-alive) does not: the sandbox ends (the command
    // with it, before its echo: NOT_FOUND, or after: its result), and says so at once.
    const bool ended = docker().wait_gone(box.id(), std::chrono::seconds(20)) ||
                       box.status() == sbx::SandboxStatus::stopped;
    CHECK(ended);
    CHECK_THROWS_AS(box.exec("echo alive"), sbx::NotFoundError);
  }
  box.close();
}

TEST_CASE("the agent's socket is reachable by root on the host only, one directory per sandbox") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  const auto inspect = docker().inspect(box.id());
  REQUIRE(inspect);
  const auto& labels = inspect->at("Config").at("Labels").as_object();
  if (!ldtest::agent_mode()) {
    CHECK_FALSE(labels.contains("sbx.agent"));
    box.close();
    return;
  }
  const std::string run_dir(labels.at("sbx.agent").as_string());
  const std::filesystem::path agent_dir =
      std::filesystem::path(run_dir).parent_path().parent_path();
  struct stat st {};
  REQUIRE(::stat(agent_dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);  // only root enters: the sockets are below
  CHECK(st.st_uid == 0);
  REQUIRE(::stat((run_dir + "/agent.sock").c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  // The sandbox sees its own directory only, and cannot write the agent's binary.
  CHECK(box.exec("ls /.sbx/run").stdout_text == "agent.sock\n");
  const auto w = box.exec("echo x > /.sbx/sbx-agent");
  CHECK(w.return_code != 0);
  box.close();
  CHECK_FALSE(std::filesystem::exists(run_dir));  // close removes it
}

TEST_CASE("an image without sh, date or sleep: the TTL holds; a command needing a shell says so") {
  // sbx-empty (scripts/docker-up.sh) has no program at all; the readiness probe needs a shell.
  sbx::Host host(ldtest::options_with(R"({"probe": {"command": null}})"));
  sbx::Provider p = host.provider("p");
  auto spec = ldtest::spec("sbx-empty:latest");
  spec.ttl_s = 3;
  if (!ldtest::agent_mode()) {
    // Docker exec's keep-alive is a shell loop: the sandbox ends at once (without a probe its
    // create may not see it) and runs no command.
    sbx::Sandbox box;
    try {
      box = p.create(spec);
    } catch (const sbx::CreateError& e) {
      CHECK(std::string(e.what()).find("sh") != std::string::npos);
      return;
    }
    // Gone by the time the command comes (an error), or not quite (the command cannot start: a
    // shell-less image's 125/"sandbox"); never a command that ran.
    try {
      const auto r = box.exec("echo hi");
      CHECK(r.return_code == 125);
      CHECK(r.error_type == std::optional<std::string>("sandbox"));
    } catch (const sbx::Error&) {
    }
    box.close();
    return;
  }
  const auto created = std::chrono::steady_clock::now();
  sbx::Sandbox box = p.create(spec);
  const auto r = box.exec("echo hi");
  CHECK(r.return_code == 125);
  CHECK(r.error_type == std::optional<std::string>("sandbox"));
  CHECK_MESSAGE(r.stderr_text.find("has no shell") != std::string::npos, r.stderr_text);
  CHECK(box.status() == sbx::SandboxStatus::running);
  // Up until its expiry (the agent keeps it), then removed (AutoRemove once the agent exits).
  CHECK(ldtest::docker().wait_gone(box.id(), std::chrono::seconds(30)));
  CHECK(seconds_since(created) >= 2.0);
  box.close();
}
