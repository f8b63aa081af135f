// The `sbx` command, run as a real process: plugins, providers, run (streams, exit codes, files),
// help, and usage errors.

#include <doctest/doctest.h>

#include <boost/json.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/test_helpers.hpp"

namespace {

namespace fs = std::filesystem;

struct Run {
  int exit_code;
  std::string out;  // stdout and stderr, in the order written (2>&1)
};

Run run_cli(const std::string& args) {
  const std::string cmd =
      std::string(SBX_CLI) + " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe);
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0)
    out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("sbx plugins lists the test plugin, also as JSON") {
  const Run text = run_cli("plugins");
  CHECK(text.exit_code == 0);
  CHECK(has(text.out, "test_processes.so"));
  CHECK(has(text.out, "plugin:    test_processes 0.1.0 (ABI 1.0)"));

  const Run json = run_cli("plugins --json");
  REQUIRE(json.exit_code == 0);
  const auto parsed = boost::json::parse(json.out).as_array();
  bool found = false;
  for (const auto& p : parsed) {
    if (p.at("name") == "test_processes") {
      found = true;
      CHECK(p.at("abi_version") == "1.0");
      CHECK(p.at("providers").as_array().at(0).at("id") == "test_processes");
    }
  }
  CHECK(found);
}

TEST_CASE("sbx providers shows configured blocks") {
  const fs::path config = fs::temp_directory_path() / "sbx-cli-test-config.json";
  std::ofstream(config) << R"({"providers": {"local": {"plugin": "test_processes"}}})";
  const Run r = run_cli("providers --config " + config.string());
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "local\ttest_processes\tconfigured"));
  fs::remove(config);
}

TEST_CASE("sbx run: output, exit code, env, workdir, uploads and downloads") {
  const fs::path dir = fs::temp_directory_path() / "sbx-cli-test-run";
  fs::create_directories(dir);
  std::ofstream(dir / "in.txt") << "hello cli";
  const Run r = run_cli("run --provider test_processes --workdir /w --env NAME=sbx --upload " +
                        (dir / "in.txt").string() +
                        ":/w/in.txt --download /w/out.txt:" + (dir / "out.txt").string() +
                        " -- sh -c 'echo \"hi $NAME\"; tr a-z A-Z < in.txt > out.txt; exit 7'");
  CHECK(r.exit_code == 7);
  CHECK(has(r.out, "hi sbx\n"));
  std::ifstream out(dir / "out.txt");
  std::string contents((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  CHECK(contents == "HELLO CLI");
  fs::remove_all(dir);
}

TEST_CASE("sbx run: a timeout exits 125 with a message") {
  const Run r = run_cli("run --provider test_processes --timeout 1 -- 'echo early; sleep 20'");
  CHECK(r.exit_code == 125);
  CHECK(has(r.out, "early"));
  CHECK(has(r.out, "timed out"));
}

TEST_CASE("usage errors and unknown providers") {
  CHECK(run_cli("run --provider test_processes").exit_code == 2);  // no command
  CHECK(run_cli("frobnicate").exit_code == 2);
  CHECK(run_cli("run --provider test_processes --bogus -- true").exit_code == 2);
  const Run unknown = run_cli("run --provider nope -- true");
  CHECK(unknown.exit_code == 125);
  CHECK(has(unknown.out, "Unknown sandbox provider 'nope'. Available providers: "));
  CHECK(has(unknown.out, "test_processes"));
}

TEST_CASE("--help works on every subcommand") {
  for (const char* cmd : {"--help", "plugins --help", "providers --help", "run --help",
                          "list --help", "reap --help"}) {
    const Run r = run_cli(cmd);
    CHECK(r.exit_code == 0);
    CHECK(has(r.out, "Usage"));
  }
}

TEST_CASE("list and reap need a provider with the list-reap extension and a selector") {
  const Run unsupported = run_cli("list --provider test_processes");
  CHECK(unsupported.exit_code == 125);
  CHECK(has(unsupported.out, "does not support listing and reaping"));
  const Run no_selector = run_cli("reap --provider test_processes");
  CHECK(no_selector.exit_code == 2);
  CHECK(has(no_selector.out, "--all"));
}

TEST_CASE("with no provider named and no config, run uses local_docker") {
  const Run r = run_cli("run -- true");
  CHECK(r.exit_code == 125);
  CHECK(has(r.out, "spec.image is required for the local_docker provider"));
}

TEST_CASE("Ctrl-C cancels the command, closes the sandbox and exits 130") {
  sbx::testing::TempDir root("sbx-cli-interrupt");
  const std::string tmpdir = "TMPDIR=" + root.path.string();
  std::string cli = SBX_CLI;
  std::vector<std::string> args = {cli,   "--plugin-dir", SBX_TEST_PLUGIN_DIR,
                                   "run", "--provider",   "test_processes",
                                   "--",  "sleep 30"};
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = {tmpdir, "PATH=/usr/bin:/bin"};
  std::vector<char*> envp;
  for (auto& e : env_strings)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, cli.c_str(), nullptr, nullptr, argv.data(), envp.data()) == 0);
  // Wait until the sandbox exists (its directory appears), then interrupt.
  bool started = false;
  for (int i = 0; i < 100 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    started = !fs::is_empty(root.path);
  }
  REQUIRE(started);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGINT);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(fs::is_empty(root.path));  // the sandbox was closed
}
