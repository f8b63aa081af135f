// local_docker's sbx.session/1 against the real daemon (sdk::BlockingShellSessions over its exec,
// with and without the agent): state and background jobs carried between commands, the run's own
// env and cwd, closing while a command runs, and the errors for closed and malformed ids.

#include "support.hpp"

#include <chrono>
#include <string>

using namespace std::chrono_literals;
using ldtest::provider;

TEST_CASE("a session carries cwd, variables and a background job from one command to the next") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  REQUIRE(box.supports("sbx.session/1"));
  sbx::Session session = box.open_session({.cwd = "/tmp", .env = {{"GREETING", "hi"}}});

  CHECK(session.run("pwd").stdout_text == "/tmp\n");
  CHECK(session.run("mkdir -p /tmp/a/b && cd /tmp/a/b && export COLOR=blue").return_code == 0);
  CHECK(session.run("pwd; echo $COLOR $GREETING").stdout_text == "/tmp/a/b\nblue hi\n");
  CHECK(session.run("exit 4").return_code == 4);
  CHECK(session.run("echo $COLOR").stdout_text == "blue\n");
  CHECK(session.run("echo $COLOR; pwd", {.cwd = "/", .env = {{"COLOR", "red"}}}).stdout_text ==
        "red\n/\n");

  // A background job outlives the command that started it (not a zombie: it still runs).
  CHECK(session.run("sleep 300 >/dev/null 2>&1 & echo $! > /tmp/job.pid").return_code == 0);
  CHECK(session.run("s=$(cut -d' ' -f3 /proc/$(cat /tmp/job.pid)/stat); echo $s").stdout_text !=
        "Z\n");
  CHECK(box.exec("kill -0 $(cat /tmp/job.pid) && echo running").stdout_text == "running\n");

  // The id works from another handle (the state is in the sandbox).
  CHECK(box.session(session.id()).run("echo $COLOR").stdout_text == "red\n");

  session.close();
  CHECK_THROWS_AS(session.run("true"), sbx::NotFoundError);
  // Closing leaves what the session started in the background running (execd's rule).
  CHECK(box.exec("kill -0 $(cat /tmp/job.pid) && echo running").stdout_text == "running\n");
  box.close();
}

TEST_CASE("closing a session kills the command it still runs") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  sbx::Session session = box.open_session();
  auto run = session.run_async("sleep 300; echo never", {});
  // The run has registered itself once its file is there.
  REQUIRE(box.exec("for i in $(seq 400); do ls /tmp/.sbx-session-*.run.* >/dev/null 2>&1 && "
                   "exit 0; sleep 0.05; done; exit 1")
              .return_code == 0);
  const auto started = std::chrono::steady_clock::now();
  session.close();
  REQUIRE(run.wait_for(60s));
  const sbx::ExecResult result = run.get();
  CHECK(result.return_code != 0);
  CHECK(result.stdout_text.find("never") == std::string::npos);
  CHECK(ldtest::seconds_since(started) < 60);
  box.close();
}
