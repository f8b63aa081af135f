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
  CHECK_EQ(box.status(), SandboxStatus::paused);
  CHECK_NOTHROW(box.pause());  // pausing a paused sandbox changes nothing
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(box.exec("echo no"), FailedPreconditionError);
  CHECK_THROWS_AS(box.upload_bytes("x", "/work/x"), FailedPreconditionError);
  CHECK_THROWS_AS(box.download_bytes("/work/state"), FailedPreconditionError);
  CHECK(std::chrono::steady_clock::now() - start < 10s);  // refused, not waited on
  box.resume();
  CHECK_NOTHROW(box.resume());  // resuming a running sandbox changes nothing
  CHECK_EQ(box.status(), SandboxStatus::running);
  CHECK_EQ(box.exec("cat state").stdout_text, "before\n");
  box.pause();
  CHECK_NOTHROW(plugin_checks::close_behind_host(box));  // a paused sandbox can be ended
  CHECK_EQ(box.status(), SandboxStatus::stopped);
  CHECK_THROWS_AS(box.resume(), NotFoundError);  // and is then gone for pause and resume too
  CHECK_THROWS_AS(box.pause(), NotFoundError);
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
    t.fail("the descriptor is not a JSON object: " + T::show(descriptor),
           std::source_location::current());
    throw RequireFailed{};
  }
  CHECK(parsed.contains("format") && parsed.at("format") == "sbx.descriptor/1");
  CHECK(parsed.contains("provider") &&
        parsed.at("provider") == boost::json::value(t.provider().provider_id()));
  CHECK(parsed.contains("sandbox_id") && parsed.at("sandbox_id") == boost::json::value(box.id()));

  // A second host (another process would do the same): a working handle, with the workdir.
  auto second = t.second_host();
  Sandbox again = second->provider(t.options().provider).connect(descriptor);
  CHECK_EQ(again.id(), box.id());
  CHECK_EQ(again.exec("cat note.txt").stdout_text, "made by the first host\n");  // relative
  CHECK_EQ(again.exec("echo $CONFORMANCE_ENV").stdout_text, "kept\n");
  again.close();  // closed there: the first handle's calls reach the plugin, which finds it gone
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError);
  CHECK_THROWS_AS(box.download_bytes("/work/note.txt"), NotFoundError);
  CHECK_EQ(box.status(), SandboxStatus::stopped);
  CHECK_NOTHROW(box.close());

  // A descriptor of a sandbox that is gone, of another provider, or that is damaged.
  CHECK_THROWS_AS(t.provider().connect(descriptor), NotFoundError);
  boost::json::object other = parsed;
  other["provider"] = "some_other_provider";
  CHECK_THROWS_AS(t.provider().connect(boost::json::serialize(other)), InvalidArgumentError);
  CHECK_THROWS_AS(t.provider().connect(descriptor.substr(0, descriptor.size() / 2)),
                  InvalidArgumentError);
}

void renew(T& t) {
  t.needs_extension("sbx.renew/1");
  Sandbox box = t.create();
  const auto asked = std::chrono::system_clock::now() + 3s;
  const auto got = box.renew_async(asked).get();
  CHECK(got >= asked - 1ms);  // a provider may round up, never down
  CHECK(got - asked < 60s);   // ... but to its resolution, not to something else
  CHECK_EQ(box.exec("echo alive").stdout_text, "alive\n");
  // The new, earlier expiry is honoured: gone within it + 30 s.
  REQUIRE(wait_until([&] { return box.status() == SandboxStatus::stopped; },
                     std::chrono::duration_cast<std::chrono::milliseconds>(got - asked) + 33s));
  CHECK_THROWS_AS(box.exec("echo no"), NotFoundError);

  Sandbox other = t.create();
  // An expiry in the past is refused by the plugin.
  CHECK_THROWS_AS(other.renew_async(std::chrono::system_clock::now() - 60s).get(),
                  InvalidArgumentError);
  CHECK_EQ(other.status(), SandboxStatus::running);
  plugin_checks::close_behind_host(other);
  CHECK_THROWS_AS(other.renew(600), NotFoundError);  // a sandbox that is gone
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
