// A local_docker sandbox that no longer runs, and one whose image has no shell (issue 34,
// decisions 253 and 254), against the real daemon in both modes.
//
// - Its main process ended under it (`kill -9 -1` inside kills the entrypoint): every call but
//   status and close is NOT_FOUND with the reason sandbox_gone, status says stopped.
// - With the agent and no entrypoint, no command ends the sandbox.
// - An image without a shell: with the agent the sandbox is ready (its agent answers), a command
//   line fails at once saying why, argv commands run; with Docker exec the create fails at once,
//   naming the shell.
// - argv commands run without a shell on any image, words kept as they are.

#include "support.hpp"

#include <string>
#include <vector>

using ldtest::contains;
using ldtest::docker;
using ldtest::provider;
using namespace std::chrono_literals;

namespace {

// Runs `fn`, which must throw NotFoundError with the reason sandbox_gone; its message.
template <class Fn>
std::string gone(Fn&& fn) {
  try {
    fn();
  } catch (const sbx::NotFoundError& e) {
    CHECK(e.reason() == SBX_REASON_SANDBOX_GONE);
    return e.what();
  } catch (const std::exception& e) {
    FAIL("not NOT_FOUND: " << std::string(e.what()));
  }
  FAIL("no error");
  return {};
}

}  // namespace

TEST_CASE("a sandbox whose entrypoint was killed from inside answers every call as gone") {
  auto spec = ldtest::spec();
  spec.entrypoint = std::vector<std::string>{"sleep", "3600"};
  spec.ttl_s.reset();  // no AutoRemove: the container stays, stopped
  sbx::Sandbox box = provider().create(spec);
  box.upload_bytes("kept", "/tmp/kept.txt");
  docker().exec(box.id(), {"sh", "-c", "kill -9 -1"});
  // The daemon records the container's end a moment after its processes died.
  for (int i = 0; i < 200 && box.status() != sbx::SandboxStatus::stopped; ++i)
    std::this_thread::sleep_for(50ms);
  REQUIRE(box.status() == sbx::SandboxStatus::stopped);
  CHECK(contains(gone([&] { box.exec("true"); }), box.id()));
  gone([&] { box.download_bytes("/tmp/kept.txt"); });
  gone([&] { box.upload_bytes("x", "/tmp/x.txt"); });
  box.close();
}

TEST_CASE("with the agent and no entrypoint, kill -9 -1 inside does not end the sandbox") {
  if (!ldtest::agent_mode()) {
    // Docker exec mode: the keep-alive is an ordinary process under Docker's init, which a
    // command can kill; the sandbox then ends, and answers as gone.
    sbx::Sandbox box = provider().create(ldtest::spec());
    docker().exec(box.id(), {"sh", "-c", "kill -9 -1"});
    for (int i = 0; i < 200 && box.status() == sbx::SandboxStatus::running; ++i)
      std::this_thread::sleep_for(50ms);
    gone([&] { box.exec("true"); });
    box.close();
    return;
  }
  sbx::Sandbox box = provider().create(ldtest::spec());
  docker().exec(box.id(), {"sh", "-c", "kill -9 -1"});
  CHECK(box.exec("echo alive").stdout_text == "alive\n");
  CHECK(box.status() == sbx::SandboxStatus::running);
  box.close();
}

TEST_CASE("argv commands run without a shell, their words kept") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  const auto result = box.exec_argv({"printf", "[%s]", "a b", "$HOME", "'q'"});
  CHECK(result.return_code == 0);
  CHECK(result.stdout_text == "[a b][$HOME]['q']");
  const auto missing = box.exec_argv({"/no/such/program"});
  CHECK(missing.return_code == 125);
  CHECK(missing.error_type == "sandbox");
  CHECK_THROWS_AS(box.exec_argv({}), sbx::InvalidArgumentError);
  box.close();
}

TEST_CASE("an image without a shell") {
  auto spec = ldtest::spec("sbx-empty:latest");
  if (!ldtest::agent_mode()) {
    // The keep-alive is a shell: the create fails at once, saying so.
    const std::string what = ldtest::what_of([&] { provider().create(spec); });
    CAPTURE(what);
    CHECK(contains(what, "/bin/sh"));
    return;
  }
  sbx::Sandbox box = provider().create(spec);  // ready: its agent answers
  const auto line = box.exec("echo hi");
  CHECK(line.return_code == 125);
  CHECK(line.error_type == "sandbox");
  CHECK(contains(line.stderr_text, "has no shell"));
  // A program of its own runs as argv.
  box.upload("/bin/busybox", "/bin/busybox");  // busybox runs the applet its argv[1] names
  const auto argv = box.exec_argv({"/bin/busybox", "echo", "hello"});
  CHECK(argv.return_code == 0);
  CHECK(argv.stdout_text == "hello\n");
  CHECK(box.download_bytes("/etc/passwd").size() > 0);
  box.close();
}

TEST_CASE("a file that reports no size downloads what it gives, or is refused clearly") {
  sbx::Sandbox box = provider().create(ldtest::spec());
  if (ldtest::agent_mode()) {
    // /proc's files say size 0 and hold bytes: the agent reads what the file gives.
    const std::string cmdline = box.download_bytes("/proc/1/cmdline");
    CHECK(contains(cmdline, "sbx-agent"));
    CHECK(contains(box.download_bytes("/proc/self/status"), "Name:"));
  } else {
    // The archive API reads the container's root file system, where /proc is an empty directory:
    // no such file, said as such (never an empty file presented as the file).
    CHECK_THROWS_AS(box.download_bytes("/proc/1/cmdline"), sbx::NotFoundError);
  }
  box.close();
}
