// A host that survives its plugins: the misbehave plugin (tests/plugins/c/misbehave.c, plain C)
// breaks the ABI's promises on purpose, one way per config. Each case checks that the host reports
// it, keeps working, and never reads past a struct or touches freed memory (which the ASan build
// would catch), and that every wait is bounded by the host's deadlines.

#include <doctest/doctest.h>

#include <sbx/sbx.hpp>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "../common/test_helpers.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The host's log lines, recorded for the whole process: the host's loggers are children of "sbx"
// and share its sinks. Never destroyed (loggers made later keep a reference to the sink).
spdlog::sinks::ringbuffer_sink_mt& log_lines() {
  static auto* const sink = [] {
    auto* s = new std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt>(
        std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256));
    auto base = spdlog::get("sbx");
    if (!base) {
      base = std::make_shared<spdlog::logger>("sbx");
      spdlog::register_logger(base);
    }
    base->sinks().push_back(*s);
    base->set_level(spdlog::level::debug);
    return s;
  }();
  return **sink;
}

bool logged(const std::string& part) {
  for (const auto& line : log_lines().last_formatted()) {
    if (line.find(part) != std::string::npos) return true;
  }
  return false;
}

// Waits (bounded) for a line the host or a plugin logs on another thread.
bool wait_logged(const std::string& part, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!logged(part)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A host whose only provider is misbehave in `mode`, with short deadlines so that tests of
// abandonment take well under a second.
sbx::Host host_for(const std::string& mode, const std::string& extra = "") {
  log_lines();
  sbx::Host::Options options;
  options.plugin_dirs = {SBX_C_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  options.config = sbx::Config::parse(R"({"providers": {"m": {"plugin": "misbehave", "config":
      {"mode": ")" + mode + "\"" + extra +
                                      "}}}}");
  options.deadlines.grace_s = 0.3;
  options.deadlines.cancel_grace_s = 0.3;
  options.deadlines.call_s = 0.5;
  options.deadlines.create_s = 0.5;
  options.deadlines.exec_s = 0.5;
  options.deadlines.transfer_idle_s = 0.5;
  return sbx::Host(std::move(options));
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

TEST_CASE("a completion called twice is reported and ignored, never a use-after-free") {
  sbx::Host host = host_for("twice");
  sbx::Provider p = host.provider("m");
  sbx::Sandbox box = p.create({});  // the second sandbox of the second completion is closed
  const sbx::ExecResult r = box.exec("anything");
  CHECK(r.return_code == 0);  // the first completion counts
  CHECK(r.stdout_text == "misbehaving\n");
  CHECK(box.status() == sbx::SandboxStatus::running);
  box.upload_bytes("x", "/x");
  box.close();
  CHECK(logged("provider 'm' (plugin "));
  CHECK(logged("called on_complete of an operation (exec) that had already completed"));
  CHECK(logged("called on_complete of an operation (create) that had already completed"));
}

TEST_CASE("output after completion is reported and not delivered") {
  sbx::Host host = host_for("output_after");
  sbx::Sandbox box = host.provider("m").create({});
  std::string seen;
  sbx::ExecOptions options;
  options.on_output = [&](sbx::OutputStream, std::string_view bytes) { seen.append(bytes); };
  CHECK(box.exec("anything", std::move(options)).return_code == 0);
  CHECK(seen.empty());
  CHECK(logged("called on_output of an operation (exec) that had already completed"));
}

TEST_CASE("a create that never completes is abandoned at the host's deadline") {
  sbx::Host host = host_for("never_create");
  const auto start = Clock::now();
  const auto e = sbx::testing::error_of<sbx::CreateError>([&] { host.provider("m").create({}); });
  CHECK(e.status() == SBX_STATUS_TIMEOUT);  // a CreateError, as every failure of create
  CHECK(seconds_since(start) < 5);
  CHECK(contains(e.what(), "provider 'm' (plugin "));
  CHECK(contains(e.what(), "did not complete the create within 0.5 s"));
  CHECK(contains(e.what(), "nor within 0.3 s of being cancelled; the host abandoned it"));
}

TEST_CASE(
    "calls that never complete are abandoned: exec after its timeout plus the grace, the "
    "others at their deadline") {
  sbx::Host host = host_for("never");
  sbx::Sandbox box = host.provider("m").create({});
  auto started = Clock::now();
  auto e = sbx::testing::error_of<sbx::TimeoutError>([&] { box.exec("x", {.timeout_s = 0.2}); });
  CHECK(seconds_since(started) >= 0.5);  // 0.2 s timeout + 0.3 s grace, then the cancel grace
  CHECK(seconds_since(started) < 5);
  CHECK(contains(e.what(), "did not complete the exec within 0.5 s (its timeout plus"));

  started = Clock::now();
  e = sbx::testing::error_of<sbx::TimeoutError>([&] { box.exec("x"); });  // deadlines.exec_s
  CHECK(seconds_since(started) < 5);
  CHECK(sbx::testing::error_of<sbx::TimeoutError>([&] { box.status(); }).status() ==
        SBX_STATUS_TIMEOUT);
  CHECK(sbx::testing::error_of<sbx::TimeoutError>([&] { box.upload_bytes("x", "/x"); }).status() ==
        SBX_STATUS_TIMEOUT);
  // A download that never moves a byte: its temporary file is gone once it is abandoned.
  sbx::testing::TempDir dir;
  const auto target = dir.path / "sub" / "out.txt";
  sbx::testing::error_of<sbx::TimeoutError>([&] { box.download("/x", target); });
  CHECK(std::filesystem::is_empty(dir.path));  // no temporary file, no directory it made
  // A close the plugin never confirms ends too, and a destructor does not wait again.
  started = Clock::now();
  sbx::testing::error_of<sbx::TimeoutError>([&] { box.close(); });
  CHECK(box.closed());
  CHECK(seconds_since(started) < 5);
}

TEST_CASE("a cancel the plugin ignores is bounded by the cancel grace") {
  sbx::Host host = host_for("never");
  sbx::Sandbox box = host.provider("m").create({});
  auto op = box.exec_async("x", {.timeout_s = 60});
  std::this_thread::sleep_for(50ms);
  const auto start = Clock::now();
  op.cancel();
  const auto e = sbx::testing::error_of<sbx::CancelledError>([&] { op.get(); });
  CHECK(seconds_since(start) < 5);
  CHECK(contains(e.what(), "did not end the exec within 0.3 s of being cancelled"));
  box.detach();  // its close would never complete either
}

TEST_CASE(
    "a late completion after the host abandoned the operation is dropped, and a sandbox "
    "created late is closed") {
  log_lines();
  sbx::Host::Options options;
  options.plugin_dirs = {SBX_C_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  options.config = sbx::Config::parse(
      R"({"providers": {"m": {"plugin": "misbehave", "config": {"mode": "late"}}}})");
  options.deadlines.cancel_grace_s = 0.05;
  sbx::Host host(std::move(options));
  auto op = host.provider("m").create_async({});
  op.cancel();  // ignored by the plugin, which completes after 300 ms anyway
  const auto e = sbx::testing::error_of<sbx::CancelledError>([&] { op.get(); });
  CHECK(contains(e.what(), "abandoned"));
  // The late sandbox arrives (after 300 ms) and is closed (late too).
  CHECK(wait_logged("completed the create after the host had abandoned it", 5000ms));
}

TEST_CASE(
    "a sandbox whose last reference drops inside the plugin's own callback is released on a host "
    "thread") {
  // The exec's context holds the last reference when the plugin completes it from its thread: a
  // plugin whose sandbox joins that thread on release would join itself if released there.
  sbx::Host host = host_for("late");
  sbx::Sandbox box = host.provider("m").create({});
  const std::string id = box.id();
  auto op = box.exec_async("x");
  box.detach();
  CHECK(op.get().return_code == 0);
  REQUIRE(wait_logged("misbehave: sandbox " + id + " released", 5000ms));
  CHECK(logged("misbehave: sandbox " + id + " released outside its callbacks"));
}

TEST_CASE("structs smaller than ABI 1.0 are refused before a field is read") {
  SUBCASE("a created sandbox") {
    sbx::Host host = host_for("short_sandbox");
    const auto e = sbx::testing::error_of<sbx::CreateError>([&] { host.provider("m").create({}); });
    CHECK(e.status() == SBX_STATUS_INTERNAL);
    CHECK(contains(e.what(), "whose sbx_sandbox has 8 bytes"));
  }
  SUBCASE("an exec result") {
    sbx::Host host = host_for("short_result");
    sbx::Sandbox box = host.provider("m").create({});
    const auto e = sbx::testing::error_of<sbx::InternalError>([&] { box.exec("x"); });
    CHECK(contains(e.what(), "with an sbx_exec_result of 4 bytes"));
  }
  SUBCASE("an error") {
    sbx::Host host = host_for("short_error");
    sbx::Sandbox box = host.provider("m").create({});
    const auto e = sbx::testing::error_of<sbx::InternalError>([&] { box.exec("x"); });
    CHECK(contains(e.what(), "in an sbx_error of 6 bytes"));
  }
}

TEST_CASE("an operation handle smaller than ABI 1.0 is left alone") {
  sbx::Host host = host_for("short_handle");
  sbx::Sandbox box = host.provider("m").create({});
  CHECK(box.exec_async("x").get().return_code == 0);
  CHECK(logged("returned an sbx_operation handle of 4 bytes"));
}

TEST_CASE("return codes outside 0-255 reach the host API as they are") {
  sbx::Host host = host_for("rc", R"(, "rc": 256)");
  sbx::Sandbox box = host.provider("m").create({});
  CHECK(box.exec("x").return_code == 256);
}

TEST_CASE("a factory that returns OK without a provider is an error that says so") {
  sbx::Host host = host_for("no_provider");
  const auto e = sbx::testing::error_of<sbx::InternalError>([&] { host.provider("m"); });
  CHECK(contains(e.what(), "provider 'm' (misbehave): its factory returned OK but no provider"));
}

TEST_CASE("no host lock is held while a plugin's factory runs") {
  log_lines();
  sbx::Host::Options options;
  options.plugin_dirs = {SBX_C_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  options.config = sbx::Config::parse(R"({"providers": {
      "slow": {"plugin": "misbehave", "config": {"mode": "slow_factory"}},
      "fast": {"plugin": "misbehave", "config": {"mode": "rc"}}}})");
  sbx::Host host(std::move(options));
  std::thread slow([&] { host.provider("slow"); });
  std::this_thread::sleep_for(100ms);  // the slow factory is running
  const auto start = Clock::now();
  host.provider("fast");
  CHECK(seconds_since(start) < 0.5);
  slow.join();
  // A second caller of the slow name waits for the same load instead of loading again.
  CHECK(host.provider("slow").valid());
}

TEST_CASE("sbx.renew/1 through the host: the expiry asked for, as the provider rounds it") {
  sbx::Host host = host_for("renew");
  sbx::Sandbox box = host.provider("m").create({});
  CHECK(host.provider("m").supports("sbx.renew/1"));
  const auto asked = std::chrono::system_clock::now() + std::chrono::seconds(90);
  const auto got = box.renew_async(asked).get();
  CHECK(got >= asked);
  CHECK(got - asked < std::chrono::seconds(1));
  CHECK(std::chrono::duration_cast<std::chrono::milliseconds>(got.time_since_epoch()).count() %
            1000 ==
        0);
  CHECK_THROWS_AS(box.renew(-1), sbx::InvalidArgumentError);
  sbx::Host plain = host_for("rc");
  sbx::Sandbox other = plain.provider("m").create({});
  const auto e = sbx::testing::error_of<sbx::UnimplementedError>([&] { other.renew(60); });
  CHECK(contains(e.what(), "does not support renewing sandboxes (sbx.renew/1)"));
}

TEST_CASE("deadlines must be positive") {
  sbx::Host::Options options;
  options.deadlines.grace_s = 0;
  CHECK_THROWS_AS(sbx::Host(std::move(options)), sbx::InvalidArgumentError);
  CHECK_THROWS_AS(sbx::Config::parse(R"({"deadlines": {"call_s": -1}})"), sbx::ConfigError);
  CHECK(sbx::Config::parse(R"({"deadlines": {"call_s": 7}})").deadlines->call_s == 7);
}
