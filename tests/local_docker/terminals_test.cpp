// local_docker's sbx.pty/1 against the real daemon: terminals through the sandbox's agent (a real
// pseudo-terminal in the container, the plugin holding its WebSocket) and, in the .docker_exec
// twin, without it (a Docker exec with a TTY on a hijacked stream). What every provider must do
// (echo, sizes, Ctrl-C, takeover and replay, pipe mode) is the conformance suite's (ext.pty.*, run
// as conformance.local_docker and its twin); here, what is local_docker's own: pipe mode as the
// image's user with env and cwd, closing a terminal kills its processes, closing the sandbox ends
// its readers, and a terminal another handle opened (as another process would): taken up with the
// agent's replay, or NOT_FOUND without the agent. Every wait is on an event, bounded.

#include "support.hpp"

#include "../common/terminal_screen.hpp"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

using namespace std::chrono_literals;
using ldtest::provider;

namespace {

using sbx::testing::attach_error;
using sbx::testing::Screen;

}  // namespace

TEST_CASE("sbx.pty/1 is offered with the agent and without it") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  CHECK(box.supports("sbx.pty/1"));
  box.close();
}

TEST_CASE("pipe mode with env, cwd and the image's user; stdout and stderr apart") {
  auto spec = ldtest::spec();
  spec.image = "sbx-busybox-user:latest";  // USER sbx (uid 1000): scripts/docker-up.sh
  sbx::Sandbox box = provider().create(spec);
  sbx::Pty pty = box.open_pty({.command = "echo out-$GREETING; echo err-$(id -u) >&2; pwd; "
                                          "read line; echo got-$line; exit 3",
                               .cwd = "/tmp",
                               .env = {{"GREETING", "hi"}},
                               .tty = false});
  Screen screen;
  auto attached = pty.attach_async({.since = 0, .on_output = screen.sink()});
  CHECK(screen.wait_for("out-hi\n/tmp\n"));
  CHECK(screen.wait_for("err-1000\n", true));
  pty.write("typed\n");
  REQUIRE(attached.wait_for(30s));
  CHECK(attached.get() == 3);
  std::lock_guard lock(screen.mutex);
  CHECK(screen.text == "out-hi\n/tmp\ngot-typed\n");  // no terminal: no echo, no \r
  box.close();
}

TEST_CASE("closing a terminal kills what runs on it and ends a waiting reader") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  sbx::Pty pty = box.open_pty({.command = "echo first-line; cat"});
  Screen screen;
  auto attached = pty.attach_async({.since = 0, .on_output = screen.sink()});
  REQUIRE(screen.wait_for("first-line"));
  CHECK(box.exec("ps -o args | grep -c '^cat$'").stdout_text == "1\n");
  pty.close();
  CHECK(attach_error<sbx::NotFoundError>(attached).status() == SBX_STATUS_NOT_FOUND);
  CHECK(box.exec("ps -o args | grep -c '^cat$'").stdout_text == "0\n");
  box.close();
}

namespace {

// With the agent: the second handle takes the terminal up, with the agent's replay.
void taken_up_with_replay() {
  sbx::Sandbox box = provider().create(ldtest::spec());
  sbx::Pty pty = box.open_pty({.command = "echo first-line; cat"});
  Screen one;
  auto first = pty.attach_async({.since = 0, .on_output = one.sink()});
  REQUIRE(one.wait_for("first-line"));

  // A second handle (as another process would have) knows the terminal by its id alone.
  sbx::Sandbox other = provider().connect(box.serialize());
  auto refused = other.pty(pty.id()).attach_async(
      {.since = 0, .takeover = false, .on_output = [](auto...) {}});
  CHECK(attach_error<sbx::FailedPreconditionError>(refused).status() ==
        SBX_STATUS_FAILED_PRECONDITION);
  Screen two;
  auto second =
      other.pty(pty.id()).attach_async({.since = 0, .takeover = true, .on_output = two.sink()});
  CHECK(two.wait_for("first-line"));  // the agent's replay
  CHECK(attach_error<sbx::FailedPreconditionError>(first).reason() == "taken_over");
  other.pty(pty.id()).write("from-the-second\n");
  CHECK(two.wait_for("from-the-second"));
  {
    std::lock_guard lock(two.mutex);
    CHECK(two.first_offset == 0u);
    CHECK(two.in_order);
  }
  // And back: the first handle takes it up again.
  Screen three;
  auto third = pty.attach_async({.since = 0, .on_output = three.sink()});
  CHECK(three.wait_for("from-the-second"));
  CHECK(attach_error<sbx::FailedPreconditionError>(second).reason() == "taken_over");
  other.pty(pty.id()).close();  // closed from either handle
  CHECK(attach_error<sbx::NotFoundError>(third).status() == SBX_STATUS_NOT_FOUND);
  CHECK_THROWS_AS(pty.close(), sbx::NotFoundError);
  box.close();
}

// Without it: the terminal is the first handle's own (Docker attaches no second stream to an exec).
void handle_only() {
  sbx::Sandbox box = provider().create(ldtest::spec());
  sbx::Pty pty = box.open_pty({.command = "echo first-line; cat"});
  Screen one;
  auto first = pty.attach_async({.since = 0, .on_output = one.sink()});
  REQUIRE(one.wait_for("first-line"));
  sbx::Sandbox other = provider().connect(box.serialize());
  auto refused = other.pty(pty.id()).attach_async({.since = 0, .on_output = [](auto...) {}});
  CHECK(attach_error<sbx::NotFoundError>(refused).status() == SBX_STATUS_NOT_FOUND);
  CHECK_THROWS_AS(other.pty(pty.id()).write("x\n"), sbx::NotFoundError);
  pty.write("still-mine\n");  // the first handle's attachment goes on
  CHECK(one.wait_for("still-mine"));
  pty.close();
  CHECK(attach_error<sbx::NotFoundError>(first).status() == SBX_STATUS_NOT_FOUND);
  box.close();
}

}  // namespace

TEST_CASE("a terminal another handle opened: taken up with the agent's replay, else not found") {
  if (ldtest::agent_mode()) {
    taken_up_with_replay();
  } else {
    handle_only();
  }
}

TEST_CASE("closing the sandbox ends its terminals' readers") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  sbx::Pty pty = box.open_pty({});
  Screen screen;
  auto attached = pty.attach_async({.since = 0, .on_output = screen.sink()});
  pty.write("echo ready-$((1+1))\n");
  REQUIRE(screen.wait_for("ready-2"));
  box.close();
  CHECK(attach_error<sbx::NotFoundError>(attached).status() == SBX_STATUS_NOT_FOUND);
}
