// The `sbx` command, run as a real process: plugins, providers, run (streams, exit codes, files),
// help, and usage errors.

#include <doctest/doctest.h>

#include <boost/json.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
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

// Runs a shell command line with stderr joined to stdout.
Run run_shell(const std::string& cmd) {
  FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(pipe);
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0)
    out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

Run run_cli(const std::string& args) {
  return run_shell(std::string(SBX_CLI) + " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " + args);
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs `sbx <script>` with bash (for pipelines and PIPESTATUS) and TMPDIR=tmpdir, where
// test_processes makes its sandbox directories; `script` may go on after the sbx command line.
// Returns what it printed.
std::string run_cli_in_bash(const fs::path& tmpdir, const std::string& script) {
  sbx::testing::TempDir scripts("sbx-cli-script");
  const fs::path file = scripts.path / "script.sh";
  sbx::testing::write_file(file, "export TMPDIR=" + tmpdir.string() + "\n" + SBX_CLI +
                                     " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " + script + "\n");
  return run_shell("bash " + file.string()).out;
}

// Waits (at most 30 s) until process `pid` blocks SIGINT, as sbx does once it handles Ctrl-C:
// a SIGINT sent before that could be lost (a background job of a script ignores it until then).
bool sigint_blocked(pid_t pid) {
  for (int i = 0; i < 3000; ++i) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("SigBlk:", 0) == 0 && (std::stoull(line.substr(7), nullptr, 16) & 2u) != 0)
        return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Starts `sbx ARGS...` with TMPDIR set (where test_processes makes its sandbox directories).
pid_t spawn_cli(const fs::path& tmpdir, std::vector<std::string> args) {
  std::string cli = SBX_CLI;
  args.insert(args.begin(), {cli, "--plugin-dir", SBX_TEST_PLUGIN_DIR});
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = {"TMPDIR=" + tmpdir.string(), "PATH=/usr/bin:/bin"};
  std::vector<char*> envp;
  for (auto& e : env_strings)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, cli.c_str(), nullptr, nullptr, argv.data(), envp.data()) == 0);
  return pid;
}

// Waits (bounded) until `pid`'s main thread blocks SIGHUP: the command's signal thread
// (cli/stop.cpp) is in place. False at the limit.
bool signals_taken(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("SigBlk:", 0) != 0) continue;
      const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
      if (mask & (1ull << (SIGHUP - 1))) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// waitpid with a bound: a run that does not stop is a failure, not a hung test.
std::optional<int> wait_exit(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return std::nullopt;
}

}  // namespace

TEST_CASE("sbx plugins lists the test plugin, also as JSON") {
  const Run text = run_cli("plugins");
  CHECK(text.exit_code == 0);
  CHECK(has(text.out, "test_processes.so"));
  CHECK(has(text.out, "plugin:    test_processes 0.1.0 (ABI 1.3)"));

  const Run json = run_cli("plugins --json");
  REQUIRE(json.exit_code == 0);
  const auto parsed = boost::json::parse(json.out).as_array();
  bool found = false;
  for (const auto& p : parsed) {
    if (p.at("name") == "test_processes") {
      found = true;
      CHECK(p.at("abi_version") == "1.3");
      const auto& kind = p.at("providers").as_array().at(0);
      CHECK(kind.at("id") == "test_processes");
      CHECK(kind.at("config_schema").at("type") == "object");  // the schema, as JSON
    }
  }
  CHECK(found);
}

TEST_CASE("sbx plugins says which directory shadows which") {
  // Copies of the test plugin: one in each of two directories (the first one searched is used,
  // the other shadowed), then two in one directory (ambiguous: the host refuses the id).
  sbx::testing::TempDir root("sbx-cli-shadow");
  const fs::path base = fs::canonical(root.path);  // sbx lists canonical paths
  const fs::path plugin = fs::path(SBX_TEST_PLUGIN_DIR) / "test_processes.so";
  for (const char* dir : {"first", "second", "both"})
    fs::create_directory(base / dir);
  const std::string used = (base / "first" / "test_processes.so").string();
  const std::string shadowed = (base / "second" / "test_processes.so").string();
  const std::string twin_a = (base / "both" / "a.so").string();
  const std::string twin_b = (base / "both" / "b.so").string();
  for (const auto& copy : {used, shadowed, twin_a, twin_b})
    fs::copy_file(plugin, copy);
  const auto plugins = [](const std::string& dirs, const std::string& flags = "") {
    return run_shell("env -u SBX_PLUGIN_PATH " + std::string(SBX_CLI) + " " + dirs + " plugins " +
                     flags);
  };
  // Which provider entry of `listing` (sbx plugins --json) belongs to `path`.
  const auto entry = [](const boost::json::array& listing, const std::string& path) {
    for (const auto& p : listing) {
      if (p.at("path") == path.c_str()) return p.at("providers").at(0).as_object();
    }
    FAIL("not listed: " << path);
    return boost::json::object();
  };
  const std::string two_dirs =
      "--plugin-dir " + (base / "first").string() + " --plugin-dir " + (base / "second").string();

  const Run text = plugins(two_dirs);
  CHECK(text.exit_code == 0);
  CHECK_MESSAGE(has(text.out, used + "\n  plugin:    test_processes 0.1.0 (ABI 1.3)\n"
                                     "  provider:  test_processes - "),
                text.out);
  CHECK(has(text.out, "  shadows:   test_processes of " + shadowed + "\n"));
  CHECK(has(text.out, shadowed + "\n  plugin:    test_processes 0.1.0 (ABI 1.3)\n"));
  CHECK(has(text.out, "  shadowed:  test_processes, by " + used + " (not used)\n"));
  CHECK(text.out.find(used + "\n") < text.out.find(shadowed + "\n"));  // in search order
  CHECK(has(text.out, "searched in this order: " + (base / "first").string() + " " +
                          (base / "second").string() + " "));

  const Run json = plugins(two_dirs, "--json");
  REQUIRE(json.exit_code == 0);
  const auto listing = boost::json::parse(json.out).as_array();
  const auto first = entry(listing, used);
  CHECK(first.at("used") == true);
  CHECK(first.at("shadows") == boost::json::array{boost::json::string(shadowed)});
  CHECK_FALSE(first.contains("shadowed_by"));
  const auto second = entry(listing, shadowed);
  CHECK(second.at("used") == false);
  CHECK(second.at("shadowed_by") == used.c_str());
  CHECK_FALSE(second.contains("shadows"));

  // Two in the first directory searched: neither is used, and they shadow the later copy.
  const std::string ambiguous_dirs =
      "--plugin-dir " + (base / "both").string() + " --plugin-dir " + (base / "first").string();
  const Run twins = plugins(ambiguous_dirs);
  CHECK(twins.exit_code == 0);
  CHECK_MESSAGE(has(twins.out, "  ambiguous: test_processes, also in " + twin_b +
                                   " (same directory: the id cannot be used)\n"),
                twins.out);
  const auto twins_json = boost::json::parse(plugins(ambiguous_dirs, "--json").out).as_array();
  CHECK(entry(twins_json, twin_a).at("used") == false);
  CHECK(entry(twins_json, twin_a).at("ambiguous_with") ==
        boost::json::array{boost::json::string(twin_b)});
  CHECK(entry(twins_json, used).at("shadowed_by") == twin_a.c_str());
  // Without the copies, the installed or built plugins are used as before.
  const auto alone = boost::json::parse(plugins("", "--json").out).as_array();
  for (const auto& p : alone) {
    if (p.as_object().contains("providers")) CHECK(p.at("providers").at(0).at("used") == true);
  }
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

TEST_CASE("a failure's reason (ABI 1.2) is printed after its message") {
  sbx::testing::TempDir root("sbx-cli-reason");
  sbx::testing::write_file(root.path / "failing.json", R"j({"providers": {"f": {
      "plugin": "test_processes", "config": {"fail_create": "the registry said no (injected)",
      "fail_create_reason": "image_pull_failed"}}}})j");
  const Run r =
      run_cli("--config " + (root.path / "failing.json").string() + " run --provider f -- true");
  CHECK(r.exit_code == 125);  // the sandbox could not be made
  CHECK(has(r.out, "sbx: error: the registry said no (injected) (reason: image_pull_failed)\n"));
  fs::remove(root.path / "failing.json");
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
  const pid_t pid = spawn_cli(root.path, {"run", "--provider", "test_processes", "--", "sleep 30"});
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

TEST_CASE("a signal during create cancels it at once; SIGHUP counts as an interrupt") {
  sbx::testing::TempDir root("sbx-cli-hup");
  sbx::testing::write_file(root.path / "slow.json", R"({"providers": {"slow": {
      "plugin": "test_processes", "config": {"create_delay_ms": 600000}}}})");
  const pid_t pid = spawn_cli(root.path, {"--config", (root.path / "slow.json").string(), "run",
                                          "--provider", "slow", "--", "true"});
  // Once the command has taken its signals (they are blocked for its signal thread), before or
  // while it creates: a fixed sleep raced with a slow start-up (ASan on a busy machine).
  REQUIRE(signals_taken(pid, std::chrono::seconds(60)));
  ::kill(pid, SIGHUP);
  // Not after the 10-minute create; the bound leaves room for a slow start-up (plugin probing
  // and loading happen before the create can be cancelled).
  CHECK(wait_exit(pid, std::chrono::seconds(120)) == 130);
  fs::remove(root.path / "slow.json");
  CHECK(fs::is_empty(root.path));
}

TEST_CASE("output nobody reads stops the command: the sandbox is closed, exit 141 (SIGPIPE)") {
  sbx::testing::TempDir root("sbx-cli-pipe");
  const std::string out = run_cli_in_bash(
      root.path, "run --provider test_processes -- yes | head -c 4\necho \" rc=${PIPESTATUS[0]}\"");
  CHECK(out == "y\ny\n rc=141\n");
  CHECK(fs::is_empty(root.path));  // the sandbox was closed
}

TEST_CASE("bad run options are usage errors found before any sandbox exists") {
  sbx::testing::TempDir root("sbx-cli-early");
  auto run_in = [&](const std::string& args) {
    const std::string out = run_cli_in_bash(root.path, args + "\necho \" rc=$?\"");
    CHECK(fs::is_empty(root.path));  // no sandbox was made
    return out;
  };
  const std::string timeout = run_in("run --provider test_processes --timeout -5 -- true");
  CHECK(has(timeout, "exec timeout_s must be > 0, got -5"));
  CHECK(has(timeout, "rc=2"));
  CHECK(has(run_in("run --provider test_processes --ttl inf -- true"), "rc=2"));
  CHECK(has(run_in("run --provider test_processes --memory 4096.5 -- true"), "rc=2"));
  const std::string upload =
      run_in("run --provider test_processes --upload /nonexistent/x:/x -- true");
  CHECK(has(upload, "/nonexistent/x is not a readable file"));
  CHECK(has(upload, "rc=2"));
}

// ---- Hardening: bad plugin files, silent loss, misbehaving providers ---------------------------

TEST_CASE("a broken .so in the plugin path does not stop commands of other providers") {
  sbx::testing::TempDir root("sbx-cli-broken");
  // A real plugin cut after 4 KiB: glibc crashes with SIGBUS on loading it.
  const std::string real =
      sbx::testing::read_file(fs::path(SBX_TEST_PLUGIN_DIR) / "test_processes.so");
  sbx::testing::write_file(root.path / "x.so", real.substr(0, 4096));
  fs::create_symlink("loop.so", root.path / "loop.so");
  const std::string out =
      run_shell("SBX_PLUGIN_PATH=" + root.path.string() + " " + SBX_CLI + " --plugin-dir " +
                SBX_TEST_PLUGIN_DIR + " run --provider test_processes -- echo hi")
          .out;
  CHECK(out == "hi\n");
  const Run listed =
      run_shell("SBX_PLUGIN_PATH=" + root.path.string() + " " + SBX_CLI + " plugins");
  CHECK(listed.exit_code == 0);
  CHECK(has(listed.out, "x.so: broken plugin file"));
  CHECK(has(listed.out, "loop.so: cannot read the file: Too many levels of symbolic links"));
}

TEST_CASE("output that cannot be written stops the command and exits 74") {
  sbx::testing::TempDir root("sbx-cli-full");
  const std::string out = run_cli_in_bash(
      root.path, "run --provider test_processes -- 'seq 1 1000000' > /dev/full\necho \" rc=$?\"");
  CHECK(has(out, "writing the command's stdout failed: No space left on device"));
  CHECK(has(out, "rc=74"));
  CHECK(fs::is_empty(root.path));  // the sandbox was closed
  const Run listed = run_shell("(" + std::string(SBX_CLI) + " plugins > /dev/full)");
  CHECK(listed.exit_code == 74);
  CHECK(has(listed.out, "writing to stdout failed"));
}

TEST_CASE("an upload of a file whose size the kernel does not know sends all of it") {
  sbx::testing::TempDir root("sbx-cli-proc");
  const fs::path copy = root.path / "copy" / "cpuinfo";
  const Run r = run_cli("run --provider test_processes --upload /proc/cpuinfo:/x --download /x:" +
                        copy.string() + " -- 'wc -c < x'");
  CHECK(r.exit_code == 0);
  const std::string uploaded = sbx::testing::read_file(copy);
  CHECK(uploaded.size() > 0);
  CHECK(has(uploaded, "processor"));
  CHECK(has(r.out, std::to_string(uploaded.size())));
}

TEST_CASE("text that is not UTF-8 is refused before a sandbox exists") {
  sbx::testing::TempDir root("sbx-cli-utf8");
  const std::string out = run_cli_in_bash(
      root.path, "run --provider test_processes --env X=$'\\xff\\xfe' -- true\necho \" rc=$?\"");
  CHECK(has(out, "Sandbox env 'X' is not valid UTF-8 (byte 0)"));
  CHECK(has(out, "rc=2"));
  CHECK(fs::is_empty(root.path));
}

TEST_CASE("config files and provider options are checked like config files") {
  sbx::testing::TempDir root("sbx-cli-config");
  sbx::testing::write_file(root.path / "empty.json", "");
  const Run dir = run_cli("--config " + root.path.string() + " providers");
  CHECK(dir.exit_code == 2);
  CHECK(has(dir.out, "is a directory, not a config file"));
  const Run empty = run_cli("--config " + (root.path / "empty.json").string() + " providers");
  CHECK(empty.exit_code == 2);
  CHECK(has(empty.out, "the file is empty"));
  const Run zero = run_cli("--config /dev/zero providers");
  CHECK(zero.exit_code == 2);
  CHECK(has(zero.out, "/dev/zero: is a character device, not a config file"));
  fs::resize_file((root.path / "empty.json"), 17 * 1024 * 1024);  // 17 MiB of zeros
  const Run large = run_cli("--config " + (root.path / "empty.json").string() + " providers");
  CHECK(large.exit_code == 2);
  CHECK(has(large.out, "larger than 16 MiB"));
  const Run dup =
      run_cli(R"(run --provider test_processes --provider-options '{"a": 1, "a": 2}' -- true)");
  CHECK(dup.exit_code == 2);
  CHECK(has(dup.out, "$.a: duplicate key"));
}

TEST_CASE(
    "a config file that is a FIFO is refused at once, naming it, without waiting for a "
    "writer") {
  sbx::testing::TempDir root("sbx-cli-config-fifo");
  const fs::path fifo = root.path / "sbx.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Bounded: a regression waits for a writer forever, and is killed after 60 s (exit 137).
  const Run r = run_shell("timeout -s KILL 60 " + std::string(SBX_CLI) + " --plugin-dir " +
                          SBX_TEST_PLUGIN_DIR + " --config " + fifo.string() + " providers");
  CHECK_MESSAGE(r.exit_code == 2, r.out);
  CHECK_MESSAGE(has(r.out, fifo.string() + ": is a FIFO, not a config file"), r.out);
}

namespace {

// A config naming the misbehave plugin (tests/plugins/c/misbehave.c) in `mode`.
fs::path misbehave_config(const fs::path& dir, const std::string& mode,
                          const std::string& extra = "") {
  const fs::path file = dir / ("misbehave-" + mode + ".json");
  sbx::testing::write_file(file, std::string(R"({"plugin_path": [")") + SBX_C_PLUGIN_DIR +
                                     R"("], "providers": {"m": {"plugin": "misbehave", "config":
                                     {"mode": ")" +
                                     mode + "\"" + extra + "}}}}");
  return file;
}

}  // namespace

TEST_CASE("a return code no exit status can carry exits 125 with a message") {
  sbx::testing::TempDir root("sbx-cli-rc");
  const Run r = run_cli("--config " + misbehave_config(root.path, "rc", R"(, "rc": 256)").string() +
                        " run --provider m -- true");
  CHECK(r.exit_code == 125);
  CHECK(has(r.out, "the provider reported return code 256, which no exit status can carry"));
}

TEST_CASE(
    "a provider that never completes: Ctrl-C ends sbx run within --stop-timeout, saying "
    "what may be left and how to reap it; a second Ctrl-C ends it at once") {
  sbx::testing::TempDir root("sbx-cli-never");
  const std::string config = misbehave_config(root.path, "never").string();
  for (const bool twice : {false, true}) {
    const pid_t pid = spawn_cli(root.path, {"--config", config, "run", "--provider", "m",
                                            "--stop-timeout", twice ? "60" : "2", "--", "true"});
    REQUIRE(sigint_blocked(pid));  // sbx handles Ctrl-C from now on
    const auto start = std::chrono::steady_clock::now();
    ::kill(pid, SIGINT);
    if (twice) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::kill(pid, SIGINT);
    }
    CHECK(wait_exit(pid, std::chrono::seconds(30)) == 130);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(took < (twice ? 2.0 : 4.0));
  }
  const std::string out = run_cli_in_bash(
      root.path, "--config " + config +
                     " run --provider m --stop-timeout 1 -- true &\npid=$!\n"
                     // Ctrl-C once sbx blocks SIGINT (SigBlk bit 2): before that, a background
                     // job of a script ignores it.
                     "for i in $(seq 3000); do m=$(awk '/^SigBlk/ {print $2}' /proc/$pid/status); "
                     "(( 0x$m & 2 )) && break; sleep 0.01; done\n"
                     "kill -INT $pid; wait $pid; echo \" rc=$?\"");
  CHECK(has(out, "stopped waiting for provider 'm'; sandbox mis-"));
  CHECK(has(out, "may still exist. Remove it with: sbx reap --provider m --label sbx.run="));
  CHECK(has(out, "rc=130"));
}

// ---- The command table and the multi-step commands (create, exec, cp, status, pause, resume,
// close). No provider offers sbx.connect/1 to these tests yet: the end-to-end cases are in
// tests/local_docker/cli_multistep_test.cpp.

namespace {

// "CMD REST" as "CMD --provider test_processes REST".
std::string with_provider(const std::string& args, const std::string& provider) {
  const size_t space = args.find(' ');
  return args.substr(0, space) + " --provider " + provider +
         (space == std::string::npos ? "" : args.substr(space));
}
std::string with_test_provider(const std::string& args) {
  return with_provider(args, "test_processes");
}

}  // namespace

TEST_CASE("sbx --help lists every command; each command's help is its own") {
  const Run main_help = run_cli("--help");
  CHECK(main_help.exit_code == 0);
  for (const char* cmd : {"plugins", "providers", "run", "create", "exec", "cp", "status", "pause",
                          "resume", "close", "list", "reap"}) {
    CHECK_MESSAGE(has(main_help.out, std::string("\n  ") + cmd + " "), cmd);
    const Run help = run_cli(std::string(cmd) + " --help");
    CHECK(help.exit_code == 0);
    CHECK_MESSAGE(has(help.out, std::string("Usage: sbx ") + cmd + " "), help.out);
    CHECK(has(help.out, "--plugin-dir DIR"));  // the global options, on every command
  }
  CHECK(has(run_cli("run --help").out, "--stop-timeout S"));
  CHECK(has(run_cli("exec --help").out, "--stop-timeout S"));
  CHECK(has(run_cli("exec --help").out, "\nArguments:\n  ID "));
  // With no command: the main help on stderr, exit 2.
  const Run none = run_shell(SBX_CLI);
  CHECK(none.exit_code == 2);
  CHECK(has(none.out, "Commands:"));
}

TEST_CASE("global options after the command") {
  const Run r = run_shell(std::string(SBX_CLI) + " plugins --json --plugin-dir " +
                          SBX_TEST_PLUGIN_DIR + " --log-level=error");
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "\"name\":\"test_processes\""));
  const Run level = run_cli("providers --log-level bogus");
  CHECK(level.exit_code == 2);
  CHECK(has(level.out, "unknown log level 'bogus'"));
}

TEST_CASE("a plugin's log lines follow --log-level and SBX_LOG_LEVEL") {
  // The examples log "created sandbox" at info: hello through the C++ SDK's Logger, c_provider
  // through sbx_host.log directly. Their sandboxes are made under TMPDIR.
  sbx::testing::TempDir tmp("sbx-cli-log-level");
  for (const std::string provider : {"hello", "c_provider"}) {
    CAPTURE(provider);
    const std::string line = "[provider." + provider + "] [info] created";
    auto run = [&](const std::string& env, const std::string& flags) {
      return run_shell("env -u SBX_LOG_LEVEL " + env + " TMPDIR=" + tmp.path.string() + " " +
                       SBX_CLI + " --plugin-dir " + SBX_EXAMPLE_PLUGIN_DIR + " run --provider " +
                       provider + " " + flags + " -- echo ran");
    };
    const Run info = run("", "--log-level info");
    CHECK(info.exit_code == 0);
    CHECK_MESSAGE(has(info.out, line), info.out);
    CHECK(has(info.out, "ran\n"));
    const Run warn = run("", "--log-level warn");
    CHECK(warn.exit_code == 0);
    CHECK_FALSE_MESSAGE(has(warn.out, "created"), warn.out);
    CHECK(has(warn.out, "ran\n"));
    CHECK_FALSE(has(run("", "").out, "created"));  // the default is warn

    CHECK_MESSAGE(has(run("SBX_LOG_LEVEL=info", "").out, line), "SBX_LOG_LEVEL=info");
    const Run env_warn = run("SBX_LOG_LEVEL=warn", "");
    CHECK(env_warn.exit_code == 0);
    CHECK_FALSE_MESSAGE(has(env_warn.out, "created"), env_warn.out);
    // The option wins over the environment.
    CHECK_FALSE(has(run("SBX_LOG_LEVEL=info", "--log-level warn").out, "created"));
    CHECK(has(run("SBX_LOG_LEVEL=warn", "--log-level info").out, line));
  }
  const Run bad = run_shell("SBX_LOG_LEVEL=loud " + std::string(SBX_CLI) + " providers");
  CHECK(bad.exit_code == 2);
  CHECK(has(bad.out, "unknown log level 'loud' in SBX_LOG_LEVEL"));
  CHECK(fs::is_empty(tmp.path));  // every sandbox was closed
}

TEST_CASE("a provider without sbx.connect/1: the multi-step commands say so, 125, no sandbox") {
  // v1_0_processes: a plain-C plugin of ABI 1.0, with no extension at all.
  sbx::testing::TempDir root("sbx-cli-noconnect");
  sbx::testing::TempDir files("sbx-cli-noconnect-files");
  sbx::testing::write_file(files.path / "in.txt", "x");
  const std::string in = (files.path / "in.txt").string();
  for (const std::string& args : std::vector<std::string>{
           "create", "exec ID -- true", "cp " + in + " ID:/x", "cp ID:/x " + in, "status ID",
           "pause ID", "resume ID", "close ID"}) {
    const std::string out =
        run_cli_in_bash(root.path, "--plugin-dir " + std::string(SBX_C_PLUGIN_DIR) + " " +
                                       with_provider(args, "v1_0_processes") + "\necho \" rc=$?\"");
    CHECK_MESSAGE(has(out,
                      "provider 'v1_0_processes' does not support connecting to an existing "
                      "sandbox (sbx.connect/1)"),
                  args, ": ", out);
    CHECK_MESSAGE(has(out, "rc=125"), args, ": ", out);
  }
  CHECK(fs::is_empty(root.path));  // the provider never made one
}

TEST_CASE(
    "one sandbox over several sbx processes: create, exec, cp, status, pause, resume, "
    "close by id") {
  sbx::testing::TempDir root("sbx-cli-multistep");
  sbx::testing::TempDir files("sbx-cli-multistep-files");
  sbx::testing::write_file(files.path / "in.txt", "from the host\n");
  const std::string script =
      with_test_provider("create --workdir /w --env GREETING=hi") + " > " +
      (files.path / "id").string() + "\nid=$(cat " + (files.path / "id").string() +
      ")"
      "\necho \"create rc=$?\"" +
      "\n" + SBX_CLI + " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " +
      with_test_provider("cp " + (files.path / "in.txt").string() + " $id:in.txt") +
      "\necho \"cp in rc=$?\"" + "\n" + SBX_CLI + " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " +
      with_test_provider("exec $id -- 'cat in.txt; echo $GREETING; exit 3'") +
      "\necho \"exec rc=$?\"" + "\n" + SBX_CLI + " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " +
      with_test_provider("pause $id") + "\necho \"pause rc=$?\"" + "\n" + SBX_CLI +
      " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " + with_test_provider("status $id") + "\n" +
      SBX_CLI + " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " +
      with_test_provider("exec $id -- true") + "\necho \"paused exec rc=$?\"" + "\n" + SBX_CLI +
      " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " + with_test_provider("resume $id") + "\n" +
      SBX_CLI + " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " +
      with_test_provider("cp $id:in.txt " + (files.path / "out.txt").string()) +
      "\necho \"cp out rc=$?\"" + "\n" + SBX_CLI + " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " +
      with_test_provider("close $id") + "\necho \"close rc=$?\"" + "\n" + SBX_CLI +
      " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " " + with_test_provider("exec $id -- true") +
      "\necho \"gone rc=$?\"";
  const std::string out = run_cli_in_bash(root.path, script);
  CHECK_MESSAGE(has(out, "create rc=0"), out);
  CHECK_MESSAGE(has(out, "cp in rc=0"), out);
  CHECK_MESSAGE(has(out, "from the host\nhi\nexec rc=3"), out);  // the workdir and env came along
  CHECK_MESSAGE(has(out, "pause rc=0"), out);
  CHECK_MESSAGE(has(out, "paused\n"), out);
  CHECK_MESSAGE(has(out, "is paused; resume it first"), out);
  CHECK_MESSAGE(has(out, "paused exec rc=125"), out);
  CHECK_MESSAGE(has(out, "cp out rc=0"), out);
  CHECK(sbx::testing::read_file(files.path / "out.txt") == "from the host\n");
  CHECK_MESSAGE(has(out, "close rc=0"), out);
  CHECK_MESSAGE(has(out, "gone rc=125"), out);
  CHECK(fs::is_empty(root.path));  // closed: nothing left
}

TEST_CASE(
    "sbx cp to /dev/null writes into the device and leaves it a device; to a socket it is "
    "refused naming it") {
  sbx::testing::TempDir root("sbx-cli-cp-device");
  sbx::testing::TempDir files("sbx-cli-cp-device-files");
  const std::string sbx = std::string(SBX_CLI) + " --plugin-dir " + SBX_TEST_PLUGIN_DIR + " ";
  const std::string script =
      with_test_provider("create --workdir /w") + " > " + (files.path / "id").string() +
      "\nid=$(cat " + (files.path / "id").string() + ")" + "\n" + sbx +
      with_test_provider("exec $id -- 'seq 1 100000 > out.txt'") + "\n" + sbx +
      with_test_provider("cp $id:out.txt /dev/null") + "\necho \"cp null rc=$?\"" +
      "\n[ -c /dev/null ] && echo 'still a device'" +
      "\npython3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' " +
      (files.path / "sock").string() + "\n" + sbx +
      with_test_provider("cp $id:out.txt " + (files.path / "sock").string()) +
      "\necho \"cp socket rc=$?\"" + "\n[ -S " + (files.path / "sock").string() +
      " ] && echo 'still a socket'" + "\n" + sbx + with_test_provider("close $id");
  const std::string out = run_cli_in_bash(root.path, script);
  CHECK_MESSAGE(has(out, "cp null rc=0"), out);
  CHECK_MESSAGE(has(out, "still a device"), out);
  CHECK_MESSAGE(
      has(out, "cannot download to " + (files.path / "sock").string() + ": it is a socket"), out);
  CHECK_MESSAGE(has(out, "cp socket rc=74"), out);
  CHECK_MESSAGE(has(out, "still a socket"), out);
  CHECK(fs::is_empty(root.path));  // closed: nothing left
}

TEST_CASE("usage errors of the multi-step commands exit 2 before any provider is used") {
  sbx::testing::TempDir root("sbx-cli-multistep-usage");
  for (const std::string& args : std::vector<std::string>{
           "exec",                               // no sandbox
           "exec sbx-1",                         // no command
           "exec sbx-1 --",                      // an empty command
           "exec sbx-1 --timeout 0 -- true",     // exec timeout_s must be > 0
           "exec '{not json' -- true",           // not a descriptor
           "exec @/nonexistent -- true",         // no descriptor file
           "exec '' -- true",                    // an empty id
           "cp a b",                             // no sandbox side
           "cp sbx-1:/a sbx-2:/b",               // two sandbox sides
           "cp /nonexistent/x sbx-1:/x",         // an unreadable upload
           "cp sbx-1: here",                     // no remote path
           "cp sbx-1:/a",                        // no target
           "status",                             // no sandbox
           "status a b",                         // two sandboxes
           "pause --bogus sbx-1",                // unknown option
           "close --json sbx-1",                 // an option of another command
           "create --memory 1.5",                // not a whole number
           "create --ttl -1",                    // ttl_s must be > 0
           "create --upload /nonexistent/x:/x",  // unreadable upload
           "create --stop-timeout 0",            // --stop-timeout must be > 0
           "resume sbx-1 --stop-timeout",        // no value
       }) {
    const std::string out =
        run_cli_in_bash(root.path, with_test_provider(args) + "\necho \" rc=$?\"");
    CHECK_MESSAGE(has(out, "rc=2"), args, ": ", out);
    CHECK_MESSAGE(!has(out, "does not support"), args, ": ", out);  // refused before that
  }
  CHECK(fs::is_empty(root.path));
}
