// Cases of the extensions: each runs when the provider lists the extension and is "not offered"
// otherwise (a provider without them is conformant).

#include "suite.hpp"

#include <sbx/core/plugin_checks.hpp>

#include <boost/json.hpp>

namespace sbx::conformance {
namespace {

using namespace std::chrono_literals;

void pause(T& t) {
  t.needs_extension("sbx.pause/1");
  Sandbox box = t.create();
  box.exec("echo before > state");
  box.pause();
  CHECK_EQ(box.status(), SandboxStatus::paused,
           "a paused sandbox's status must be SBX_SANDBOX_PAUSED");
  CHECK_NOTHROW(box.pause(), "pausing a paused sandbox must succeed and change nothing");
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(box.exec("echo no"), FailedPreconditionError,
                  "an exec on a paused sandbox must fail with FAILED_PRECONDITION");
  CHECK_THROWS_AS(box.upload_bytes("x", "/work/x"), FailedPreconditionError,
                  "an upload to a paused sandbox must fail with FAILED_PRECONDITION");
  CHECK_THROWS_AS(box.download_bytes("/work/state"), FailedPreconditionError,
                  "a download from a paused sandbox must fail with FAILED_PRECONDITION");
  CHECK(std::chrono::steady_clock::now() - start < 10s,
        "calls on a paused sandbox must be refused at once, not wait for a resume");
  box.resume();
  CHECK_NOTHROW(box.resume(), "resuming a running sandbox must succeed and change nothing");
  CHECK_EQ(box.status(), SandboxStatus::running, "a resumed sandbox must be running");
  CHECK_EQ(box.exec("cat state").stdout_text, "before\n",
           "a resumed sandbox must run commands and keep its files");
  box.pause();
  CHECK_NOTHROW(plugin_checks::close_behind_host(box), "closing a paused sandbox must succeed");
  CHECK_EQ(box.status(), SandboxStatus::stopped,
           "a paused sandbox that was closed must be SBX_SANDBOX_STOPPED");
  CHECK_THROWS_AS(box.resume(), NotFoundError,
                  "resuming a sandbox that is gone must fail with NOT_FOUND");
  CHECK_THROWS_AS(box.pause(), NotFoundError,
                  "pausing a sandbox that is gone must fail with NOT_FOUND");
}

void connect(T& t) {
  t.needs_extension("sbx.connect/1");
  auto spec = t.spec();
  spec.env["CONFORMANCE_ENV"] = "kept";
  Sandbox box = t.create(spec);
  box.upload_bytes("made by the first host\n", "/work/note.txt");
  const std::string descriptor = box.serialize();
  boost::json::object parsed;
  try {
    parsed = boost::json::parse(descriptor).as_object();
  } catch (const std::exception& e) {
    t.fail("serialize must give a JSON object (sbx/abi/ext/connect.h); it gave " +
           T::show(descriptor));
    throw RequireFailed{};
  }
  CHECK((parsed.contains("format") && parsed.at("format") == "sbx.descriptor/1"),
        "the descriptor must have \"format\": \"sbx.descriptor/1\"");
  CHECK((parsed.contains("provider") &&
         parsed.at("provider") == boost::json::value(t.provider().provider_id())),
        "the descriptor's \"provider\" must be the provider id " + t.provider().provider_id());
  CHECK((parsed.contains("sandbox_id") && parsed.at("sandbox_id") == boost::json::value(box.id())),
        "the descriptor's \"sandbox_id\" must be the sandbox's id " + box.id());

  // A second host (another process would do the same): a working handle, with the workdir.
  auto second = t.second_host();
  Sandbox again = second->provider(t.options().provider).connect(descriptor);
  CHECK_EQ(again.id(), box.id(), "a connected sandbox must have the id it was serialized with");
  CHECK_EQ(again.exec("cat note.txt").stdout_text, "made by the first host\n",
           "a connected sandbox must run in the spec's workdir: give it to the host in "
           "sbx_connected_sandbox.workdir");
  CHECK_EQ(again.exec("echo $CONFORMANCE_ENV").stdout_text, "kept\n",
           "a connected sandbox's commands must get the spec's env");
  again.close();  // closed there: the first handle's calls reach the plugin, which finds it gone
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError,
                  "closed through another host, the sandbox must be gone for the first handle: "
                  "exec must fail with NOT_FOUND");
  CHECK_THROWS_AS(box.download_bytes("/work/note.txt"), NotFoundError,
                  "closed through another host, a download through the first handle must fail "
                  "with NOT_FOUND");
  CHECK_EQ(box.status(), SandboxStatus::stopped,
           "closed through another host, the first handle's status must be "
           "SBX_SANDBOX_STOPPED");
  CHECK_NOTHROW(box.close(), "closing a sandbox another host closed must succeed");

  // A descriptor of a sandbox that is gone, of another provider, or that is damaged.
  CHECK_THROWS_AS(t.provider().connect(descriptor), NotFoundError,
                  "connecting to a sandbox that is gone must fail with NOT_FOUND");
  boost::json::object other = parsed;
  other["provider"] = "some_other_provider";
  CHECK_THROWS_AS(t.provider().connect(boost::json::serialize(other)), InvalidArgumentError,
                  "a descriptor of another provider must be refused with INVALID_ARGUMENT");
  CHECK_THROWS_AS(t.provider().connect(descriptor.substr(0, descriptor.size() / 2)),
                  InvalidArgumentError,
                  "a damaged descriptor (half of it) must be refused with INVALID_ARGUMENT");
}

void renew(T& t) {
  t.needs_extension("sbx.renew/1");
  Sandbox box = t.create();
  const auto asked = std::chrono::system_clock::now() + 3s;
  const auto got = box.renew_async(asked).get();
  CHECK(got >= asked - 1ms,
        "renew must complete with the expiry now in force, never earlier than asked (round up "
        "to your resolution, not down)");
  CHECK(got - asked < 60s,
        "renew must complete with the expiry asked for, rounded up at most to the backend's "
        "resolution; it said " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(got - asked).count()) +
            " s later than asked");
  CHECK_EQ(box.exec("echo alive").stdout_text, "alive\n",
           "a renewed sandbox must run commands until its new expiry");
  // The new, earlier expiry is honoured: gone within it + 30 s.
  REQUIRE(wait_until([&] { return box.status() == SandboxStatus::stopped; },
                     std::chrono::duration_cast<std::chrono::milliseconds>(got - asked) + 33s),
          "a sandbox renewed to expire 3 s from now still runs 30 s after it: make the backend "
          "end it at the new expiry, earlier ones too");
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError,
                  "an exec on a sandbox its renewed expiry ended must fail with NOT_FOUND");

  Sandbox other = t.create();
  // An expiry in the past is refused by the plugin.
  CHECK_THROWS_AS(other.renew_async(std::chrono::system_clock::now() - 60s).get(),
                  InvalidArgumentError,
                  "renew to an expiry in the past must be refused with INVALID_ARGUMENT");
  CHECK_EQ(other.status(), SandboxStatus::running,
           "a refused renew must leave the sandbox running");
  plugin_checks::close_behind_host(other);
  CHECK_THROWS_AS(other.renew(600), NotFoundError,
                  "renewing a sandbox that is gone must fail with NOT_FOUND");
}

}  // namespace

void add_extension_cases(std::vector<Case>& cases) {
  cases.push_back({{"ext.pause",
                    "sbx.pause/1: paused is status paused and refuses exec and transfers at once; "
                    "resumed works again; pause and resume twice change nothing; a paused sandbox "
                    "can be closed",
                    "sbx.pause/1 not in the provider's extensions"},
                   pause});
  cases.push_back({{"ext.connect",
                    "sbx.connect/1: the descriptor's fields; a second host reaches the sandbox "
                    "with its workdir and env; closed there, the first handle finds it gone; "
                    "descriptors of a gone sandbox, another provider, damaged text are refused",
                    "sbx.connect/1 not in the provider's extensions"},
                   connect});
  cases.push_back({{"ext.renew",
                    "sbx.renew/1: the expiry asked for (rounded up at most), honoured; a past "
                    "expiry is InvalidArgumentError, a gone sandbox NotFoundError",
                    "sbx.renew/1 not in the provider's extensions"},
                   renew});
}

}  // namespace sbx::conformance
