// The loader refuses files that are not usable plugins, with a message naming the file (and both
// versions for an ABI mismatch), while the other plugins keep working.

#include <doctest/doctest.h>

#include <sbx/sbx.hpp>

#include "../common/test_helpers.hpp"

#include <boost/json.hpp>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string error_of(const std::vector<sbx::PluginInfo>& plugins, const std::string& file) {
  for (const auto& p : plugins) {
    if (p.path.filename() == file) return p.error;
  }
  FAIL("plugin file not listed: " << file);
  return {};
}

sbx::Host host_with_bad_plugins() {
  sbx::Host::Options options;
  options.plugin_dirs = {SBX_TEST_PLUGIN_DIR, SBX_BAD_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  return sbx::Host(std::move(options));
}

// A host whose provider "x" is the bad plugin init_fails.so, named by its config block.
sbx::Host host_with_init_failing_x() {
  sbx::Host::Options options;
  options.use_default_plugin_dirs = false;
  options.config = sbx::Config::parse(std::string(R"({"providers": {"x": {"plugin": ")") +
                                      SBX_BAD_PLUGIN_DIR + R"(/init_fails.so#x"}}})");
  return sbx::Host(std::move(options));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("bad plugin files are refused with clear messages") {
  sbx::Host host = host_with_bad_plugins();
  const auto plugins = host.plugins();
  REQUIRE(plugins.size() == 12);

  const std::string missing_entry = error_of(plugins, "not_a_plugin.so");
  CHECK(contains(missing_entry, "not_a_plugin.so"));
  CHECK(contains(missing_entry, "does not export sbx_plugin_entry"));

  const std::string corrupt = error_of(plugins, "corrupt.so");
  CHECK(contains(corrupt, "corrupt.so"));
  CHECK(contains(corrupt, "cannot load the library"));

  const std::string wrong_abi = error_of(plugins, "wrong_abi.so");
  CHECK(contains(wrong_abi, "wrong_abi.so"));
  CHECK(contains(wrong_abi, "plugin ABI version 2.0"));
  CHECK(contains(wrong_abi, "host's ABI version " + std::to_string(SBX_ABI_VERSION_MAJOR) + "." +
                                std::to_string(SBX_ABI_VERSION_MINOR)));

  // Listing reads descriptors only; init runs when the plugin is used.
  CHECK(error_of(plugins, "init_fails.so").empty());

  CHECK(error_of(plugins, "test_processes.so").empty());

  // Files whose loading crashes whoever loads them are read by the probe process only.
  CHECK(contains(error_of(plugins, "truncated.so"), "broken plugin file"));
  CHECK(contains(error_of(plugins, "crashes_on_load.so"), "broken plugin file"));
  CHECK(contains(error_of(plugins, "loop.so"),
                 "cannot read the file: Too many levels of symbolic links"));

  CHECK(contains(error_of(plugins, "bad_id.so"), "has the id 'Bad Id#x/y'; a provider id is"));
  CHECK(contains(error_of(plugins, "empty_id.so"), "has the id ''"));
  CHECK(contains(error_of(plugins, "duplicate_id.so"), "offers provider id 'fine' twice"));
  CHECK(contains(error_of(plugins, "bad_utf8.so"), "its name is not valid UTF-8"));
}

TEST_CASE(
    "a plugin directory with files that crash or hang their loader: the good plugin is "
    "used, the others are listed as broken, and nothing but it is loaded here") {
  sbx::Host::Options options;
  options.plugin_dirs = {SBX_BAD_PLUGIN_DIR, SBX_HANG_PLUGIN_DIR, SBX_TEST_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  options.plugin_cache = "off";
  options.probe_timeout_s = 1;
  sbx::Host host(std::move(options));
  CHECK(host.provider("test_processes").create({}).exec("echo alive").stdout_text == "alive\n");
  CHECK(contains(error_of(host.plugins(), "hangs_on_load.so"),
                 "broken plugin file: loading it did not finish within 1 s"));
  // Were any of them loaded into this process, it would have crashed or hung by now; and the
  // process maps only the plugin it used (a private copy of it: <temp
  // dir>/test_processes-XXXXXX.so).
  const std::string maps = sbx::testing::read_file("/proc/self/maps");
  const std::string temp = std::filesystem::temp_directory_path().string() + "/";
  CHECK(contains(maps, temp + "test_processes-"));
  CHECK_FALSE(contains(maps, "wrong_abi"));
  CHECK_FALSE(contains(maps, "bad_id"));
}

TEST_CASE(
    "probe results are cached on disk by file identity, and a changed file is probed "
    "again") {
  sbx::testing::TempDir dir("sbx-cache");
  const auto plugin = dir.path / "p.so";
  std::filesystem::copy_file(std::filesystem::path(SBX_BAD_PLUGIN_DIR) / "wrong_abi.so", plugin);
  sbx::Host::Options options;
  options.plugin_dirs = {dir.path / "plugins"};
  std::filesystem::create_directory(dir.path / "plugins");
  std::filesystem::rename(plugin, dir.path / "plugins" / "p.so");
  options.use_default_plugin_dirs = false;
  options.plugin_cache = dir.path / "cache.json";
  {
    sbx::Host host(options);
    CHECK(contains(error_of(host.plugins(), "p.so"), "plugin ABI version 2.0"));
  }
  const std::string cached = sbx::testing::read_file(dir.path / "cache.json");
  CHECK(contains(cached, "plugin ABI version 2.0"));
  // Replaced by a good plugin: a new identity, so a new probe.
  std::filesystem::copy_file(std::filesystem::path(SBX_TEST_PLUGIN_DIR) / "test_processes.so",
                             dir.path / "plugins" / "p.so",
                             std::filesystem::copy_options::overwrite_existing);
  sbx::Host host(options);
  CHECK(error_of(host.plugins(), "p.so").empty());
  CHECK(host.provider("test_processes").create({}).exec("echo fresh").stdout_text == "fresh\n");
}

TEST_CASE("a plugin whose init fails is refused when used, with the plugin's reason") {
  sbx::Host host = host_with_init_failing_x();
  const auto e = sbx::testing::error_of<sbx::PluginLoadError>([&] { host.provider("x"); });
  CHECK(contains(e.what(), "init_fails.so"));
  CHECK(contains(e.what(), "init failed: backend library missing (injected)"));
}

TEST_CASE("concurrent first uses of a plugin whose init fails each get the plugin's reason") {
  // They share one load while it runs (Host::provider); each waiter throws a copy of its own, typed
  // as the loading thread's error.
  sbx::Host host = host_with_init_failing_x();
  std::promise<void> go;
  const std::shared_future<void> started = go.get_future().share();
  std::vector<std::future<std::string>> users;
  for (int i = 0; i < 8; ++i) {
    users.push_back(std::async(std::launch::async, [&host, started] {
      started.wait();
      return std::string(
          sbx::testing::error_of<sbx::PluginLoadError>([&] { host.provider("x"); }).what());
    }));
  }
  go.set_value();
  for (auto& user : users) {
    const std::string message = user.get();
    CHECK_MESSAGE(contains(message, "init failed: backend library missing (injected)"), message);
  }
  // A failed load is forgotten: the next use tries again, and is refused again.
  CHECK_THROWS_AS(host.provider("x"), sbx::PluginLoadError);
}

TEST_CASE("the good plugin keeps working next to bad ones") {
  sbx::Host host = host_with_bad_plugins();
  sbx::Provider p = host.provider("test_processes");
  CHECK(p.provider_id() == "test_processes");
  sbx::Sandbox box = p.create({});
  CHECK(box.exec("echo ok").stdout_text == "ok\n");
}

TEST_CASE("a plugin file named in a config block is loaded directly") {
  sbx::Host::Options options;
  options.use_default_plugin_dirs = false;
  options.config = sbx::Config::parse(
      std::string(R"({"providers": {"direct": {"plugin": ")") + SBX_TEST_PLUGIN_DIR +
      R"(/test_processes.so#test_processes"}, "bad": {"plugin": ")" + SBX_BAD_PLUGIN_DIR +
      R"(/wrong_abi.so"}}})");
  sbx::Host host(std::move(options));
  CHECK(host.provider("direct").create({}).exec("echo direct").stdout_text == "direct\n");
  try {
    host.provider("bad");
    FAIL("a plugin of another ABI major must be refused");
  } catch (const sbx::PluginLoadError& e) {
    CHECK(contains(e.what(), "wrong_abi.so"));
    CHECK(contains(e.what(), "2.0"));
    CHECK(contains(e.what(), std::to_string(SBX_ABI_VERSION_MAJOR) + "." +
                                 std::to_string(SBX_ABI_VERSION_MINOR)));  // this host's
  }
}

TEST_CASE("plugin info lists name, version, ABI and provider ids") {
  sbx::Host host = host_with_bad_plugins();
  for (const auto& p : host.plugins()) {
    if (p.path.filename() != "test_processes.so") continue;
    CHECK(p.name == "test_processes");
    CHECK(p.version == "0.1.0");
    CHECK(p.abi_version.major == SBX_ABI_VERSION_MAJOR);
    REQUIRE(p.providers.size() == 1);
    CHECK(p.providers[0].id == "test_processes");
    CHECK(contains(p.providers[0].config_schema, "\"type\": \"object\""));
  }
}

TEST_CASE("an earlier plugin directory shadows a later one offering the same provider id") {
  sbx::testing::TempDir first("sbx-shadow");
  const auto copy = first.path / "test_processes_copy.so";
  std::filesystem::copy_file(std::filesystem::path(SBX_TEST_PLUGIN_DIR) / "test_processes.so",
                             copy);
  sbx::Host::Options options;
  options.plugin_dirs = {first.path, SBX_TEST_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  sbx::Host host(std::move(options));
  sbx::Provider p = host.provider("test_processes");
  CHECK(std::filesystem::equivalent(p.plugin_path(), copy));
  CHECK(p.create({}).exec("echo ok").stdout_text == "ok\n");
}

TEST_CASE("two hosts in one process use one plugin; destroying one leaves the other working") {
  sbx::Host::Options options;
  options.plugin_dirs = {SBX_TEST_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  auto a = std::make_unique<sbx::Host>(options);
  sbx::Host b(options);
  sbx::Sandbox from_a = a->provider("test_processes").create({});
  sbx::Provider p = b.provider("test_processes");
  from_a.close();
  from_a = sbx::Sandbox();
  a.reset();  // the library stays initialised for b
  CHECK(p.create({}).exec("echo still here").stdout_text == "still here\n");
}

namespace {

sbx::PluginInfo listed(const std::vector<sbx::PluginInfo>& plugins, const std::string& file) {
  for (const auto& p : plugins) {
    if (p.path.filename() == file) return p;
  }
  FAIL("plugin file not listed: " << file);
  return {};
}

// Plugin files that this process never probed (its probe cache in memory knows nothing of them):
// each fresh() is test_processes copied into a directory of its own. The real descriptor comes
// from probing another copy.
struct ForgeFixture {
  sbx::testing::TempDir dir{"sbx-forge"};
  std::filesystem::path cache = dir.path / "cache.json";
  boost::json::object real;  // the probe cache file of the template copy: format, host, entries
  int made = 0;

  ForgeFixture() {
    const auto templ = dir.path / "template";
    std::filesystem::create_directory(templ);
    std::filesystem::copy_file(std::filesystem::path(SBX_TEST_PLUGIN_DIR) / "test_processes.so",
                               templ / "t.so");
    sbx::Host::Options o = options(templ);
    o.plugin_cache = dir.path / "template-cache.json";
    {
      sbx::Host host(o);
      REQUIRE(listed(host.plugins(), "t.so").ok());
    }
    real =
        boost::json::parse(sbx::testing::read_file(dir.path / "template-cache.json")).as_object();
  }
  sbx::Host::Options options(const std::filesystem::path& plugins) const {
    sbx::Host::Options o;
    o.plugin_dirs = {plugins};
    o.use_default_plugin_dirs = false;
    o.plugin_cache = cache;
    return o;
  }
  // A new plugin directory holding p.so.
  std::filesystem::path fresh() {
    const auto plugins = dir.path / ("plugins" + std::to_string(++made));
    cache = dir.path / ("cache" + std::to_string(made) + ".json");  // read once per process
    std::filesystem::create_directory(plugins);
    std::filesystem::copy_file(std::filesystem::path(SBX_TEST_PLUGIN_DIR) / "test_processes.so",
                               plugins / "p.so");
    return plugins;
  }
  // test_processes' real descriptor with `edit` applied.
  template <class Edit>
  boost::json::object forged(Edit edit) const {
    const auto& entries = real.at("entries").as_object();
    REQUIRE(entries.size() == 1);
    boost::json::object descriptor = entries.begin()->value().at("descriptor").as_object();
    edit(descriptor);
    return descriptor;
  }
  // The probe cache with one entry, for `plugins`/p.so as it is now, saying `descriptor` (as a
  // user or a plugin could write it).
  void write_cache(const std::filesystem::path& plugins, const boost::json::object& descriptor) {
    const auto file = std::filesystem::canonical(plugins / "p.so");
    struct stat st {};
    REQUIRE(::stat(file.c_str(), &st) == 0);
    const boost::json::array identity{
        static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
        static_cast<std::int64_t>(st.st_size),
        static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
        static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
    boost::json::object root = real;
    root["entries"] = boost::json::object{
        {file.string(), boost::json::object{{"identity", identity}, {"descriptor", descriptor}}}};
    sbx::testing::write_file(cache, boost::json::serialize(root));
  }
  // A probe program that prints `descriptor` as its answer for any file (a forged probe line).
  std::filesystem::path fake_probe(const boost::json::object& descriptor) const {
    const auto path = dir.path / ("fake-probe" + std::to_string(made));
    sbx::testing::write_file(
        path, "#!/bin/sh\ncat <<'EOF'\n" +
                  boost::json::serialize(boost::json::object{{"descriptor", descriptor}}) +
                  "\nEOF\n");
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    return path;
  }
};

void spoof_abi_and_id(boost::json::object& d) {
  d["abi_version"] = boost::json::array{7, 0, 0};
  d["providers"].as_array()[0].as_object()["id"] = "Spoof Id/../x";
}
void spoof_id_and_version(boost::json::object& d) {
  d["version"] = "6.6.6";
  d["providers"].as_array()[0].as_object()["id"] = "spoof";
}

}  // namespace

TEST_CASE("a forged probe cache entry: invalid ones are probed again, others refused at load") {
  ForgeFixture f;
  // ABI 7.0 and an id no plugin may have: the entry is not believed; the file is probed again.
  {
    const auto plugins = f.fresh();
    f.write_cache(plugins, f.forged(spoof_abi_and_id));
    sbx::Host host(f.options(plugins));
    const sbx::PluginInfo info = listed(host.plugins(), "p.so");
    CHECK(info.ok());
    CHECK(info.abi_version.major == SBX_ABI_VERSION_MAJOR);
    REQUIRE(info.providers.size() == 1);
    CHECK(info.providers[0].id == "test_processes");
  }
  // A well-formed lie: listed as the cache says, but the load reads the descriptor itself.
  const auto plugins = f.fresh();
  f.write_cache(plugins, f.forged(spoof_id_and_version));
  sbx::Host host(f.options(plugins));
  CHECK(listed(host.plugins(), "p.so").providers.at(0).id == "spoof");
  const auto e = sbx::testing::error_of<sbx::PluginLoadError>([&] { host.provider("spoof"); });
  CHECK(contains(e.what(),
                 "p.so: its descriptor, read in this process, is not what the plugin "
                 "probe reported (test_processes 6.6.6 (ABI 1."));
  CHECK(contains(e.what(), "provider ids: spoof) reported"));
  CHECK(contains(e.what(), "provider ids: test_processes) loaded"));
}

TEST_CASE("a forged probe line: invalid ones list the file as broken, others are refused at load") {
  ForgeFixture f;
  {
    const auto plugins = f.fresh();
    sbx::Host::Options options = f.options(plugins);
    options.plugin_cache = "off";
    options.probe_program = f.fake_probe(f.forged(spoof_abi_and_id));
    sbx::Host host(std::move(options));
    const sbx::PluginInfo info = listed(host.plugins(), "p.so");
    CHECK(contains(info.error,
                   "the plugin probe gave an unreadable answer: descriptor JSON: "
                   "plugin ABI version 7.0 is not compatible"));
    CHECK(info.providers.empty());
  }
  const auto plugins = f.fresh();
  sbx::Host::Options options = f.options(plugins);
  options.plugin_cache = "off";
  options.probe_program = f.fake_probe(f.forged(spoof_id_and_version));
  sbx::Host host(std::move(options));
  CHECK(listed(host.plugins(), "p.so").providers.at(0).id == "spoof");
  const auto e = sbx::testing::error_of<sbx::PluginLoadError>([&] { host.provider("spoof"); });
  CHECK(contains(e.what(), "is not what the plugin probe reported"));
}

namespace {

// Whether process `pid` is alive (not gone, not a zombie).
bool alive(int pid) {
  const std::string stat = sbx::testing::read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

// The processes whose command line mentions `text`.
std::vector<int> processes_naming(const std::string& text) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = sbx::testing::read_file(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(text) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

std::vector<int> recorded_pids(const std::filesystem::path& record) {
  std::istringstream in(sbx::testing::read_file(record));
  std::vector<int> out;
  for (int pid; in >> pid;)
    out.push_back(pid);
  return out;
}

}  // namespace

TEST_CASE("hung plugin files: probed in parallel, remembered per file version, no probe left") {
  sbx::testing::TempDir dir("sbx-hung-probes");
  const auto plugins = dir.path / "plugins";
  const auto record = dir.path / "loads";  // hangs_on_load writes its pid here when loaded
  std::filesystem::create_directory(plugins);
  for (const char* name : {"h1.so", "h2.so", "h3.so"}) {
    std::filesystem::copy_file(std::filesystem::path(SBX_HANG_PLUGIN_DIR) / "hangs_on_load.so",
                               plugins / name);
  }
  REQUIRE(::setenv("SBX_TEST_HANG_RECORD", record.c_str(), 1) == 0);
  struct Unset {
    ~Unset() { ::unsetenv("SBX_TEST_HANG_RECORD"); }
  } unset;
  sbx::Host::Options options;
  options.plugin_dirs = {plugins};
  options.use_default_plugin_dirs = false;
  options.plugin_cache = dir.path / "cache.json";
  options.probe_timeout_s = 5;
  {
    sbx::Host host(options);
    auto listing = std::async(std::launch::async, [&] { return host.plugins(); });
    // All three probes run at once: when the third has loaded its file, the first two still hang
    // (probed one at a time, each would have been killed and reaped before the next started).
    REQUIRE(sbx::testing::eventually([&] { return recorded_pids(record).size() == 3; }));
    for (int pid : recorded_pids(record)) {
      CAPTURE(pid);
      CHECK(alive(pid));
    }
    const auto first = listing.get();
    for (const char* name : {"h1.so", "h2.so", "h3.so"}) {
      CHECK(contains(error_of(first, name), "loading it did not finish within 5 s"));
    }
  }
  // Killed with their process group and reaped: no probe of these files is left.
  CHECK(processes_naming(plugins.string()).empty());
  for (int pid : recorded_pids(record)) {
    CAPTURE(pid);
    CHECK_FALSE(alive(pid));
  }
  // The next command (a new process: nothing in memory) is answered from the timeouts the cache
  // remembers (5 s: its own probes would say 10 s): no probe starts.
  FILE* pipe = ::popen(
      ("SBX_PLUGIN_CACHE='" + options.plugin_cache.string() + "' SBX_PLUGIN_PATH= " + SBX_CLI +
       " --plugin-dir '" + plugins.string() + "' plugins 2>&1")
          .c_str(),
      "r");
  REQUIRE(pipe);
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;)
    out.append(buffer, n);
  ::pclose(pipe);
  CAPTURE(out);
  CHECK(contains(out, "h1.so"));
  CHECK(contains(out, "loading it did not finish within 5 s"));
  CHECK_FALSE(contains(out, "within 10 s"));
  CHECK(recorded_pids(record).size() == 3);
  // Another version of a file (touched: a new modification time) is probed again.
  std::filesystem::last_write_time(plugins / "h1.so",
                                   std::filesystem::file_time_type::clock::now());
  sbx::Host touched(options);
  CHECK(contains(error_of(touched.plugins(), "h1.so"), "loading it did not finish within 5 s"));
  CHECK(recorded_pids(record).size() == 4);
}
