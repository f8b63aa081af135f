// Cases of the interactive extensions (docs/terminals.md): sbx.session/1 (a shell whose state
// carries from one command to the next) and sbx.pty/1 (terminals). Each runs when the provider
// lists the extension and is "not offered" otherwise. Every wait is on output or an operation's
// end, bounded.

#include "suite.hpp"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace sbx::conformance {
namespace {

using namespace std::chrono_literals;

constexpr auto kWait = 30s;

// What an attachment has read, and waits on it. The state is shared with the host's threads: an
// attachment may still deliver, or end, after the case gave up on it.
class Screen {
 public:
  struct Seen {
    std::string out, err;
    std::optional<uint64_t> first_offset;
    uint64_t next_offset = 0;
    bool gap = false;    // an offset that did not follow the last byte
    bool ended = false;  // the attachment completed
  };

  // Attaches to `pty` with this screen as the output's reader.
  Operation<int32_t> attach(Pty& pty, std::optional<uint64_t> since = 0, bool takeover = true) {
    auto op =
        pty.attach_async({.since = since,
                          .takeover = takeover,
                          .on_output = [shared = shared_](OutputStream stream, uint64_t offset,
                                                          std::string_view bytes) {
                            std::lock_guard lock(shared->mutex);
                            Seen& seen = shared->seen;
                            if (!seen.first_offset) {
                              seen.first_offset = offset;
                            } else if (offset != seen.next_offset) {
                              seen.gap = true;
                            }
                            seen.next_offset = offset + bytes.size();
                            (stream == OutputStream::err ? seen.err : seen.out).append(bytes);
                            shared->changed.notify_all();
                          }});
    op.then([shared = shared_](const Operation<int32_t>&) {
      std::lock_guard lock(shared->mutex);
      shared->seen.ended = true;
      shared->changed.notify_all();
    });
    return op;
  }
  // Waits until the output holds `needle` or the attachment ended, at most kWait; whether it came.
  bool wait_for(const std::string& needle, bool on_stderr = false) {
    std::unique_lock lock(shared_->mutex);
    const auto has = [&] {
      return (on_stderr ? shared_->seen.err : shared_->seen.out).find(needle) != std::string::npos;
    };
    shared_->changed.wait_for(lock, kWait, [&] { return has() || shared_->seen.ended; });
    return has();
  }
  Seen seen() const {
    std::lock_guard lock(shared_->mutex);
    return shared_->seen;
  }
  std::string text() const { return seen().out; }

 private:
  struct Shared {
    std::mutex mutex;
    std::condition_variable changed;
    Seen seen;
  };
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

// How an attachment ended: its exit code, or the name of the error it failed with.
std::string ending(T& t, Operation<int32_t>& attached) {
  if (!attached.wait_for(kWait)) {
    t.fail(
        "an attachment must end when its process exits, it is taken over, detached or the "
        "terminal closed: it had not ended 30 s later");
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
  CHECK_EQ(session.run("mkdir -p deep/er && cd deep/er && export COLOR=blue").return_code, 0,
           "a session's run of mkdir, cd and export must exit 0");
  CHECK_EQ(session.run("pwd | sed 's|.*/deep|deep|'; echo $COLOR $FROM_OPEN").stdout_text,
           "deep/er\nblue o\n",
           "a session must keep the directory and exports of one run for the next, with the "
           "env it was opened with: run every command in one shell");
  CHECK_EQ(session.run("echo err >&2; exit 4").return_code, 4,
           "a session run's exit code must be its own (exit 4 gives 4)");
  CHECK_EQ(session.run("echo $COLOR").stdout_text, "blue\n",
           "a run that exits must not end the session or lose its state: run `exit` in a "
           "subshell, keep the shell");
  // A background job started in one run is still running in the next.
  CHECK_EQ(session.run("sleep 300 >/dev/null 2>&1 & echo $! > job.pid").return_code, 0,
           "a session run that starts a background job must exit 0");
  CHECK_EQ(session.run("kill -0 $(cat job.pid) && echo running").stdout_text, "running\n",
           "a background job started in a session run must still run in the next run");
  // Another handle of the same session, by id.
  CHECK_EQ(box.session(session.id()).run("echo $COLOR").stdout_text, "blue\n",
           "another handle must reach the same session by its id");
  session.close();
  CHECK_THROWS_AS(session.run("true"), NotFoundError,
                  "a run in a closed session must fail with NOT_FOUND");
  CHECK_THROWS_AS(session.close(), NotFoundError,
                  "closing a session a second time must fail with NOT_FOUND");
  CHECK_THROWS_AS(box.session("no-such-session").run("true"), NotFoundError,
                  "a run in a session id that was never opened must fail with NOT_FOUND");
}

void pty_tty(T& t) {
  t.needs_extension("sbx.pty/1");
  Sandbox box = t.create();
  Pty pty = box.open_pty({.rows = 30, .cols = 90});
  Screen screen;
  auto attached = screen.attach(pty);
  pty.write("stty size\n");
  CHECK(screen.wait_for("30 90"),
        "a terminal opened with 30 rows and 90 columns must have that size (stty size printed "
        "no \"30 90\" within 30 s)");
  pty.write("echo sum=$((40+2))\n");  // the output, not the echo of the typed line
  CHECK(screen.wait_for("sum=42"),
        "typed input must reach the terminal's shell and its output "
        "must reach the attachment (no sum=42 within 30 s)");
  CHECK(screen.text().find("echo sum=$((40+2))") != std::string::npos,
        "a TTY must echo what is typed: run the command on a real pseudo-terminal");
  pty.resize(40, 100);
  pty.write("stty size\n");
  CHECK(screen.wait_for("40 100"),
        "a resize to 40 x 100 must change the terminal's size (stty size printed no \"40 "
        "100\")");
  // Ctrl-C reaches the foreground job (which prints the marker, then becomes the sleep).
  pty.write("sh -c 'echo sleeping-$((2+3)); exec sleep 60'\n");
  REQUIRE(screen.wait_for("sleeping-5"), "a command typed into the terminal must run");
  pty.write("\x03");
  pty.write("echo after-$((50+5))\n");
  CHECK(screen.wait_for("after-55"),
        "Ctrl-C (\\x03) typed into a TTY must interrupt the foreground job: give the terminal "
        "a controlling TTY and a session of its own");
  pty.write("exit 7\n");
  CHECK_EQ(ending(t, attached), "exit 7",
           "when the terminal's shell exits 7, the attachment must end with exit code 7");
  {
    const auto seen = screen.seen();
    CHECK(seen.first_offset == std::optional<uint64_t>(0),
          "an attachment from offset 0 must get the first output byte at offset 0");
    CHECK(!seen.gap, "output offsets must follow each other without a gap or an overlap");
  }
  CHECK_THROWS_AS(pty.write("late\n"), FailedPreconditionError,
                  "input to a terminal whose process exited must fail with FAILED_PRECONDITION");
  pty.close();
  CHECK_THROWS_AS(pty.close(), NotFoundError,
                  "closing a terminal a second time must fail with NOT_FOUND");
}

void pty_full_screen(T& t) {
  t.needs_extension("sbx.pty/1");
  Sandbox box = t.create();
  // What a full-screen program writes: the alternate screen, clearing, cursor moves, colour.
  Pty pty = box.open_pty(
      {.command = "printf '\\033[?1049h\\033[2J\\033[5;10H\\033[1;31mfull\\033[0m\\033[?1049l'; "
                  "printf '\\nrows=%s\\n' \"$(stty size)\""});
  Screen screen;
  auto attached = screen.attach(pty);
  CHECK_EQ(ending(t, attached), "exit 0",
           "a terminal whose command exits 0 must end its attachment with exit code 0");
  CHECK(screen.text().find("\x1b[?1049h\x1b[2J\x1b[5;10H\x1b[1;31mfull\x1b[0m\x1b[?1049l") !=
            std::string::npos,
        "a full-screen program's escape sequences must arrive byte for byte: do not filter or "
        "translate terminal output");
  CHECK(screen.text().find("rows=24 80") != std::string::npos,
        "a terminal opened without a size must be 24 rows by 80 columns");
  pty.close();
}

void pty_attach(T& t) {
  t.needs_extension("sbx.pty/1");
  Sandbox box = t.create();
  Pty pty = box.open_pty({.command = "echo first-line; cat"});
  Screen one;
  auto first = one.attach(pty);
  REQUIRE(one.wait_for("first-line"), "an attachment must get the terminal's output");
  // Without takeover a second attach is refused at once; the first goes on.
  Screen refused_screen;
  auto refused = refused_screen.attach(pty, 0, false);
  CHECK(ending(t, refused).starts_with("failed precondition"),
        "a second attach without takeover must be refused at once with FAILED_PRECONDITION");
  CHECK(!first.ready(), "a refused second attach must leave the first attachment running");
  // With takeover (another handle, by id): the first ends saying so; the second replays from 0.
  Screen two;
  Pty by_id = box.pty(pty.id());
  auto second = two.attach(by_id);
  CHECK_EQ(ending(t, first), "taken over",
           "an attach with takeover must end the first attachment with FAILED_PRECONDITION, "
           "reason \"taken_over\"");
  CHECK(two.wait_for("first-line"),
        "an attach from offset 0 must replay the output written before it");
  pty.write("typed-later\n");
  CHECK(two.wait_for("typed-later"), "the attachment that took over must get new output");
  // Live only: nothing old, the next bytes at their real offset.
  const uint64_t read_before = two.seen().next_offset;
  Screen three;
  auto live = three.attach(pty, std::nullopt);
  CHECK_EQ(ending(t, second), "taken over",
           "an attach with takeover must end the attachment before it as taken over");
  pty.write("fresh\n");
  CHECK(three.wait_for("fresh"), "a live-only attachment must get new output");
  {
    const auto seen = three.seen();
    CHECK(seen.out.find("first-line") == std::string::npos,
          "a live-only attach (no since) must not replay old output");
    CHECK(seen.first_offset.value_or(0) >= read_before,
          "a live-only attachment's output must come at its real offset, after what was read "
          "before");
  }
  // A detach (cancel) leaves the process running: a later attach still reaches it.
  live.cancel();
  CHECK_EQ(ending(t, live), "cancelled",
           "a cancelled attachment (a detach) must end with CANCELLED");
  Screen four;
  auto again = four.attach(pty, std::nullopt);
  pty.write("still-there\n");
  CHECK(four.wait_for("still-there"),
        "a detach must leave the terminal's process running for a later attach");
  // Close while a reader waits: it ends NOT_FOUND, and so does a later attach.
  pty.close();
  CHECK_EQ(ending(t, again), "not found",
           "closing a terminal must end a waiting attachment with NOT_FOUND");
  Screen late_screen;
  auto late = late_screen.attach(pty);
  CHECK_EQ(ending(t, late), "not found", "an attach to a closed terminal must fail NOT_FOUND");
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
  auto attached = screen.attach(pty);
  REQUIRE(screen.wait_for("to-out-hi"),
          "a pipe-mode terminal's command must run with its env and its stdout reach the "
          "attachment (no to-out-hi within 30 s)");
  CHECK(screen.wait_for("to-err", true),
        "in pipe mode (tty false), stderr must reach the attachment as its own stream");
  pty.write("typed\n");
  CHECK_EQ(ending(t, attached), "exit 3",
           "a pipe-mode command that exits 3 must end its attachment with exit code 3");
  const auto seen = screen.seen();
  CHECK_EQ(seen.out, "to-out-hi\ngot-typed\n",
           "in pipe mode, stdout must be the command's bytes alone: no echo of input, no \\r");
  CHECK_EQ(seen.err, "to-err\n", "in pipe mode, stderr must be apart from stdout");
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
