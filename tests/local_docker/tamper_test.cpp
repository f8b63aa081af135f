// A sandbox's root against its TTL (issue 34, decision 251), against the real daemon, in both
// modes (the agent enforces the expiry, or the keep-alive shell): the expiry in force is the
// host's file, mounted read-only at /.sbx/ttl, and nothing written, deleted, renamed or replaced
// inside changes it. Root acts through the Engine API's own exec (ldtest::Docker::exec), beside
// the plugin. The host lets go of each sandbox (detach): what ends it is the sandbox itself, or
// the reaper, with no host process.

#include "support.hpp"

#include <chrono>
#include <string>

using ldtest::docker;
using ldtest::provider;
using namespace std::chrono_literals;

namespace {

// What root inside tries: rewriting the file, then putting a /.sbx of its own in place.
constexpr const char* kRewrite =
    "echo 9999999999 > /.sbx/ttl/expires_at; rm -f /.sbx/ttl/expires_at; "
    "mv /.sbx /.sbx.old && mkdir -p /.sbx/ttl && echo 9999999999 > /.sbx/ttl/expires_at && "
    "cat /.sbx/ttl/expires_at";

}  // namespace

TEST_CASE("the expiry file rewritten or replaced inside changes nothing: gone at the host's TTL") {
  auto spec = ldtest::spec();
  spec.ttl_s = 4;
  sbx::Sandbox box = provider().create(spec);
  const std::string id = box.id();
  const auto result = docker().exec(id, {"sh", "-c", kRewrite});
  // The host's file cannot be written (a read-only mount); the replacement is the sandbox's own.
  CHECK(result.exit_code == 0);
  CHECK(ldtest::contains(result.output, "Read-only file system"));
  CHECK(ldtest::contains(result.output, "9999999999"));
  box.detach();
  CHECK(docker().wait_gone(id, 60s));
}

TEST_CASE("with an entrypoint, the expiry replaced inside still ends it at the host's TTL") {
  auto spec = ldtest::spec();
  spec.ttl_s = 4;
  spec.entrypoint = std::vector<std::string>{"sleep", "3600"};
  sbx::Sandbox box = provider().create(spec);
  const std::string id = box.id();
  CHECK(docker().exec(id, {"sh", "-c", kRewrite}).exit_code == 0);
  box.detach();
  CHECK(docker().wait_gone(id, 60s));
}

TEST_CASE("paused after tampering: the reaper removes it at the host's expiry") {
  auto spec = ldtest::spec();
  spec.ttl_s = 4;
  sbx::Sandbox box = provider().create(spec);
  const std::string id = box.id();
  CHECK(docker().exec(id, {"sh", "-c", kRewrite}).exit_code == 0);
  box.pause();  // nothing inside runs: the sbx-reaper container must end it
  box.detach();
  CHECK(docker().wait_gone(id, 60s));
}

TEST_CASE("renew still works after tampering, through a handle of another host") {
  auto spec = ldtest::spec();
  spec.ttl_s = 600;
  sbx::Sandbox box = provider().create(spec);
  const std::string id = box.id();
  CHECK(docker().exec(id, {"sh", "-c", kRewrite}).exit_code == 0);
  sbx::Host other(ldtest::options_with("{}"));
  sbx::Sandbox again = ldtest::provider_with(other).connect(box.serialize());
  const auto got = again.renew(5);
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(got.time_since_epoch()).count();
  // The host's file, seen through the mount the sandbox renamed: the renewed expiry.
  const auto seen = docker().exec(id, {"cat", "/.sbx.old/ttl/expires_at"});
  CHECK(seen.output == std::to_string(s) + "\n");
  again.detach();
  box.detach();
  CHECK(docker().wait_gone(id, 60s));
}
