// Sessions (sbx.session/1) and terminals (sbx.pty/1) through the sbx:: host API, over the
// test_processes plugin: its sessions are sdk::ShellSessions over its exec, its terminals host
// processes on real pseudo-terminals (tests/plugins/test_processes/terminal.hpp). What every
// provider's terminals must do (echo, sizes, Ctrl-C, takeover and replay) is the conformance
// suite's ext.pty.* cases, run over this plugin as conformance.test_processes; here, the host
// API's own. Every wait is on an event (output seen, an operation ended), bounded.

#include <doctest/doctest.h>

#include "../common/terminal_screen.hpp"

#include <sbx/sbx.hpp>

#include <boost/json.hpp>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct Fixture {
  fs::path root;
  sbx::Host host;
  sbx::Sandbox sandbox;

  Fixture() : root(make_root()), host(options(root)), sandbox(host.provider("p").create({})) {}
  ~Fixture() {
    sandbox.close();
    std::error_code ec;
    fs::remove_all(root, ec);
  }

 private:
  static fs::path make_root() {
    std::string pattern = (fs::temp_directory_path() / "sbx-terminals-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()));
    return pattern;
  }
  static sbx::Host::Options options(const fs::path& root) {
    sbx::Host::Options o;
    o.config = sbx::Config::parse(
        R"({"providers": {"p": {"plugin": "test_processes", "config": {"root": )" +
        boost::json::serialize(boost::json::value(root.string())) + "}}}}");
    o.plugin_dirs = {SBX_TEST_PLUGIN_DIR};
    o.use_default_plugin_dirs = false;
    return o;
  }
};

using sbx::testing::attach_error;
using sbx::testing::Screen;

}  // namespace

TEST_CASE("a session keeps cwd, exported variables and background jobs between commands") {
  Fixture f;
  REQUIRE(f.sandbox.supports("sbx.session/1"));
  sbx::Session session = f.sandbox.open_session({.env = {{"GREETING", "hello"}}});
  CHECK(!session.id().empty());

  CHECK(session.run("mkdir -p work/sub && cd work/sub && export COLOR=blue").return_code == 0);
  const sbx::ExecResult where = session.run("pwd; echo $COLOR $GREETING");
  CHECK(where.stdout_text.find("/work/sub\n") != std::string::npos);  // in the sandbox's dir
  CHECK(where.stdout_text.find("blue hello") != std::string::npos);

  // Each command has its own exit code; a failing one keeps the state.
  CHECK(session.run("false").return_code == 1);
  CHECK(session.run("echo $COLOR").stdout_text == "blue\n");
  // A run's own env and cwd act as `export` and `cd` typed first: they win, and carry on.
  const sbx::ExecResult moved =
      session.run("pwd; echo $COLOR", {.cwd = "/work", .env = {{"COLOR", "red"}}});
  CHECK(moved.stdout_text.find("/work\nred\n") != std::string::npos);
  CHECK(session.run("pwd").stdout_text ==
        moved.stdout_text.substr(0, moved.stdout_text.find('\n') + 1));
  CHECK(session.run("echo $COLOR; export COLOR=blue").stdout_text == "red\n");

  // A background job started in one command is alive in the next.
  CHECK(session.run("sleep 60 >/dev/null 2>&1 & echo $! > job.pid").return_code == 0);
  // (Alive: not a zombie, which kill -0 would also find.)
  const std::string alive =
      "s=$(cut -d' ' -f3 /proc/$(cat job.pid)/stat) && [ \"$s\" != Z ] && echo alive";
  CHECK(session.run(alive).stdout_text == "alive\n");

  // Another handle's view: the id is enough.
  sbx::Session again = f.sandbox.session(session.id());
  CHECK(again.run("echo $COLOR").stdout_text == "blue\n");

  // Two sessions do not share state.
  sbx::Session other = f.sandbox.open_session();
  CHECK(other.run("echo ${COLOR:-unset}").stdout_text == "unset\n");
  other.close();

  session.run("kill $(cat job.pid)");
  session.close();
  CHECK_THROWS_AS(session.run("true"), sbx::NotFoundError);
  CHECK_THROWS_AS(session.close(), sbx::NotFoundError);
  CHECK_THROWS_AS(f.sandbox.session("no such id!"), sbx::InvalidArgumentError);
}

TEST_CASE("closing a session kills its command still running") {
  Fixture f;
  sbx::Session session = f.sandbox.open_session();
  auto run = session.run_async("echo started; sleep 60; echo never",
                               {.on_output = [](sbx::OutputStream, std::string_view) {}});
  // The run has recorded itself once its first line is out; close it then.
  sbx::Session probe = f.sandbox.session(session.id());
  REQUIRE(probe
              .run("for i in $(seq 200); do ls \"${TMPDIR:-/tmp}\"/.sbx-session-*.run.* "
                   ">/dev/null 2>&1 && exit 0; sleep 0.05; done; exit 1")
              .return_code == 0);
  const auto started = std::chrono::steady_clock::now();
  session.close();
  REQUIRE(run.wait_for(20s));
  CHECK(run.get().return_code != 0);  // killed, not the 60 s sleep's end
  CHECK(std::chrono::steady_clock::now() - started < 20s);
}

TEST_CASE("pipe mode keeps stdout and stderr apart; cancel detaches without ending the process") {
  Fixture f;
  sbx::Pty pty = f.sandbox.open_pty({.command = "echo to-out; echo to-err >&2; read line; "
                                                "echo got-$line; exit 3",
                                     .tty = false});
  Screen screen;
  auto first = pty.attach_async({.since = 0, .on_output = screen.sink()});
  REQUIRE(screen.wait_for("to-out"));
  first.cancel();
  CHECK(attach_error<sbx::CancelledError>(first).status() == SBX_STATUS_CANCELLED);

  Screen again;
  auto second = pty.attach_async({.since = 0, .on_output = again.sink()});
  pty.write("x\n");
  REQUIRE(second.wait_for(20s));
  CHECK(second.get() == 3);
  std::lock_guard lock(again.mutex);
  CHECK(again.text == "to-out\ngot-x\n");
  CHECK(again.err == "to-err\n");
  pty.resize(10, 10);  // nothing to resize in pipe mode: success
  pty.close();
}

TEST_CASE("closing the sandbox ends its terminals and their attachments") {
  Fixture f;
  sbx::Pty pty = f.sandbox.open_pty({.command = "echo up; sleep 60"});
  Screen screen;
  auto attached = pty.attach_async({.since = 0, .on_output = screen.sink()});
  REQUIRE(screen.wait_for("up"));
  f.sandbox.close();
  REQUIRE(attached.wait_for(20s));
  CHECK_THROWS_AS(attached.get(), sbx::Error);
  CHECK_THROWS_AS(pty.write("x"), sbx::FailedPreconditionError);  // the sandbox is closed
}
