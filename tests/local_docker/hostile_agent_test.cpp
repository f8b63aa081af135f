// A sandbox's root against the host's route to its agent (issue 34, decision 251), against the
// real daemon, with the agent (this program has no Docker exec twin: without the agent there is
// no socket). Root inside acts through the Engine API's own exec (ldtest::Docker::exec), beside
// the plugin, as it would from a shell of its own.
//
// - Whatever root puts at /.sbx/run/agent.sock (a symbolic link to another sandbox's socket or
//   to the Docker daemon's, a directory, nothing) makes its own sandbox unreachable with a clear
//   error; no command reaches another sandbox, nothing reaches the daemon.
// - A hard link, or a socket root binds there itself, reaches that sandbox and nothing else.
// - A fake agent (tests/local_docker/fake_agent.cpp) answering with crafted, huge, endless or
//   stalled answers fails its own sandbox's calls with an error, within the bounds the plugin
//   documents (a frame's length, an answer's head, an error body, a download's declared
//   length, an idle stream's 20 s), and another sandbox works meanwhile.
//
// Each check uses a host of its own that connects to the sandbox by id: its connections are new,
// made after the tampering (a kept-alive connection made before still reaches the real agent).

#include "support.hpp"

#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

using ldtest::contains;
using ldtest::docker;
using ldtest::provider;
using namespace std::chrono_literals;

namespace {

// The host path of a sandbox's agent socket (agent_dir's default).
std::string host_socket(const std::string& id) {
  return "/run/sbx/local_docker/sandboxes/" + id + "/run/agent.sock";
}

// Runs `script` as root in `id` through the Engine API; requires it to succeed.
void as_root(const std::string& id, const std::string& script) {
  const auto result = docker().exec(id, {"sh", "-c", script});
  REQUIRE_MESSAGE(result.exit_code == 0, script << ": " << result.output);
}

// A fresh host, with the shell fixed (a connect then asks the agent nothing), connected to `id`.
struct Fresh {
  sbx::Host host{ldtest::options_with(R"({"exec": {"shell": "sh"}})")};
  sbx::Sandbox box;
  explicit Fresh(const std::string& id)
      : box(ldtest::provider_with(host).connect(R"({"sandbox_id": ")" + id + R"("})")) {}
  ~Fresh() { box.detach(); }
};

// The resident set's high-water mark of this process, in KiB.
long peak_rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("VmHWM:")) return std::stol(line.substr(6));
  }
  return -1;
}

}  // namespace

TEST_CASE("root in a sandbox cannot point its agent's socket at another sandbox or the host") {
  sbx::Sandbox victim = provider().create(ldtest::spec());
  const std::string marker = "/tmp/reached-" + ldtest::unique();

  struct Tampering {
    const char* what;
    std::string script;  // run in the attacker; {V} is the victim's socket on the host
  };
  const std::vector<Tampering> tamperings = {
      {"a symbolic link to another sandbox's socket",
       "rm /.sbx/run/agent.sock && ln -s {V} /.sbx/run/agent.sock"},
      {"a symbolic link to the Docker daemon's socket",
       "rm /.sbx/run/agent.sock && ln -s /var/run/docker.sock /.sbx/run/agent.sock"},
      {"a relative symbolic link climbing out",
       "rm /.sbx/run/agent.sock && ln -s ../../{ID}/run/agent.sock /.sbx/run/agent.sock"},
      {"a directory in the socket's place",
       "rm /.sbx/run/agent.sock && mkdir /.sbx/run/agent.sock"},
      {"the socket renamed away", "mv /.sbx/run/agent.sock /.sbx/run/elsewhere.sock"},
  };
  for (const auto& tampering : tamperings) {
    CAPTURE(tampering.what);
    sbx::Sandbox attacker = provider().create(ldtest::spec());
    std::string script = tampering.script;
    if (const size_t at = script.find("{V}"); at != std::string::npos) {
      script.replace(at, 3, host_socket(victim.id()));
    }
    if (const size_t at = script.find("{ID}"); at != std::string::npos) {
      script.replace(at, 4, victim.id());
    }
    as_root(attacker.id(), script);

    Fresh fresh(attacker.id());
    bool refused = false;
    try {
      fresh.box.exec("touch " + marker);
    } catch (const sbx::UnavailableError& e) {
      refused = true;
      CHECK(contains(e.what(), "sandbox " + attacker.id() + " is unreachable"));
      CHECK(contains(e.what(), "changed from inside the sandbox"));
    }
    CHECK(refused);
    // Files and terminals take the same route.
    CHECK_THROWS_AS(fresh.box.upload_bytes("x", "/tmp/x"), sbx::UnavailableError);
    CHECK_THROWS_AS(fresh.box.download_bytes("/etc/hostname"), sbx::UnavailableError);
    // Nothing ran in the victim, which works as before.
    CHECK(docker().exec(victim.id(), {"test", "-e", marker}).exit_code == 1);
    CHECK(victim.exec("echo fine").stdout_text == "fine\n");
    // The daemon saw no request from the plugin through the link: the attacker still exists.
    CHECK(docker().exists(attacker.id()));
    attacker.close();
  }
}

TEST_CASE("a hard link or a socket root binds itself reaches that sandbox and nothing else") {
  sbx::Sandbox victim = provider().create(ldtest::spec());
  sbx::Sandbox attacker = provider().create(ldtest::spec());
  as_root(attacker.id(), "echo attacker > /tmp/who; hostname > /tmp/hostname");
  // A hard link to another sandbox's socket cannot be made: it is not in this sandbox's mounts.
  CHECK(docker().exec(attacker.id(), {"ln", host_socket(victim.id()), "/.sbx/run/x"}).exit_code !=
        0);
  // A hard link to its own socket, put in the socket's place, is its own agent.
  as_root(attacker.id(),
          "ln /.sbx/run/agent.sock /.sbx/run/hard && mv -f /.sbx/run/hard /.sbx/run/agent.sock");
  {
    Fresh fresh(attacker.id());
    CHECK(fresh.box.exec("cat /tmp/who").stdout_text == "attacker\n");
  }
  // Root binds a program of its own there: the host reaches it, in this sandbox only.
  attacker.upload(ldtest::test_binary("sbx-fake-agent"), "/tmp/fake");
  docker().exec(attacker.id(), {"/tmp/fake", "/.sbx/run/agent.sock", "/tmp/fake.mode"}, true);
  {
    Fresh fresh(attacker.id());
    // The fake answers every request itself; wait until it listens (its answer is "fake").
    std::string said;
    for (int i = 0; i < 200 && said != "fake\n"; ++i) {
      try {
        said = fresh.box.exec("hostname").stdout_text;
      } catch (const sbx::Error&) {
        std::this_thread::sleep_for(50ms);
      }
    }
    CHECK(said == "fake\n");
  }
  CHECK(victim.exec("cat /etc/hostname").stdout_text != "fake\n");
  CHECK(victim.exec("echo fine").stdout_text == "fine\n");
  attacker.close();
  victim.close();
}

TEST_CASE("a fake agent's crafted, huge, endless and stalled answers stay within the bounds") {
  sbx::Sandbox other = provider().create(ldtest::spec());
  sbx::Sandbox attacker = provider().create(ldtest::spec());
  attacker.upload(ldtest::test_binary("sbx-fake-agent"), "/tmp/fake");
  auto mode = [&](const std::string& name) {
    as_root(attacker.id(), "echo " + name + " > /tmp/fake.mode");
  };
  mode("echo");
  docker().exec(attacker.id(), {"/tmp/fake", "/.sbx/run/agent.sock", "/tmp/fake.mode"}, true);
  Fresh fresh(attacker.id());
  for (int i = 0; i < 200; ++i) {  // until it listens
    try {
      if (fresh.box.exec("true").stdout_text == "fake\n") break;
    } catch (const sbx::Error&) {
    }
    std::this_thread::sleep_for(50ms);
  }
  const long rss_before = peak_rss_kib();
  sbx::ExecOptions quick;
  quick.timeout_s = 2;

  SUBCASE("a frame declaring 4 GiB is refused at its header") {
    mode("huge-frame");
    const std::string what = ldtest::what_of([&] { fresh.box.exec("true", quick); });
    CHECK(contains(what, "frame of 4294967295 bytes"));
    CHECK(contains(what, "answered badly"));
  }
  SUBCASE("a head that never ends is refused past 256 KiB") {
    mode("endless-head");
    CHECK_THROWS_AS(fresh.box.exec("true", quick), sbx::ResourceExhaustedError);
  }
  SUBCASE("an end of command that is no exit status") {
    mode("bad-end");
    const std::string what = ldtest::what_of([&] { fresh.box.exec("true", quick); });
    CHECK(contains(what, "bad end of command"));
  }
  SUBCASE("an error answer that never ends is cut at 64 KiB") {
    mode("big-error");
    const std::string what = ldtest::what_of([&] { fresh.box.exec("true", quick); });
    CHECK(contains(what, "HTTP 500"));
    CHECK(what.size() < 4096);
  }
  SUBCASE("a download without a length, or longer than it said") {
    mode("endless-body");
    const std::string what = ldtest::what_of([&] { fresh.box.download_bytes("/etc/hostname"); });
    CHECK(contains(what, "without a Content-Length"));
    mode("overlong-body");
    CHECK(fresh.box.download_bytes("/etc/hostname") == std::string(10, 'C'));
  }
  SUBCASE("a terminal the agent ends with a reason: the attachment says it (issue 35)") {
    mode("pty-error");
    sbx::PtyAttachOptions options;
    options.on_output = [](sbx::OutputStream, uint64_t, std::string_view) {};
    auto attached = fresh.box.pty("t1").attach_async(std::move(options));
    const std::string what = ldtest::what_of([&] { attached.get(); });
    CAPTURE(what);
    CHECK(contains(what, "exec: bash: not found"));
    CHECK_THROWS_AS(attached.get(), sbx::NotFoundError);
  }
  SUBCASE("a stalled answer ends after the idle timeout, while another sandbox works") {
    mode("stall");
    auto stalled = std::async(std::launch::async, [&] {
      return ldtest::what_of([&] { fresh.box.exec("true", quick); });
    });
    for (int i = 0; i < 5; ++i)
      CHECK(other.exec("echo meanwhile").stdout_text == "meanwhile\n");
    CHECK(stalled.wait_for(0s) == std::future_status::timeout);  // it is still waiting
    const std::string what = stalled.get();                      // after 20 s without a byte
    CHECK_FALSE(what.empty());
  }
  // Nothing of the above was kept: the host's peak grew by less than a frame's bound and change.
  CHECK(peak_rss_kib() - rss_before < 64 * 1024);
  CHECK(other.exec("echo fine").stdout_text == "fine\n");
  attacker.close();
  other.close();
}
