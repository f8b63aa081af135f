// Cases: create, close, a sandbox that is gone, TTL expiry, labels with list and reap.

#include "suite.hpp"

#include <sbx/core/plugin_checks.hpp>

#include <random>

namespace sbx::conformance {
namespace {

using namespace std::chrono_literals;

void create_ready(T& t) {
  Sandbox box = t.create();
  CHECK(!box.id().empty());
  CHECK_EQ(box.status(), SandboxStatus::running);
  // Ready means commands run right away, no retry needed.
  const auto r = box.exec("echo ready");
  CHECK_EQ(r.return_code, 0);
  CHECK_EQ(r.stdout_text, "ready\n");
  box.close();
}

// The plugin's own close, status after it and second close (the host answers those itself once
// it has closed a sandbox, so they are reached with plugin_checks::close_behind_host).
void close_twice(T& t) {
  Sandbox box = t.create();
  CHECK_EQ(box.status(), SandboxStatus::running);
  plugin_checks::close_behind_host(box);
  CHECK_EQ(box.status(), SandboxStatus::stopped);
  CHECK_NOTHROW(plugin_checks::close_behind_host(box));  // the plugin's second close
  CHECK_NOTHROW(box.close());                            // and its third, through the host
}

void gone(T& t) {
  Sandbox box = t.create();
  box.upload_bytes("here\n", "/work/x");
  plugin_checks::close_behind_host(box);  // the host still thinks it is open
  CHECK(!box.closed());
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError);
  CHECK_THROWS_AS(box.upload_bytes("x", "/work/y"), NotFoundError);
  CHECK_THROWS_AS(box.download_bytes("/work/x"), NotFoundError);
  CHECK_EQ(box.status(), SandboxStatus::stopped);
  CHECK_NOTHROW(box.close());  // closing what is gone is success
}

void ttl_expiry(T& t) {
  auto spec = t.spec();
  spec.ttl_s = 3;
  Sandbox box;
  try {
    box = t.provider().create(spec);
  } catch (const Error& e) {
    if (e.status() == SBX_STATUS_UNIMPLEMENTED) {
      t.not_offered("the provider refuses a TTL (UNIMPLEMENTED at create): " +
                    std::string(e.what()));
    }
    throw;
  }
  CHECK_EQ(box.exec("echo alive").stdout_text, "alive\n");
  // Gone by TTL + 30 s: status stopped (or the sandbox no longer found by status).
  const bool gone = wait_until(
      [&] {
        try {
          return box.status() == SandboxStatus::stopped;
        } catch (const NotFoundError&) {
          return true;
        }
      },
      33s);
  REQUIRE(gone);
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError);
  CHECK_NOTHROW(box.close());
}

void list_reap(T& t) {
  t.needs_extension("sbx.list-reap/1");
  // A label no other sandbox has: this host's labels plus a nonce of this case.
  const std::string nonce =
      std::to_string(std::random_device{}()) + "-" +
      std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  auto spec = t.spec();
  spec.metadata["sbx.conformance.nonce"] = nonce;
  Sandbox box = t.create(spec);
  Sandbox other = t.create();  // not selected
  const StringMap& host_labels = t.host().labels();
  REQUIRE(host_labels.count("sbx.run") == 1);
  StringMap selector{{"sbx.conformance.nonce", nonce}, {"sbx.run", host_labels.at("sbx.run")}};

  const auto listed = t.provider().list(selector);
  REQUIRE(listed.size() == 1u);
  CHECK_EQ(listed[0].id, box.id());
  for (const auto& [k, v] : host_labels) {
    const auto it = listed[0].labels.find(k);
    CHECK(it != listed[0].labels.end() && it->second == v);  // every host label is stamped
  }
  CHECK(listed[0].labels.count("sbx.test") == 1 &&
        listed[0].labels.at("sbx.test") == "conformance");
  // The other sandbox is listed under the host's run label only.
  bool found_other = false;
  for (const auto& s : t.provider().list({{"sbx.run", host_labels.at("sbx.run")}}))
    found_other = found_other || s.id == other.id();
  CHECK(found_other);

  const auto reaped = t.provider().reap(selector);
  REQUIRE(reaped.size() == 1u);
  CHECK_EQ(reaped[0].id, box.id());
  CHECK(t.provider().list(selector).empty());
  CHECK_EQ(box.status(), SandboxStatus::stopped);  // reaped behind the handle's back
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError);
  CHECK_EQ(other.exec("echo still").stdout_text, "still\n");  // reap took only what matched
}

}  // namespace

void add_lifecycle_cases(std::vector<Case>& cases) {
  cases.push_back({{"lifecycle.create",
                    "create returns a ready sandbox: status running, a command runs at once", ""},
                   create_ready});
  cases.push_back({{"lifecycle.close",
                    "the plugin's close ends the sandbox: its status is then stopped, and closing "
                    "again succeeds",
                    ""},
                   close_twice});
  cases.push_back({{"lifecycle.gone",
                    "a sandbox gone behind the host's back: exec, upload and download are "
                    "NotFoundError, status is stopped, close succeeds",
                    ""},
                   gone});
  cases.push_back({{"lifecycle.ttl",
                    "a sandbox with ttl_s 3 is gone (status stopped, exec NotFoundError) within "
                    "TTL + 30 s",
                    "create with a ttl_s fails with UNIMPLEMENTED"},
                   ttl_expiry});
  cases.push_back({{"labels.list-reap",
                    "host labels and metadata are stamped: list finds the sandbox by them, reap "
                    "removes it and only it",
                    "sbx.list-reap/1 not in the provider's extensions"},
                   list_reap});
}

}  // namespace sbx::conformance
