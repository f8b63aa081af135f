// Cases of the interactive extensions (docs/terminals.md): sbx.session/1 (a shell whose state
// carries from one command to the next) and sbx.pty/1 (terminals). Each runs when the provider
// lists the extension and is "not offered" otherwise. Every wait is on output or an operation's
// end, bounded.

#include "suite.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

namespace sbx::conformance {
namespace {

using namespace std::chrono_literals;

constexpr auto kWait = 30s;

// What an attachment has read, and waits on it.
struct Screen {
  std::mutex mutex;
  std::condition_variable changed;
  std::string out, err;
  std::optional<uint64_t> first_offset;
  uint64_t next_offset = 0;
  bool gap = false;  // an offset that did not follow the last byte

  PtyAttachOptions attach(std::optional<uint64_t> since = 0, bool takeover = true) {
    return {.since = since,
            .takeover = takeover,
            .on_output = [this](OutputStream stream, uint64_t offset, std::string_view bytes) {
              std::lock_guard lock(mutex);
              if (!first_offset) {
                first_offset = offset;
              } else if (offset != next_offset) {
                gap = true;
              }
              next_offset = offset + bytes.size();
              (stream == OutputStream::err ? err : out).append(bytes);
              changed.notify_all();
            }};
  }
  bool wait_for(const std::string& needle, bool on_stderr = false) {
    std::unique_lock lock(mutex);
    return changed.wait_for(
        lock, kWait, [&] { return (on_stderr ? err : out).find(needle) != std::string::npos; });
  }
  std::string text() {
    std::lock_guard lock(mutex);
    return out;
  }
};

// How an attachment ended: its exit code, or the name of the error it failed with.
std::string ending(T& t, Operation<int32_t>& attached) {
  if (!attached.wait_for(kWait)) {
    t.fail_here("the attachment did not end within 30 s");
    throw RequireFailed{};
  }
  try {
    return "exit " + std::to_string(attached.get());
  } catch (const NotFoundError&) {
    return "not found";
  } catch (const FailedPreconditionError& e) {
    if (e.reason() == "taken_over") return "taken over";
    return "failed precondition: " + std::string(e.what());
  } catch (const CancelledError&) {
    return "cancelled";
  }
}

void session_state(T& t) {
  t.needs_extension("sbx.session/1");
  Sandbox box = t.create();
  Session session = box.open_session({.env = {{"FROM_OPEN", "o"}}});
  CHECK_EQ(session.run("mkdir -p deep/er && cd deep/er && export COLOR=blue").return_code, 0);
  CHECK_EQ(session.run("pwd | sed 's|.*/deep|deep|'; echo $COLOR $FROM_OPEN").stdout_text,
           "deep/er\nblue o\n");
  CHECK_EQ(session.run("echo err >&2; exit 4").return_code, 4);
  CHECK_EQ(session.run("echo $COLOR").stdout_text, "blue\n");  // the failed run changed nothing
  // A background job started in one run is still running in the next.
  CHECK_EQ(session.run("sleep 300 >/dev/null 2>&1 & echo $! > job.pid").return_code, 0);
  CHECK_EQ(session.run("kill -0 $(cat job.pid) && echo running").stdout_text, "running\n");
  // Another handle of the same session, by id.
  CHECK_EQ(box.session(session.id()).run("echo $COLOR").stdout_text, "blue\n");
  session.close();
  CHECK_THROWS_AS(session.run("true"), NotFoundError);
  CHECK_THROWS_AS(session.close(), NotFoundError);
  CHECK_THROWS_AS(box.session("no-such-session").run("true"), NotFoundError);
}

void pty_tty(T& t) {
  t.needs_extension("sbx.pty/1");
  Sandbox box = t.create();
  Pty pty = box.open_pty({.rows = 30, .cols = 90});
  Screen screen;
  auto attached = pty.attach_async(screen.attach());
  pty.write("stty size\n");
  CHECK(screen.wait_for("30 90"));
  pty.write("echo sum=$((40+2))\n");  // the output, not the echo of the typed line
  CHECK(screen.wait_for("sum=42"));
  CHECK(screen.text().find("echo sum=$((40+2))") != std::string::npos);  // the TTY's echo
  pty.resize(40, 100);
  pty.write("stty size\n");
  CHECK(screen.wait_for("40 100"));
  // Ctrl-C reaches the foreground job (which prints the marker, then becomes the sleep).
  pty.write("sh -c 'echo sleeping-$((2+3)); exec sleep 60'\n");
  REQUIRE(screen.wait_for("sleeping-5"));
  pty.write("\x03");
  pty.write("echo after-$((50+5))\n");
  CHECK(screen.wait_for("after-55"));
  pty.write("exit 7\n");
  CHECK_EQ(ending(t, attached), "exit 7");
  {
    std::lock_guard lock(screen.mutex);
    CHECK(screen.first_offset == std::optional<uint64_t>(0));
    CHECK(!screen.gap);
  }
  CHECK_THROWS_AS(pty.write("late\n"), FailedPreconditionError);
  pty.close();
  CHECK_THROWS_AS(pty.close(), NotFoundError);
}

void pty_full_screen(T& t) {
  t.needs_extension("sbx.pty/1");
  Sandbox box = t.create();
  // What a full-screen program writes: the alternate screen, clearing, cursor moves, colour.
  Pty pty = box.open_pty(
      {.command = "printf '\\033[?1049h\\033[2J\\033[5;10H\\033[1;31mfull\\033[0m\\033[?1049l'; "
                  "printf '\\nrows=%s\\n' \"$(stty size)\""});
  Screen screen;
  auto attached = pty.attach_async(screen.attach());
  CHECK_EQ(ending(t, attached), "exit 0");
  CHECK(screen.text().find("\x1b[?1049h\x1b[2J\x1b[5;10H\x1b[1;31mfull\x1b[0m\x1b[?1049l") !=
        std::string::npos);
  CHECK(screen.text().find("rows=24 80") != std::string::npos);  // the default size
  pty.close();
}

void pty_attach(T& t) {
  t.needs_extension("sbx.pty/1");
  Sandbox box = t.create();
  Pty pty = box.open_pty({.command = "echo first-line; cat"});
  Screen one;
  auto first = pty.attach_async(one.attach());
  REQUIRE(one.wait_for("first-line"));
  // Without takeover a second attach is refused at once; the first goes on.
  Screen refused_screen;
  auto refused = pty.attach_async(refused_screen.attach(0, false));
  CHECK(ending(t, refused).starts_with("failed precondition"));
  CHECK(!first.ready());
  // With takeover (another handle, by id): the first ends saying so; the second replays from 0.
  Screen two;
  auto second = box.pty(pty.id()).attach_async(two.attach());
  CHECK_EQ(ending(t, first), "taken over");
  CHECK(two.wait_for("first-line"));
  pty.write("typed-later\n");
  CHECK(two.wait_for("typed-later"));
  // Live only: nothing old, the next bytes at their real offset.
  const uint64_t seen = [&] {
    std::lock_guard lock(two.mutex);
    return two.next_offset;
  }();
  Screen three;
  auto live = pty.attach_async(three.attach(std::nullopt));
  CHECK_EQ(ending(t, second), "taken over");
  pty.write("fresh\n");
  CHECK(three.wait_for("fresh"));
  {
    std::lock_guard lock(three.mutex);
    CHECK(three.out.find("first-line") == std::string::npos);
    CHECK(three.first_offset.value_or(0) >= seen);
  }
  // A detach (cancel) leaves the process running: a later attach still reaches it.
  live.cancel();
  CHECK_EQ(ending(t, live), "cancelled");
  Screen four;
  auto again = pty.attach_async(four.attach(std::nullopt));
  pty.write("still-there\n");
  CHECK(four.wait_for("still-there"));
  // Close while a reader waits: it ends NOT_FOUND, and so does a later attach.
  pty.close();
  CHECK_EQ(ending(t, again), "not found");
  Screen late_screen;
  auto late = pty.attach_async(late_screen.attach());
  CHECK_EQ(ending(t, late), "not found");
}

void pty_pipe(T& t) {
  t.needs_extension("sbx.pty/1");
  Sandbox box = t.create();
  Pty pty =
      box.open_pty({.command = "echo to-out-$GREETING; echo to-err >&2; read line; echo got-$line; "
                               "exit 3",
                    .env = {{"GREETING", "hi"}},
                    .tty = false});
  Screen screen;
  auto attached = pty.attach_async(screen.attach());
  REQUIRE(screen.wait_for("to-out-hi"));
  CHECK(screen.wait_for("to-err", true));
  pty.write("typed\n");
  CHECK_EQ(ending(t, attached), "exit 3");
  std::lock_guard lock(screen.mutex);
  CHECK_EQ(screen.out, "to-out-hi\ngot-typed\n");  // no terminal: no echo, no \r
  CHECK_EQ(screen.err, "to-err\n");
}

}  // namespace

void add_terminal_cases(std::vector<Case>& cases) {
  const std::string no_session = "sbx.session/1 not in the provider's extensions";
  const std::string no_pty = "sbx.pty/1 not in the provider's extensions";
  cases.push_back({{"ext.session",
                    "sbx.session/1: cd and export carry from one run to the next, a failed run "
                    "changes nothing, a background job outlives its run, exit codes; another "
                    "handle by id; a closed or unknown session is NotFoundError",
                    no_session},
                   session_state});
  cases.push_back({{"ext.pty.tty",
                    "sbx.pty/1: the starting size and a resize seen by stty size, the TTY's echo, "
                    "Ctrl-C to the foreground job, the exit code; offsets from 0 without a gap; "
                    "input after the exit and a second close refused",
                    no_pty},
                   pty_tty});
  cases.push_back({{"ext.pty.full-screen",
                    "sbx.pty/1: a full-screen program's escape sequences arrive byte-exact, on a "
                    "24 x 80 terminal by default",
                    no_pty},
                   pty_full_screen});
  cases.push_back({{"ext.pty.attach",
                    "sbx.pty/1: a second attach is refused without takeover; with it the first "
                    "ends taken over and the second replays from 0; live-only attach; a detach "
                    "leaves the process running; close ends a waiting reader NotFoundError",
                    no_pty},
                   pty_attach});
  cases.push_back({{"ext.pty.pipe",
                    "sbx.pty/1 in pipe mode: stdout and stderr apart, no echo, input read, the "
                    "exit code",
                    no_pty},
                   pty_pipe});
}

}  // namespace sbx::conformance
