// Cases: create, close, a sandbox that is gone, TTL expiry, labels with list and reap.

#include "suite.hpp"

#include <sbx/core/plugin_checks.hpp>

#include <random>

namespace sbx::conformance {
namespace {

using namespace std::chrono_literals;

void create_ready(T& t) {
  Sandbox box = t.create();
  CHECK(!box.id().empty(), "create must give the sandbox a non-empty id");
  CHECK_EQ(box.status(), SandboxStatus::running,
           "a sandbox must be running when create completes (complete create only once it is "
           "ready)");
  // Ready means commands run right away, no retry needed.
  const auto r = box.exec("echo ready");
  CHECK_EQ(r.return_code, 0,
           "the first command after create must run at once: create completes when the sandbox "
           "is ready, not before");
  CHECK_EQ(r.stdout_text, "ready\n", "the first command after create must give its output");
  box.close();
}

// The plugin's own close, status after it and second close (the host answers those itself once
// it has closed a sandbox, so they are reached with plugin_checks::close_behind_host).
void close_twice(T& t) {
  Sandbox box = t.create();
  CHECK_EQ(box.status(), SandboxStatus::running, "a new sandbox must be running");
  plugin_checks::close_behind_host(box);
  CHECK_EQ(box.status(), SandboxStatus::stopped,
           "after the plugin's close, status must be SBX_SANDBOX_STOPPED (a status, not an "
           "error)");
  CHECK_NOTHROW(plugin_checks::close_behind_host(box),
                "closing a sandbox a second time must succeed (closing what is gone is not an "
                "error)");
  CHECK_NOTHROW(box.close(), "closing a sandbox a third time must succeed");
}

void gone(T& t) {
  Sandbox box = t.create();
  box.upload_bytes("here\n", "/work/x");
  plugin_checks::close_behind_host(box);  // the host still thinks it is open
  CHECK(!box.closed(), "the host must still hold the sandbox open (a suite error otherwise)");
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError,
                  "an exec on a sandbox that is gone must fail with NOT_FOUND: check that the "
                  "sandbox still exists in every call");
  CHECK_THROWS_AS(box.upload_bytes("x", "/work/y"), NotFoundError,
                  "an upload to a sandbox that is gone must fail with NOT_FOUND");
  CHECK_THROWS_AS(box.download_bytes("/work/x"), NotFoundError,
                  "a download from a sandbox that is gone must fail with NOT_FOUND");
  CHECK_EQ(box.status(), SandboxStatus::stopped,
           "the status of a sandbox that is gone must be SBX_SANDBOX_STOPPED, not an error");
  CHECK_NOTHROW(box.close(), "closing a sandbox that is gone must succeed");
}

void ttl_expiry(T& t) {
  Sandbox box = t.create_with_ttl(3);
  CHECK_EQ(box.exec("echo alive").stdout_text, "alive\n",
           "a sandbox with ttl_s 3 must run commands until it expires");
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
  REQUIRE(gone,
          "a sandbox created with ttl_s 3 still reports running 33 s later: end it at its TTL "
          "in the backend (even with no host process left), or refuse a TTL at create with "
          "UNIMPLEMENTED");
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError,
                  "an exec on a sandbox its TTL ended must fail with NOT_FOUND");
  CHECK_NOTHROW(box.close(), "closing a sandbox its TTL ended must succeed");
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
  REQUIRE(host_labels.count("sbx.run") == 1, "the host has no sbx.run label (a host error)");
  StringMap selector{{"sbx.conformance.nonce", nonce}, {"sbx.run", host_labels.at("sbx.run")}};

  const auto listed = t.provider().list(selector);
  REQUIRE(listed.size() == 1u,
          "list with a selector of metadata and host labels must find exactly the one sandbox "
          "that has them; it found " +
              std::to_string(listed.size()) +
              ": stamp every host label and metadata entry on the sandbox and match all of a "
              "selector's pairs");
  CHECK_EQ(listed[0].id, box.id(), "list must return the sandbox's own id");
  for (const auto& [k, v] : host_labels) {
    const auto it = listed[0].labels.find(k);
    CHECK((it != listed[0].labels.end() && it->second == v),
          "list must report every host label on the sandbox: " + k + "=" + v + " is missing");
  }
  CHECK(
      (listed[0].labels.count("sbx.test") == 1 && listed[0].labels.at("sbx.test") == "conformance"),
      "list must report the spec's metadata as labels: sbx.test=conformance is missing");
  // The other sandbox is listed under the host's run label only.
  bool found_other = false;
  for (const auto& s : t.provider().list({{"sbx.run", host_labels.at("sbx.run")}}))
    found_other = found_other || s.id == other.id();
  CHECK(found_other,
        "list by the host's sbx.run label alone must find every sandbox of this run, also one "
        "without the nonce");

  const auto reaped = t.provider().reap(selector);
  REQUIRE(reaped.size() == 1u,
          "reap with a selector must remove exactly the one sandbox that "
          "matches it; it reported " +
              std::to_string(reaped.size()));
  CHECK_EQ(reaped[0].id, box.id(), "reap must report the id of the sandbox it removed");
  CHECK(t.provider().list(selector).empty(), "a reaped sandbox must no longer be listed");
  CHECK_EQ(box.status(), SandboxStatus::stopped,
           "a reaped sandbox's status must be SBX_SANDBOX_STOPPED through its handle");
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError,
                  "an exec on a reaped sandbox must fail with NOT_FOUND");
  CHECK_EQ(other.exec("echo still").stdout_text, "still\n",
           "reap must remove only the sandboxes that match: another one stopped working");
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
