// Host::reload through the host API alone: a plugin file replaced on disk becomes a new generation
// (its new version string proves the new code runs), sandboxes of the old generation keep working
// until closed and the old library then leaves the process; a corrupt file, a wrong-ABI plugin, a
// plugin whose init fails and a failing canary are each refused as a whole with the old generation
// still serving; blocks added, changed and removed; and reloads under a steady load of sessions on
// several threads (run under TSan in CI).
//
// Sandboxes are test_processes sandboxes (host processes in a temp directory); the plugin file the
// config names is a copy in the test's own directory, replaced the way an operator would (a new
// file renamed over it).

#include <doctest/doctest.h>

#include "../common/test_helpers.hpp"

#include <sbx/core/errors.hpp>
#include <sbx/core/host.hpp>

#include <boost/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace std::chrono_literals;

namespace {

const fs::path kV1 = fs::path(SBX_TEST_PLUGIN_DIR) / "test_processes.so";
const fs::path kV2 = SBX_TEST_PLUGIN_V2;
const fs::path kWrongAbi = fs::path(SBX_BAD_PLUGIN_DIR) / "wrong_abi.so";
const fs::path kInitFails = fs::path(SBX_BAD_PLUGIN_DIR) / "init_fails.so";

// A directory with the plugin file the config names (plugin.so) and the sandboxes' root.
struct Fixture {
  sbx::testing::TempDir dir{"sbx-reload-test"};
  fs::path plugin = dir.path / "plugin.so";
  fs::path root = dir.path / "boxes";
  std::optional<sbx::Host> host;

  explicit Fixture(const sbx::Deadlines& deadlines = {}) {
    fs::create_directories(root);
    install(kV1);
    sbx::Host::Options options;
    options.deadlines = deadlines;
    options.config = config();
    options.use_default_plugin_dirs = false;
    options.plugin_cache = "off";
    host.emplace(std::move(options));
    host->provider("p");  // loaded: a reload has a generation to replace
  }

  // Puts `file` in place of plugin.so as an operator would: copy next to it, rename over it.
  void install(const fs::path& file) const { sbx::testing::replace_file_with_copy(plugin, file); }
  void install_text(const std::string& text) const { sbx::testing::replace_file(plugin, text); }

  // {"providers": {"p": {"plugin": "<dir>/plugin.so#test_processes", "config": {"root"}}}} plus
  // `extra` blocks and a `canary` for p when given.
  sbx::Config config(const json::object& extra = {}, const json::value& canary = nullptr,
                     const json::object& p_config = {}) const {
    json::object p_cfg = p_config;
    p_cfg["root"] = root.string();
    json::object p{{"plugin", plugin.string() + "#test_processes"}, {"config", p_cfg}};
    if (!canary.is_null()) p["canary"] = canary;
    json::object providers{{"p", p}};
    for (const auto& [name, block] : extra)
      providers[name] = block;
    return sbx::Config::parse(json::serialize(json::object{{"providers", providers}}),
                              "reload test");
  }

  sbx::GenerationInfo current(const std::string& name = "p") {
    for (const auto& g : host->generations()) {
      if (g.name == name && g.current) return g;
    }
    FAIL("no current generation of " << name);
    return {};
  }
  size_t generations_of(const std::string& name = "p") {
    size_t n = 0;
    for (const auto& g : host->generations())
      n += g.name == name;
    return n;
  }
};

// Whether the process maps a file whose path contains `needle` (/proc/self/maps).
[[maybe_unused]] bool mapped(const std::string& needle) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

// The private copies of plugin.so this process maps (/tmp/plugin-XXXXXX.so, unlinked: "(deleted)"),
// by path. The installed file itself is never mapped.
[[maybe_unused]] std::set<std::string> mapped_copies() {
  const std::string prefix = (fs::temp_directory_path() / "plugin-").string();
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> out;
  std::string line;
  while (std::getline(maps, line)) {
    const auto at = line.find(prefix);
    if (at != std::string::npos) out.insert(line.substr(at));
  }
  return out;
}

std::string reload_error(Fixture& f, const sbx::Config& config) {
  try {
    f.host->reload(config);
  } catch (const sbx::ReloadError& e) {
    return e.what();
  }
  FAIL("the reload was not refused");
  return {};
}

// test_processes' config for a hang in `step` ("init", "create", "exec") until `hang` is released.
json::object hang_config(const sbx::testing::Hang& hang, const std::string& step) {
  return {{"hang_in", step}, {"hang_fifo", hang.fifo.string()}};
}

}  // namespace

TEST_CASE("a replaced plugin file is a new generation; the old one drains, then unloads") {
  Fixture f;
  sbx::Sandbox old_box = f.host->provider("p").create({});
  CHECK(old_box.exec("echo one").stdout_text == "one\n");
  const auto first = f.current();
  CHECK(first.plugin_version == "0.1.0");
  CHECK(first.sandboxes == 1);

  f.install(kV2);
  const sbx::ReloadReport report = f.host->reload(f.config());
  CHECK(report.changed == std::vector<std::string>{"p"});
  CHECK(report.added.empty());
  CHECK(report.removed.empty());

  const auto second = f.current();
  CHECK(second.plugin_version == "2.0.0");
  CHECK(second.serial != first.serial);
  CHECK(second.plugin_file == fs::weakly_canonical(f.plugin).string());
  // The file it was loaded from (through a private copy, unlinked once mapped).
  CHECK(f.host->provider("p").plugin_path() == fs::weakly_canonical(f.plugin).string());
  // The old generation still serves its sandbox; new sandboxes go to the new one.
  CHECK(old_box.exec("echo still").stdout_text == "still\n");
  sbx::Sandbox new_box = f.host->provider("p").create({});
  CHECK(new_box.exec("echo two").stdout_text == "two\n");
  CHECK(f.generations_of() == 2);
  for (const auto& g : f.host->generations()) {
    if (g.serial == first.serial) {
      CHECK_FALSE(g.current);
      CHECK(g.sandboxes == 1);
    }
  }
  // Nothing of the copy is left on disk.
  for (const auto& entry : fs::directory_iterator(fs::temp_directory_path())) {
    const std::string name = entry.path().filename().string();
    CHECK_FALSE((name.starts_with("plugin-") && name.ends_with(".so")));
  }

  old_box.close();
  old_box = sbx::Sandbox();
  // Its close's last callbacks, then the library's unload: the generation leaves the list
  // before its last reference (on a plugin thread) unmaps the image, so each is waited for.
  CHECK(sbx::testing::eventually([&] { return f.generations_of() == 1; }, 5s));
#if !defined(__SANITIZE_THREAD__)  // TSan keeps libraries resident (plugin_library.cpp)
  CHECK(sbx::testing::eventually([] { return mapped_copies().size() == 1; }, 5s));
#endif
  new_box.close();
}

namespace {

// Overwrites `target` in place with the bytes of `from`, as `cp from target` does: the same inode,
// opened with O_TRUNC and written.
void overwrite_in_place(const fs::path& target, const fs::path& from) {
  const std::string bytes = sbx::testing::read_file(from);
  REQUIRE(!bytes.empty());
  const int fd = ::open(target.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  REQUIRE(fd >= 0);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    REQUIRE(n > 0);
    done += static_cast<size_t>(n);
  }
  REQUIRE(::close(fd) == 0);
}

constexpr const char* kChildEnv = "SBX_RELOAD_TEST_OVERWRITE_CHILD";

// Runs this test program again with `test_case` alone and kChildEnv set, its output into `log`;
// waits for it at most `limit`. Its exit code, 128 + the signal that ended it, or -1 if it was
// still running at the limit (then killed).
int run_self_as_child(const std::string& test_case, const fs::path& log,
                      std::chrono::seconds limit) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> args = {self, "--test-case=" + test_case, "--no-intro"};
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  ::setenv(kChildEnv, "1", 1);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, self.c_str(), &actions, nullptr, argv.data(), environ);
  ::unsetenv(kChildEnv);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(spawned == 0);
  // A pidfd becomes readable when the child ends: a bounded wait on that event.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  REQUIRE(pidfd >= 0);
  pollfd p{pidfd, POLLIN, 0};
  const int ready = ::poll(&p, 1, static_cast<int>(limit.count() * 1000));
  ::close(pidfd);
  if (ready != 1) ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (ready != 1) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

// The part that crashed a host (SIGBUS) when the first generation mapped the installed file
// itself: run in a child process by the test case below, so that a crash is a failure reported
// here rather than the end of this program.
TEST_CASE("overwritten in place: the child's part") {
  if (!std::getenv(kChildEnv)) return;  // only as the child
  Fixture f;
  sbx::Sandbox box = f.host->provider("p").create({});
  CHECK(box.exec("echo before > note; cat note").stdout_text == "before\n");
  CHECK_FALSE(mapped(f.plugin.string()));  // the installed file is not what runs

  overwrite_in_place(f.plugin, kV2);  // different bytes, the same inode

  // The host keeps working: the sandbox it serves, and a new one from the running generation.
  CHECK(box.exec("cat note; echo after").stdout_text == "before\nafter\n");
  sbx::Sandbox second = f.host->provider("p").create({});
  CHECK(second.exec("echo new").stdout_text == "new\n");
  CHECK(f.current().plugin_version == "0.1.0");
  // A reload then loads the new bytes as a new generation; the old one still serves its sandboxes.
  CHECK(f.host->reload(f.config()).changed == std::vector<std::string>{"p"});
  CHECK(f.current().plugin_version == "2.0.0");
  CHECK(f.host->provider("p").create({}).exec("echo two").stdout_text == "two\n");
  CHECK(box.exec("echo still").stdout_text == "still\n");
  // And overwriting the file under the second generation is as harmless.
  overwrite_in_place(f.plugin, kV1);
  CHECK(f.host->provider("p").create({}).exec("echo three").stdout_text == "three\n");
  box.close();
  second.close();
}

TEST_CASE("a plugin file overwritten in place (as cp does) leaves the running host working") {
  if (std::getenv(kChildEnv)) return;
  sbx::testing::TempDir dir("sbx-overwrite");
  const fs::path log = dir.path / "child.log";
  const int code = run_self_as_child("overwritten in place: the child's part", log, 120s);
  const std::string output = sbx::testing::read_file(log);
  CAPTURE(output);
  CHECK_MESSAGE(code != 128 + SIGBUS, "the host died of SIGBUS");
  CHECK(code == 0);
  CHECK(output.find("1 passed") != std::string::npos);
}

TEST_CASE("a sandbox moves to the new generation through sbx.connect/1 instead of draining") {
  Fixture f;
  sbx::Sandbox box = f.host->provider("p").create({});
  CHECK(box.exec("echo kept > note").return_code == 0);
  CHECK_FALSE(f.host->move_to_current(box).has_value());  // already on the current generation

  f.install(kV2);
  CHECK(f.host->reload(f.config()).changed == std::vector<std::string>{"p"});
  std::optional<sbx::Sandbox> moved = f.host->move_to_current(box);
  REQUIRE(moved.has_value());
  CHECK(moved->id() == box.id());
  // One handle moves once: a second move would make a second handle that closes the sandbox.
  CHECK_THROWS_WITH_AS((void)f.host->move_to_current(box),
                       doctest::Contains("it was moved already"), sbx::FailedPreconditionError);
  CHECK(moved->exec("cat note").stdout_text == "kept\n");  // the same sandbox, reached again
  // The old handle still works until it goes; destroying it does not close the sandbox.
  CHECK(box.exec("echo old").stdout_text == "old\n");
  box = std::move(*moved);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (f.generations_of() != 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  CHECK(f.generations_of() == 1);  // nothing held the first generation: it is gone
  CHECK(f.current().plugin_version == "2.0.0");
  CHECK(f.current().sandboxes == 1);
  CHECK(box.exec("cat note").stdout_text == "kept\n");
  CHECK_FALSE(f.host->move_to_current(box).has_value());
#if !defined(__SANITIZE_THREAD__)  // TSan keeps libraries resident (plugin_library.cpp)
  // The last reference may unload it later.
  CHECK(sbx::testing::eventually([] { return mapped_copies().size() == 1; }, 5s));
#endif

  // Another provider kind cannot read this descriptor: the move is refused, the sandbox drains.
  // (The block allows the kind to change: a reload refuses that otherwise.)
  sbx::Config other = sbx::Config::parse(
      json::serialize(json::object{
          {"providers", json::object{{"p", json::object{{"plugin", std::string(SBX_C_PLUGIN_DIR) +
                                                                       "/v1_0_processes.so"},
                                                        {"allow_kind_change", true}}}}}}),
      "reload test");
  CHECK(f.host->reload(other).changed == std::vector<std::string>{"p"});
  std::string message;
  try {
    (void)f.host->move_to_current(box);
  } catch (const sbx::FailedPreconditionError& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("cannot move sandbox " + box.id()) != std::string::npos);
  CHECK(message.find("test_processes and v1_0_processes differ") != std::string::npos);
  CHECK(box.exec("cat note").stdout_text == "kept\n");
  box.close();
  CHECK_THROWS_AS((void)f.host->move_to_current(box), sbx::FailedPreconditionError);
}

TEST_CASE("a corrupt file, a wrong-ABI plugin and a failing init are refused; the old serves on") {
  Fixture f;
  f.install(kV2);
  f.host->reload(f.config());
  const auto serving = f.current();
  sbx::Sandbox box = f.host->provider("p").create({});

  SUBCASE("corrupt") {
    f.install_text("this is not an ELF shared object\n");
    const std::string message = reload_error(f, f.config());
    CAPTURE(message);
    CHECK(message.starts_with("reload refused, nothing changed: provider 'p' ("));
    CHECK(message.find(": load: ") != std::string::npos);
    CHECK(message.find(f.plugin.string()) != std::string::npos);
  }
  SUBCASE("wrong ABI") {
    f.install(kWrongAbi);
    const std::string message = reload_error(f, f.config());
    CAPTURE(message);
    CHECK(message.find(": load: ") != std::string::npos);
    CHECK(message.find("ABI") != std::string::npos);
  }
  SUBCASE("init fails") {
    f.install(kInitFails);
    const std::string message = reload_error(f, f.config());
    CAPTURE(message);
    CHECK(message.find(": load: ") != std::string::npos);
    CHECK(message.find("backend library missing (injected)") != std::string::npos);
  }
  const auto after = f.current();
  CHECK(after.serial == serving.serial);
  CHECK(after.plugin_version == "2.0.0");
  CHECK(f.generations_of() == 1);  // the refused generation left nothing behind
  CHECK(box.exec("echo fine").stdout_text == "fine\n");
  CHECK(f.host->provider("p").create({}).exec("echo new").stdout_text == "new\n");
  box.close();
}

TEST_CASE("an init or a canary that never returns: the reload is refused at its deadline") {
  sbx::Deadlines deadlines;
  deadlines.call_s = 1;
  deadlines.create_s = 1;
  deadlines.grace_s = 1;
  Fixture f(deadlines);
  const auto first = f.current();
  sbx::testing::Hang hang(f.dir.path);

  SUBCASE("the provider's init") {
    const std::string error = reload_error(f, f.config({}, nullptr, hang_config(hang, "init")));
    CHECK_MESSAGE(error.find("provider 'p'") != std::string::npos, error);
    CHECK_MESSAGE(error.find("load: loading, initialising and configuring it did not finish "
                             "within 1 s (deadlines.call_s)") != std::string::npos,
                  error);
    CHECK_MESSAGE(error.find("abandoned: never served") != std::string::npos, error);
  }
  SUBCASE("the canary's create") {
    const json::value canary =
        json::object{{"spec", json::object{}}, {"command", "true"}, {"timeout_s", 1}};
    const std::string error = reload_error(f, f.config({}, canary, hang_config(hang, "create")));
    CHECK_MESSAGE(error.find("provider 'p'") != std::string::npos, error);
    CHECK_MESSAGE(
        error.find("canary: it did not finish within 4 s (deadlines.create_s + canary "
                   "timeout_s + deadlines.grace_s + deadlines.call_s)") != std::string::npos,
        error);
  }
  CHECK(sbx::testing::eventually([&] { return hang.reached(); }));
  // Nothing changed: the old generation serves, the abandoned one is not listed.
  CHECK(f.current().serial == first.serial);
  CHECK(f.generations_of() == 1);
  CHECK(f.host->provider("p").create({}).exec("echo alive").stdout_text == "alive\n");
  CHECK(f.host->abandoned_reload_steps() == 1);
  // Released, the plugin code returns; its thread drops the generation and ends.
  hang.release();
  CHECK(sbx::testing::eventually([&] { return f.host->abandoned_reload_steps() == 0; }));
  CHECK(f.host->reload(f.config()).unchanged == std::vector<std::string>{"p"});
}

TEST_CASE("stop_reloads: a reload hung in plugin code returns at once, later ones are refused") {
  Fixture f;  // default deadlines: 120 s for a load
  sbx::testing::Hang hang(f.dir.path);
  std::string error;
  std::thread reloading(
      [&] { error = reload_error(f, f.config({}, nullptr, hang_config(hang, "init"))); });
  CHECK(sbx::testing::eventually([&] { return hang.reached(); }));
  f.host->stop_reloads();
  reloading.join();
  CHECK_MESSAGE(error.find("the host is stopping") != std::string::npos, error);
  CHECK_MESSAGE(error.find("provider 'p'") != std::string::npos, error);
  CHECK_THROWS_WITH_AS(f.host->reload(f.config()), doctest::Contains("the host is stopping"),
                       sbx::ReloadError);
  CHECK(f.host->abandoned_reload_steps() == 1);
  hang.release();
  CHECK(sbx::testing::eventually([&] { return f.host->abandoned_reload_steps() == 0; }));
}

TEST_CASE("a reload that changes a block's provider kind is refused unless the block allows it") {
  Fixture f;
  const auto first = f.current();
  const std::string other_kind = std::string(SBX_C_PLUGIN_DIR) + "/v1_0_processes.so";
  auto config = [&](bool allow) {
    json::object p{{"plugin", other_kind}};
    if (allow) p["allow_kind_change"] = true;
    return sbx::Config::parse(json::serialize(json::object{{"providers", json::object{{"p", p}}}}),
                              "reload test");
  };
  const std::string error = reload_error(f, config(false));
  CAPTURE(error);
  CHECK(error.find("provider 'p' (" + other_kind +
                   "): provider kind: the provider kind would "
                   "change from 'test_processes' to 'v1_0_processes'") != std::string::npos);
  CHECK(error.find("set \"allow_kind_change\": true in the block") != std::string::npos);
  CHECK(f.current().serial == first.serial);
  CHECK(f.current().provider_id == "test_processes");

  CHECK(f.host->reload(config(true)).changed == std::vector<std::string>{"p"});
  CHECK(f.current().provider_id == "v1_0_processes");
}

TEST_CASE("changed deadlines apply to the new generation; the old one keeps its own") {
  Fixture f;
  sbx::Sandbox old_box = f.host->provider("p").create({});
  auto with_deadlines = [&](double exec_s) {
    json::value root = json::parse(json::serialize(json::object{
        {"deadlines", json::object{{"exec_s", exec_s}, {"cancel_grace_s", 1}}},
        {"providers",
         json::object{{"p", json::object{{"plugin", f.plugin.string() + "#test_processes"},
                                         {"config", json::object{{"root", f.root.string()}}}}}}}}));
    return sbx::Config::parse(json::serialize(root), "reload test");
  };
  // From none to some: the block gets a new generation (same library), with the new deadlines.
  const auto first = f.current();
  CHECK(f.host->reload(with_deadlines(3600)).changed == std::vector<std::string>{"p"});
  CHECK(f.current().serial != first.serial);
  // Changed again: an exec without a timeout is cut at the new exec_s on the new generation.
  CHECK(f.host->reload(with_deadlines(1)).changed == std::vector<std::string>{"p"});
  CHECK(f.host->config().deadlines->exec_s == 1);
  sbx::Sandbox new_box = f.host->provider("p").create({});
  // (The host cancels it at 1 s: an error, or the provider's cancelled result.)
  const auto cut = [&] {
    try {
      return new_box.exec("sleep 3").return_code != 0;
    } catch (const sbx::Error&) {
      return true;
    }
  };
  CHECK(cut());
  // The sandbox of the first generation keeps the deadlines it was made with (none: 3600 s).
  CHECK(old_box.exec("sleep 3").return_code == 0);
  // Unchanged deadlines: nothing to do.
  CHECK(f.host->reload(with_deadlines(1)).unchanged == std::vector<std::string>{"p"});
  // Invalid ones (a Config made in code, not parsed) are refused with the reason.
  sbx::Config invalid = with_deadlines(1);
  invalid.deadlines->exec_s = -1;
  CHECK(reload_error(f, invalid).find("reload refused, nothing changed: deadlines: ") == 0);
}

TEST_CASE("a canary: a failing one refuses the reload, a passing one lets it in") {
  Fixture f;
  const auto before = f.current();
  f.install(kV2);
  const std::string message =
      reload_error(f, f.config({}, json::parse(R"({"command": "exit 3"})")));
  CAPTURE(message);
  CHECK(message.find("provider 'p'") != std::string::npos);
  CHECK(message.find(": canary: canary exec: 'exit 3' exited 3") != std::string::npos);
  CHECK(f.current().serial == before.serial);
  CHECK(f.current().plugin_version == "0.1.0");
  // The canary's sandbox was closed: nothing is left in the provider's root.
  CHECK(fs::is_empty(f.root));

  const auto report = f.host->reload(f.config({}, json::parse(R"({"command": "echo ok"})")));
  CHECK(report.changed == std::vector<std::string>{"p"});
  CHECK(f.current().plugin_version == "2.0.0");
  CHECK(fs::is_empty(f.root));
}

TEST_CASE("blocks added, changed (config only: the library is kept) and removed; all or nothing") {
  Fixture f;
  f.host->provider("p");
  const json::object q{{"plugin", "test_processes"},
                       {"config", json::object{{"root", f.root.string()}}}};
  // "q" names a provider id: it is found in the test plugin directory.
  sbx::Config with_q = sbx::Config::parse(
      json::serialize(json::object{
          {"plugin_path", json::array{SBX_TEST_PLUGIN_DIR}},
          {"providers",
           json::object{{"p", json::object{{"plugin", f.plugin.string() + "#test_processes"},
                                           {"config", json::object{{"root", f.root.string()}}}}},
                        {"q", q}}}}),
      "reload test");
  // plugin_path is read at start: changing it is refused.
  CHECK(reload_error(f, with_q).find("plugin_path changed") != std::string::npos);

  auto report = f.host->reload(
      f.config({{"q", json::object{{"plugin", f.plugin.string()},
                                   {"config", json::object{{"root", f.root.string()}}}}}}));
  CHECK(report.added == std::vector<std::string>{"q"});
  CHECK(report.unchanged == std::vector<std::string>{"p"});
  CHECK(f.host->provider("q").create({}).exec("echo q").stdout_text == "q\n");

  // p's config changes: a new generation on the same library (the file did not change).
  const auto p_before = f.current("p");
  report = f.host->reload(
      f.config({{"q", json::object{{"plugin", f.plugin.string()},
                                   {"config", json::object{{"root", f.root.string()}}}}}},
               nullptr, json::object{{"fail_create", nullptr}}));
  CHECK(report.changed == std::vector<std::string>{"p"});
  CHECK(report.unchanged == std::vector<std::string>{"q"});
  const auto p_after = f.current("p");
  CHECK(p_after.serial != p_before.serial);
  CHECK(f.host->provider("p").plugin_path() == fs::weakly_canonical(f.plugin).string());

  // All or nothing: q changes fine, p's new config is refused by the plugin: neither changes.
  const auto q_before = f.current("q");
  const std::string message = reload_error(
      f, f.config({{"q", json::object{{"plugin", f.plugin.string()},
                                      {"config", json::object{{"root", f.root.string()},
                                                              {"fail_create", nullptr}}}}}},
                  nullptr, json::object{{"no_such_key", 1}}));
  CAPTURE(message);
  CHECK(message.find("provider 'p'") != std::string::npos);
  CHECK(message.find("no_such_key") != std::string::npos);
  CHECK(f.current("q").serial == q_before.serial);
  CHECK(f.current("p").serial == p_after.serial);

  // q removed: no longer served by name.
  report = f.host->reload(f.config({}, nullptr, json::object{{"fail_create", nullptr}}));
  CHECK(report.removed == std::vector<std::string>{"q"});
  CHECK_THROWS_AS(f.host->provider("q"), sbx::InvalidArgumentError);
}

TEST_CASE("reloads under steady load: no session fails, every sandbox works until closed") {
  Fixture f;
  constexpr int kThreads = 4;
  std::atomic<bool> stop{false};
  std::atomic<int> sessions{0};
  std::atomic<int> failures{0};
  std::mutex failures_mutex;
  std::string first_failure;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!stop) {
        try {
          sbx::Sandbox box = f.host->provider("p").create({});
          const std::string word = "s" + std::to_string(t);
          const auto r = box.exec("echo " + word);
          if (r.stdout_text != word + "\n")
            throw std::runtime_error("wrong output: " + r.stdout_text);
          box.upload_bytes("data " + word, "/f.txt");
          if (box.download_bytes("/f.txt") != "data " + word) throw std::runtime_error("file");
          std::this_thread::sleep_for(5ms);  // a session spans reloads
          if (box.exec("echo again").stdout_text != "again\n") throw std::runtime_error("again");
          box.close();
          ++sessions;
        } catch (const std::exception& e) {
          std::lock_guard lock(failures_mutex);
          if (failures++ == 0) first_failure = e.what();
        }
      }
    });
  }
  constexpr int kReloads = 6;
  for (int i = 0; i < kReloads; ++i) {
    std::this_thread::sleep_for(100ms);
    f.install(i % 2 == 0 ? kV2 : kV1);
    const auto report = f.host->reload(f.config());
    CHECK(report.changed == std::vector<std::string>{"p"});
  }
  // A refused one in the middle of the load changes nothing for the sessions.
  f.install_text("corrupt\n");
  CHECK(reload_error(f, f.config()).find(": load: ") != std::string::npos);
  std::this_thread::sleep_for(100ms);
  stop = true;
  for (auto& t : threads)
    t.join();
  CAPTURE(first_failure);
  MESSAGE(sessions.load(), " sessions across ", kReloads, " reloads");
  CHECK(failures == 0);
  CHECK(sessions > 0);
  // Every old generation drained and went away. The last completions may still be returning on
  // the plugin's threads (they hold their sandbox until then): a short wait.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while ((f.generations_of() != 1 || f.current().sandboxes != 0 || f.current().operations != 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(f.generations_of() == 1);
  CHECK(f.current().sandboxes == 0);
  CHECK(f.current().operations == 0);
}
