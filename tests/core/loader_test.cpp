// The loader refuses files that are not usable plugins, with a message naming the file (and both
// versions for an ABI mismatch), while the other plugins keep working.

#include <doctest/doctest.h>

#include <sbx/sbx.hpp>

#include "../common/test_helpers.hpp"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

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
  CHECK(contains(wrong_abi, "host's ABI version 1.1"));

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
  sbx::Host::Options options;
  options.use_default_plugin_dirs = false;
  options.config = sbx::Config::parse(std::string(R"({"providers": {"x": {"plugin": ")") +
                                      SBX_BAD_PLUGIN_DIR + R"(/init_fails.so#x"}}})");
  sbx::Host host(std::move(options));
  const auto e = sbx::testing::error_of<sbx::PluginLoadError>([&] { host.provider("x"); });
  CHECK(contains(e.what(), "init_fails.so"));
  CHECK(contains(e.what(), "init failed: backend library missing (injected)"));
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
    CHECK(contains(e.what(), "1.1"));
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
