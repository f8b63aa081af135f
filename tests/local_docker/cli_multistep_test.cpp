// The multi-step commands against local_docker: `sbx create`, then exec, cp, status, pause, resume
// and close, each in an sbx process of its own that connects to the sandbox by its id (or by its
// descriptor), with the exit codes of `sbx run`.

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

// What an sbx process did.
struct Result {
  std::optional<int> code;  // nothing: it did not end within its limit (and was killed)
  std::string out;
  std::string err;
};

// Runs `sbx ARGS...` to its end (at most `limit`).
Result run_sbx(const std::vector<std::string>& args, std::chrono::seconds limit = 120s) {
  sbx::testing::TempDir dir("sbx-ld-cli");
  std::vector<std::string> argv{ldtest::sbx_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string out = (dir.path / "stdout").string();
  const std::string err = (dir.path / "stderr").string();
  std::optional<int> code;
  {
    ldtest::Child child({.argv = argv, .stdout_path = out, .stderr_path = err});
    code = child.wait_for(limit);
  }
  return {code, sbx::testing::read_file(out), sbx::testing::read_file(err)};
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The options every `sbx create` of these tests has: busybox, a TTL (a failed test must not leak
// for long) and the suite label (leftovers_test finds what a test left).
std::vector<std::string> create_args(std::vector<std::string> more = {}) {
  std::vector<std::string> args{"create",
                                "--image",
                                ldtest::kBusybox,
                                "--ttl",
                                "300",
                                "--metadata",
                                std::string(ldtest::kSuiteLabel) + "=" + ldtest::kSuiteValue};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// A sandbox made by `sbx create`, removed at scope exit whatever the test did with it.
struct Created {
  std::string id;
  std::string descriptor;  // with json: what create printed

  explicit Created(bool json = false, std::vector<std::string> more = {}) {
    if (json) more.emplace_back("--json");
    const Result r = run_sbx(create_args(more));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    REQUIRE(r.out.ends_with("\n"));
    const std::string text = r.out.substr(0, r.out.size() - 1);
    if (json) {
      descriptor = text;
      id = std::string(boost::json::parse(text).at("sandbox_id").as_string());
    } else {
      id = text;
    }
  }
  ~Created() { ldtest::docker().remove(id); }
  Created(const Created&) = delete;
  Created& operator=(const Created&) = delete;

  bool running() const {
    const auto inspect = ldtest::docker().inspect(id);
    return inspect && inspect->at("State").at("Running").as_bool() &&
           !inspect->at("State").at("Paused").as_bool();
  }
};

}  // namespace

TEST_CASE("create prints an id that later processes use: exec, status, close") {
  Created box;
  CHECK(box.id.starts_with("sbx-"));
  const auto inspect = ldtest::docker().inspect(box.id);
  REQUIRE(inspect);
  CHECK(inspect->at("Config").at("Labels").at(ldtest::kSuiteLabel) == ldtest::kSuiteValue);
  CHECK(box.running());  // create left it running

  const Result r = run_sbx({"exec", box.id, "--", "sh", "-c", "echo out; echo err >&2; exit 3"});
  CHECK(r.code == 3);
  CHECK(r.out == "out\n");
  CHECK(r.err == "err\n");
  CHECK(box.running());  // exec left it running

  const Result opts = run_sbx({"exec", "--env", "A=1", "--workdir", "/tmp", "--user", "nobody",
                               box.id, "--", "echo $A $(pwd) $(id -un)"});
  CHECK_MESSAGE(opts.code == 0, opts.err);
  CHECK(opts.out == "1 /tmp nobody\n");

  const Result status = run_sbx({"status", box.id});
  CHECK(status.code == 0);
  CHECK(status.out == "running\n");
  const Result json = run_sbx({"status", "--json", box.id});
  CHECK(json.code == 0);
  CHECK(boost::json::parse(json.out) ==
        boost::json::parse(R"({"id": ")" + box.id + R"(", "status": "running"})"));

  const Result closed = run_sbx({"close", box.id});
  CHECK_MESSAGE(closed.code == 0, closed.err);
  CHECK(ldtest::docker().wait_gone(box.id, 30s));

  // Gone: every command says so and exits 125.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"status", box.id}, {"exec", box.id, "--", "true"}, {"close", box.id}}) {
    const Result gone = run_sbx(args);
    CHECK(gone.code == 125);
    CHECK_MESSAGE(has(gone.err, "sandbox " + box.id + " not found by provider 'local_docker'"),
                  gone.err);
  }
}

TEST_CASE("create --json prints a descriptor; commands take it as text and as @FILE") {
  Created box(true);
  const auto descriptor = boost::json::parse(box.descriptor).as_object();
  CHECK(descriptor.at("format") == "sbx.descriptor/1");
  CHECK(descriptor.at("provider") == "local_docker");

  const Result text = run_sbx({"exec", box.descriptor, "--", "echo", "from text"});
  CHECK_MESSAGE(text.code == 0, text.err);
  CHECK(text.out == "from text\n");

  sbx::testing::TempDir dir("sbx-ld-cli-descriptor");
  sbx::testing::write_file(dir.path / "box.json", box.descriptor + "\n");
  const Result file = run_sbx({"status", "@" + (dir.path / "box.json").string()});
  CHECK(file.code == 0);
  CHECK(file.out == "running\n");
}

TEST_CASE("cp copies a file in and out; a directory target gets the file's name") {
  Created box;
  sbx::testing::TempDir dir("sbx-ld-cli-cp");
  sbx::testing::write_file(dir.path / "in.txt", "hello cp\n");

  const Result up = run_sbx({"cp", (dir.path / "in.txt").string(), box.id + ":/tmp/up/"});
  CHECK_MESSAGE(up.code == 0, up.err);
  const Result cat = run_sbx({"exec", box.id, "--", "cat", "/tmp/up/in.txt"});
  CHECK(cat.out == "hello cp\n");

  run_sbx({"exec", box.id, "--", "echo out > /tmp/out.txt"});
  const Result down = run_sbx({"cp", box.id + ":/tmp/out.txt", (dir.path / "copy.txt").string()});
  CHECK_MESSAGE(down.code == 0, down.err);
  CHECK(sbx::testing::read_file(dir.path / "copy.txt") == "out\n");
  const Result into_dir = run_sbx({"cp", box.id + ":/tmp/out.txt", dir.path.string()});
  CHECK(into_dir.code == 0);
  CHECK(sbx::testing::read_file(dir.path / "out.txt") == "out\n");

  const Result missing = run_sbx({"cp", box.id + ":/nonexistent", (dir.path / "none").string()});
  CHECK(missing.code == 125);
  CHECK_FALSE(std::filesystem::exists(dir.path / "none"));  // complete or absent
  CHECK(box.running());
}

TEST_CASE("cp into a FIFO waits for its reader, and a stop ends the wait") {
  Created box;
  sbx::testing::TempDir dir("sbx-ld-cli-fifo");
  const std::string fifo = (dir.path / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // No reader: cp waits (as cp does) until SIGTERM, which ends it like every other wait: 130.
  {
    ldtest::Child cp({.argv = {ldtest::sbx_binary(), "cp", box.id + ":/etc/passwd", fifo},
                      .stderr_path = (dir.path / "stderr").string()});
    std::this_thread::sleep_for(2s);  // it has connected and waits for a reader (no event says so)
    CHECK(cp.running());
    cp.kill(SIGTERM);
    CHECK(cp.wait_for(15s) == 130);
  }
  // With a reader, the file arrives whole through the FIFO.
  ldtest::Child cp({.argv = {ldtest::sbx_binary(), "cp", box.id + ":/etc/passwd", fifo},
                    .stderr_path = (dir.path / "stderr2").string()});
  const int reader = ::open(fifo.c_str(), O_RDONLY);
  REQUIRE(reader >= 0);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(reader, buf, sizeof buf)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  ::close(reader);
  CHECK(cp.wait_for(30s) == 0);
  CHECK(has(got, "root:"));
}

TEST_CASE("pause and resume: status paused, exec refused at once while paused") {
  Created box;
  const Result pause = run_sbx({"pause", box.id});
  CHECK_MESSAGE(pause.code == 0, pause.err);
  CHECK(run_sbx({"status", box.id}).out == "paused\n");

  const auto start = std::chrono::steady_clock::now();
  const Result refused = run_sbx({"exec", box.id, "--", "true"});
  CHECK(refused.code == 125);
  CHECK_MESSAGE(has(refused.err, "paused"), refused.err);
  CHECK(ldtest::seconds_since(start) < 10);  // never waits for a resume

  const Result resume = run_sbx({"resume", box.id});
  CHECK_MESSAGE(resume.code == 0, resume.err);
  CHECK(run_sbx({"status", box.id}).out == "running\n");
  CHECK(run_sbx({"exec", box.id, "--", "true"}).code == 0);
}

TEST_CASE("exec has sbx run's exit codes; a stop ends the command, not the sandbox") {
  Created box;
  const Result timeout = run_sbx({"exec", "--timeout", "1", box.id, "--", "echo early; sleep 30"});
  CHECK(timeout.code == 125);
  CHECK(timeout.out == "early\n");
  CHECK(has(timeout.err, "timed out"));

  // Ctrl-C: 130, the command is killed, the sandbox keeps running.
  sbx::testing::TempDir dir("sbx-ld-cli-stop");
  {
    ldtest::Child exec({.argv = {ldtest::sbx_binary(), "exec", box.id, "--", "sleep 61"},
                        .stderr_path = (dir.path / "stderr").string()});
    std::this_thread::sleep_for(2s);
    exec.kill(SIGINT);
    CHECK(exec.wait_for(15s) == 130);
  }
  CHECK(box.running());
  // The command is gone (the keep-alive process is a sleep too, so match this one's arguments).
  CHECK(run_sbx({"exec", box.id, "--", "ps -o args | grep -c '^sleep 61' || true"}).out == "0\n");

  // The reader goes away: 141, the sandbox keeps running.
  {
    ldtest::Child exec({.argv = {ldtest::sbx_binary(), "exec", box.id, "--", "yes"},
                        .stderr_path = (dir.path / "stderr2").string(),
                        .pipe_stdout = true});
    char c = 0;
    CHECK(::read(exec.stdout_fd(), &c, 1) == 1);
    exec.close_stdout();
    CHECK(exec.wait_for(15s) == 141);
  }
  CHECK(box.running());
}

TEST_CASE("an unknown sandbox is a clear error, 125; a malformed descriptor is a usage error") {
  const Result unknown = run_sbx({"status", "sbx-000000000000000000000000"});
  CHECK(unknown.code == 125);
  CHECK_MESSAGE(has(unknown.err,
                    "sandbox sbx-000000000000000000000000 not found by provider "
                    "'local_docker' (closed, expired, or never created)"),
                unknown.err);
  const Result other = run_sbx({"status", R"({"sandbox_id": "x", "provider": "elsewhere"})"});
  CHECK(other.code == 2);
  CHECK_MESSAGE(has(other.err, "refused the sandbox argument"), other.err);
}
