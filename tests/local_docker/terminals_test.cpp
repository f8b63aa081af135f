// local_docker's sbx.pty/1 against the real daemon: terminals through the sandbox's agent (a real
// pseudo-terminal in the container, the plugin holding its WebSocket). Echo, the starting size and
// a resize seen by `stty size`, Ctrl-C, the exit code, pipe mode, env, cwd and the image's user,
// takeover with replay, and closing (the terminal, the sandbox) while a reader waits. Without the
// agent (the .docker_exec twin, which runs only the first case) the extension is not offered. Every
// wait is on an event, bounded.

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

TEST_CASE("without the agent there are no terminals; with it, sbx.pty/1 is offered") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  CHECK(box.supports("sbx.pty/1") == ldtest::agent_mode());
  if (!ldtest::agent_mode()) CHECK_THROWS_AS(box.open_pty({}), sbx::UnimplementedError);
  box.close();
}

TEST_CASE("a terminal in the sandbox: the starting size, echo, resize, Ctrl-C and the exit code") {
  REQUIRE(ldtest::agent_mode());  // the .docker_exec twin runs only the case above
  sbx::Sandbox box = provider().create(ldtest::spec());
  sbx::Pty pty = box.open_pty({.rows = 30, .cols = 90});
  Screen screen;
  auto attached = pty.attach_async({.since = 0, .on_output = screen.sink()});

  pty.write("stty size\n");
  CHECK(screen.wait_for("30 90"));
  pty.write("echo sum=$((40+2))\n");  // the output, not the echo of what was typed
  CHECK(screen.wait_for("sum=42"));
  pty.resize(40, 100);
  pty.write("stty size\n");
  CHECK(screen.wait_for("40 100"));

  pty.write("sh -c 'echo sleeping-$((2+3)); exec sleep 60'\n");
  REQUIRE(screen.wait_for("sleeping-5"));  // printed by the foreground job, which becomes the sleep
  pty.write("\x03");
  pty.write("echo after-$((50+5))\n");
  CHECK(screen.wait_for("after-55"));  // the sleep was interrupted: 30 s of wait, 60 of sleep

  pty.write("exit 7\n");
  REQUIRE(attached.wait_for(30s));
  CHECK(attached.get() == 7);
  {
    std::lock_guard lock(screen.mutex);
    CHECK(screen.first_offset == 0u);
    CHECK(screen.in_order);
  }
  CHECK_THROWS_AS(pty.write("late\n"), sbx::FailedPreconditionError);
  pty.close();
  CHECK_THROWS_AS(pty.close(), sbx::NotFoundError);
  box.close();
}

TEST_CASE("pipe mode with env, cwd and the image's user; stdout and stderr apart") {
  REQUIRE(ldtest::agent_mode());
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

TEST_CASE("takeover replays what the first reader saw; close ends a waiting reader") {
  REQUIRE(ldtest::agent_mode());
  sbx::Sandbox box = provider().create(ldtest::spec());
  sbx::Pty pty = box.open_pty({.command = "echo first-line; cat"});
  Screen one;
  auto first = pty.attach_async({.since = 0, .on_output = one.sink()});
  REQUIRE(one.wait_for("first-line"));

  auto refused = pty.attach_async({.since = 0, .takeover = false, .on_output = [](auto...) {}});
  CHECK(attach_error<sbx::FailedPreconditionError>(refused).status() ==
        SBX_STATUS_FAILED_PRECONDITION);

  Screen two;
  auto second =
      box.pty(pty.id()).attach_async({.since = 0, .takeover = true, .on_output = two.sink()});
  CHECK(attach_error<sbx::FailedPreconditionError>(first).reason() == "taken_over");
  CHECK(two.wait_for("first-line"));
  pty.write("typed-later\n");
  CHECK(two.wait_for("typed-later"));

  pty.close();  // the agent kills the cat; the waiting reader hears NOT_FOUND
  CHECK(attach_error<sbx::NotFoundError>(second).status() == SBX_STATUS_NOT_FOUND);
  CHECK(box.exec("ps -o args | grep -c '^cat$'").stdout_text == "0\n");
  box.close();
}

TEST_CASE("closing the sandbox ends its terminals' readers") {
  REQUIRE(ldtest::agent_mode());
  sbx::Sandbox box = provider().create(ldtest::spec());
  sbx::Pty pty = box.open_pty({});
  Screen screen;
  auto attached = pty.attach_async({.since = 0, .on_output = screen.sink()});
  pty.write("echo ready-$((1+1))\n");
  REQUIRE(screen.wait_for("ready-2"));
  box.close();
  CHECK(attach_error<sbx::NotFoundError>(attached).status() == SBX_STATUS_NOT_FOUND);
}
