// local_docker's sbx.renew/1 against the real daemon: the expiry file inside the container moves
// the TTL of the keep-alive, of the entrypoint watchdog and of the reaper, also while the sandbox
// is paused; renew is refused for a sandbox without a TTL, for a past expiry and for a sandbox
// that is gone. The reaper's logic runs here as its own program (build/plugins/local_docker/
// local_docker_reaper --once), besides the sbx-reaper container the provider keeps.

#include "support.hpp"

#include <chrono>
#include <string>
#include <thread>

using namespace std::chrono_literals;
using ldtest::docker;
using ldtest::provider;
using Wall = std::chrono::system_clock;

namespace {

int64_t unix_s(Wall::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

void sleep_until(Wall::time_point t) {
  std::this_thread::sleep_until(t);
}

std::string label(const std::string& container, const std::string& key) {
  const auto inspect = docker().inspect(container);
  REQUIRE(inspect);
  const auto& labels = inspect->at("Config").at("Labels").as_object();
  const auto* value = labels.if_contains(key);
  return value ? std::string(value->as_string()) : "";
}

std::string state(const std::string& container) {
  const auto inspect = docker().inspect(container);
  return inspect ? std::string(inspect->at("State").at("Status").as_string()) : "gone";
}

// One sweep of the reaper program against the daemon; its exit status.
int run_reaper_once() {
  ldtest::Child reaper({.argv = {SBX_LD_REAPER, "--socket", ldtest::kDockerSocket, "--once"},
                        .stderr_path = "/tmp/sbx-renew-test-reaper.log"});
  const auto status = reaper.wait_for(60s);
  REQUIRE(status);
  return *status;
}

}  // namespace

TEST_CASE("renew moves the TTL past the original one; the sandbox then ends by itself") {
  auto spec = ldtest::spec();
  spec.ttl_s = 3;
  sbx::Sandbox box = provider().create(spec);
  const auto created = Wall::now();
  const std::string id = box.id();
  CHECK(label(id, "sbx.expiry_file") == "/.sbx/ttl/expires_at");
  const std::string label_expiry = label(id, "sbx.expires_at");
  CHECK(box.exec("cat /.sbx/ttl/expires_at").stdout_text == label_expiry + "\n");

  const auto asked = Wall::now() + 20s;
  const auto got = box.renew_async(asked).get();
  CHECK(got >= asked);
  CHECK(got - asked < 1s);  // whole seconds, rounded up
  const int64_t renewed = unix_s(got);
  // The file holds the new expiry; the label keeps the old one (labels cannot change).
  CHECK(box.exec("cat /.sbx/ttl/expires_at").stdout_text == std::to_string(renewed) + "\n");
  CHECK(label(id, "sbx.expires_at") == label_expiry);

  // Past the original TTL (and the reaper's interval after it): still running, execs work.
  sleep_until(created + 8s);
  CHECK(box.status() == sbx::SandboxStatus::running);
  CHECK(box.exec("echo alive").stdout_text == "alive\n");

  // A second host finds the expiry in force (the file, not the label): a command running when it
  // passes ends with NOT_FOUND naming it. The first handle is let go: no host process ends it.
  const std::string descriptor = box.serialize();
  box.detach();
  sbx::Sandbox again = provider().connect(descriptor);
  try {
    const auto r = again.exec("sleep 60", {.timeout_s = 90});
    FAIL("a command the TTL cut short has no result, got " << r.return_code);
  } catch (const sbx::NotFoundError& e) {
    CHECK_MESSAGE(std::string(e.what()).find("has expired (its TTL ended at " +
                                             std::to_string(renewed)) != std::string::npos,
                  e.what());
  }
  const auto ended = Wall::now();
  CHECK(ended >= got - 1s);  // not before the new expiry (a second of rounding)
  CHECK(ended < got + 10s);  // ... and soon after it
  CHECK(docker().wait_gone(id, 20s));
}

TEST_CASE("an earlier expiry ends a running sandbox within the loop's longest sleep (20 s)") {
  sbx::Sandbox box = provider().create(ldtest::spec());  // TTL 15 min
  const std::string id = box.id();
  const auto got = box.renew_async(Wall::now() + 3s).get();
  box.detach();
  sleep_until(got - 1s);
  CHECK(state(id) == "running");  // not before the new expiry
  CHECK(docker().wait_gone(id, 30s));
  CHECK(Wall::now() < got + 24s);  // 20 s of sleep at most, then the removal
}

TEST_CASE("renew while paused: the reaper reads the expiry file, then removes it at the new time") {
  auto spec = ldtest::spec();
  spec.ttl_s = 3;
  sbx::Sandbox box = provider().create(spec);
  const auto created = Wall::now();
  const std::string id = box.id();
  box.pause();
  // Written through the archive API, which works on a frozen container.
  const auto got = box.renew_async(Wall::now() + 12s).get();
  CHECK(state(id) == "paused");
  CHECK_THROWS_AS(box.exec("true"), sbx::FailedPreconditionError);  // still paused

  // The label's expiry has passed; the keep-alive is frozen. The reaper reads the file and leaves
  // the container alone (the sbx-reaper container, and a sweep run here).
  sleep_until(created + 6s);
  CHECK(run_reaper_once() == 0);
  CHECK(state(id) == "paused");
  box.resume();
  CHECK(box.exec("cat /.sbx/ttl/expires_at").stdout_text == std::to_string(unix_s(got)) + "\n");
  box.pause();

  // Past the new expiry the reaper removes it, paused as it is.
  sleep_until(got + 1s);
  CHECK(run_reaper_once() == 0);
  CHECK(docker().wait_gone(id, 10s));
  CHECK(box.status() == sbx::SandboxStatus::stopped);
  CHECK_THROWS_AS(box.renew(60), sbx::NotFoundError);
}

TEST_CASE("the reaper still removes a sandbox whose label passed and which was not renewed") {
  auto spec = ldtest::spec();
  sbx::Sandbox box;
  // A short TTL, so that the label passes soon; a busy machine can take longer than that to
  // create the sandbox, which then ends before it was ready (a create error): twice as long again.
  int ttl_s = 2;
  for (;;) {
    spec.ttl_s = ttl_s;
    try {
      box = provider().create(spec);
      break;
    } catch (const sbx::CreateError& e) {
      REQUIRE_MESSAGE(ttl_s < 64, e.what());
      CHECK_MESSAGE(std::string(e.what()).find("before it was ready") != std::string::npos,
                    e.what());
      ttl_s *= 2;
    }
  }
  const auto created = Wall::now();
  const std::string id = box.id();
  box.pause();  // the keep-alive cannot end it: only the reaper can
  sleep_until(created + std::chrono::seconds(ttl_s + 1));
  CHECK(run_reaper_once() == 0);
  CHECK(docker().wait_gone(id, 10s));
}

TEST_CASE(
    "entrypoint with a TTL: renew keeps the watchdog from ending it, then it ends at the new "
    "time") {
  auto spec = ldtest::spec();
  spec.ttl_s = 3;
  spec.entrypoint = {"sh", "-c", "echo started > /tmp/ep; exec sleep 600"};
  sbx::Sandbox box = provider().create(spec);
  const auto created = Wall::now();
  const std::string id = box.id();
  const auto got = box.renew(15);
  sleep_until(created + 7s);
  CHECK(box.exec("cat /tmp/ep").stdout_text == "started\n");
  CHECK(box.exec("ps -o args | grep -c '^sleep 600'").stdout_text == "1\n");
  box.detach();
  sleep_until(got - 2s);
  CHECK(state(id) == "running");
  // SIGTERM at the new expiry ends `sleep` at once; the container removes itself.
  CHECK(docker().wait_gone(id, 15s));
  CHECK(Wall::now() >= got - 1s);
}

TEST_CASE("renew: no TTL, a past expiry, a read-only root, a sandbox that is gone") {
  SUBCASE("a sandbox created without a TTL has nothing to renew") {
    auto spec = ldtest::spec();
    spec.ttl_s.reset();
    sbx::Sandbox box = provider().create(spec);
    CHECK(label(box.id(), "sbx.expiry_file").empty());
    CHECK_THROWS_AS(box.renew(60), sbx::FailedPreconditionError);
    CHECK(box.status() == sbx::SandboxStatus::running);
    box.close();
  }
  SUBCASE("an expiry in the past is INVALID_ARGUMENT and changes nothing") {
    sbx::Sandbox box = provider().create(ldtest::spec());
    const std::string before = box.exec("cat /.sbx/ttl/expires_at").stdout_text;
    CHECK_THROWS_AS(box.renew_async(Wall::now() - 60s).get(), sbx::InvalidArgumentError);
    CHECK_THROWS_AS(box.renew_async(Wall::now() - 1ms).get(), sbx::InvalidArgumentError);
    CHECK(box.exec("cat /.sbx/ttl/expires_at").stdout_text == before);
    box.close();
  }
  SUBCASE("a read-only root file system renews too: the expiry file is the host's mount") {
    sbx::Host::Options options;
    options.config = sbx::Config::parse(
        R"({"providers": {"ro": {"plugin": "local_docker", "config": {"create": {"read_only": true}}}}})",
        "test");
    options.labels[ldtest::kSuiteLabel] = ldtest::kSuiteValue;
    sbx::Host host(options);
    sbx::Sandbox box = host.provider("ro").create(ldtest::spec());
    CHECK(label(box.id(), "sbx.expiry_file") == "/.sbx/ttl/expires_at");
    CHECK_FALSE(label(box.id(), "sbx.expires_at").empty());
    const auto got = box.renew_async(Wall::now() + 90s).get();
    CHECK(box.exec("cat /.sbx/ttl/expires_at").stdout_text == std::to_string(unix_s(got)) + "\n");
    box.close();
  }
  SUBCASE("a sandbox removed behind the host's back is NOT_FOUND") {
    sbx::Sandbox box = provider().create(ldtest::spec());
    docker().remove(box.id());
    CHECK_THROWS_AS(box.renew(60), sbx::NotFoundError);
    box.close();
  }
}
