// Swapping the backend of a served block (docs/hot-swap.md, "Swapping the backend itself"):
// `sbx serve` A serves block "p" from local_docker; under a steady load of client sessions the
// block is rewritten to the opensandbox plugin pointed at a second `sbx serve` B (over
// local_docker) and reloaded through POST /admin/reload, then swapped back. No client request may
// fail across either swap; sandboxes made before a swap keep working on the old backend until they
// are closed; sandboxes made after it live on the new one (B holds them, their containers carry
// B's sbx.run label, B's create count follows the swaps); the old generation drains away; and at
// the end neither server leaves a container on the daemon. A second case stops A with a sandbox
// still on its draining opensandbox generation: the stop closes it on B. A third swaps away and
// back while the first generation still holds a sandbox: two local_docker generations of one
// plugin file and an opensandbox one serve side by side, and the first drains without the third.
//
// Why: it is the hot swap's widest change. The new generation is another plugin with another
// transport, A's sandbox ids then come from B, and the old generation's sandboxes must still be
// reached through the old plugin, not the one now in service.
//
// The clients are real OpenSandbox clients (the opensandbox plugin through sbx::Host) with their
// create and operation retries off, so that a request that fails is seen, not retried away.

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <sbx/core/host.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

using namespace serve_test;
namespace json = boost::json;
using namespace std::chrono_literals;

namespace {

constexpr const char* kKeyA = "swap-test-key-a-0123456789";
constexpr const char* kKeyB = "swap-test-key-b-0123456789";
constexpr const char* kImage = "sbx-busybox:latest";
// Concurrent client sessions (the sanitizers cost 5-15x), and the sandboxes held across a swap.
constexpr int kSessions = sbx::testing::kSanitized ? 6 : 16;
constexpr int kHeld = 3;

// Where the swap is, as the sessions see it when they start and end. A session that starts and
// ends in the same phase made its sandbox on that phase's backend for sure.
enum Phase : int { kBefore, kSwapping1, kOnB, kSwapping2, kBack, kPhases };

// Both blocks say a reload may change the provider kind (refused otherwise: docs/hot-swap.md).
json::object docker_block() {
  return {{"plugin", "local_docker"},
          {"allow_kind_change", true},
          {"config", json::object{{"create", json::object{{"network", "none"}}}}}};
}

// The opensandbox plugin pointed at B; B's key comes from A's environment.
json::object opensandbox_block(int port_b) {
  return {{"plugin", "opensandbox"},
          {"allow_kind_change", true},
          {"config", json::object{{"connection",
                                   json::object{{"domain", "127.0.0.1:" + std::to_string(port_b)},
                                                {"api_key", "${env:SBX_SWAP_KEY_B}"}}},
                                  {"probe", json::object{{"command", nullptr}}},
                                  {"attribution", json::object{{"enabled", false}}}}}};
}

// An operator's edit: the new file beside the old one, renamed over it.
void write_config(const fs::path& path, const std::string& name, json::object block) {
  sbx::testing::replace_file(
      path, json::serialize(json::object{{"providers", json::object{{name, block}}}}));
}

bool contains(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// A command and a file round trip in `box`; throws when either comes back wrong.
void use(sbx::Sandbox& box, const std::string& word) {
  const auto r = box.exec("echo " + word);
  if (r.return_code != 0 || r.stdout_text != word + "\n") {
    throw std::runtime_error("exec in " + box.id() + ": " + std::to_string(r.return_code) + " " +
                             r.stdout_text + r.stderr_text);
  }
  box.upload_bytes("data of " + word, "/tmp/f.txt");
  if (box.download_bytes("/tmp/f.txt") != "data of " + word) {
    throw std::runtime_error("the file came back changed in " + box.id());
  }
}

// The count on the `sbx_serve_requests_total` line of `route` and `code` in a /metrics text (0
// when there is none).
long long requests_total(const std::string& metrics, const std::string& route,
                         const std::string& code) {
  const std::string head =
      "sbx_serve_requests_total{route=\"" + route + "\",code=\"" + code + "\"} ";
  const auto at = metrics.find(head);
  return at == std::string::npos ? 0 : std::stoll(metrics.substr(at + head.size()));
}

// The `sbx_serve_requests_total` lines of a /metrics text answered 4xx or 5xx.
std::vector<std::string> error_lines(const std::string& metrics) {
  std::vector<std::string> out;
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("sbx_serve_requests_total{") &&
        (line.find(",code=\"4") != std::string::npos ||
         line.find(",code=\"5") != std::string::npos)) {
      out.push_back(line);
    }
  }
  return out;
}

struct Servers {
  TempDir dir;
  fs::path config_b = dir.path / "b.json";
  fs::path config_a = dir.path / "a.json";
  std::map<std::string, std::string> auth_a{{"OPEN-SANDBOX-API-KEY", kKeyA}};
  std::map<std::string, std::string> auth_b{{"OPEN-SANDBOX-API-KEY", kKeyB}};
  std::optional<ServeProcess> b;
  std::optional<ServeProcess> a;
  std::optional<sbx::Host> client;

  // B, then A serving block "p" from local_docker (or, `on_b`, from the opensandbox plugin
  // pointed at B), then the client.
  explicit Servers(bool on_b = false) {
    write_config(config_b, "docker", docker_block());
    b.emplace(config_b, "docker", dir.path / "b.log",
              std::vector<std::string>{"--api-key-env", "SBX_SWAP_KEY_B"},
              std::map<std::string, std::string>{{"SBX_SWAP_KEY_B", kKeyB}});
    write_config(config_a, "p", on_b ? opensandbox_block(b->port()) : docker_block());
    a.emplace(
        config_a, "p", dir.path / "a.log",
        std::vector<std::string>{"--api-key-env", "SBX_SWAP_KEY_A"},
        std::map<std::string, std::string>{{"SBX_SWAP_KEY_A", kKeyA}, {"SBX_SWAP_KEY_B", kKeyB}});
    json::object config{
        {"connection",
         json::object{{"domain", "127.0.0.1:" + std::to_string(a->port())}, {"api_key", kKeyA}}},
        {"create", json::object{{"retries", 0}}},
        {"operations", json::object{{"retries", 0}}},
        {"probe", json::object{{"command", nullptr}}},
        {"attribution", json::object{{"enabled", false}}}};
    json::object host_config{
        {"providers",
         json::object{{"a", json::object{{"plugin", "opensandbox"}, {"config", config}}}}}};
    sbx::Host::Options options;
    options.config = sbx::Config::parse(json::serialize(host_config), "backend swap test client");
    options.plugin_cache = "off";
    client.emplace(std::move(options));
  }

  sbx::Sandbox create() {
    sbx::SandboxSpec spec;
    spec.image = kImage;
    spec.ttl_s = 600;
    return client->provider("a").create(std::move(spec));
  }

  // kHeld sandboxes, made at once.
  std::vector<sbx::Sandbox> create_held() {
    std::vector<std::future<sbx::Sandbox>> made;
    for (int i = 0; i < kHeld; ++i)
      made.push_back(std::async(std::launch::async, [this] { return create(); }));
    std::vector<sbx::Sandbox> out;
    for (auto& m : made)
      out.push_back(m.get());
    return out;
  }
  // A command and a file round trip in each of `held` at once, then each closed.
  static void use_and_close(std::vector<sbx::Sandbox>& held, const std::string& word) {
    std::vector<std::future<void>> runs;
    for (size_t i = 0; i < held.size(); ++i) {
      runs.push_back(std::async(std::launch::async, [&held, i, word] {
        use(held[i], word + std::to_string(i));
        held[i].close();
      }));
    }
    for (auto& r : runs)
      r.get();
  }

  // Where a sandbox made now lives, as each server sees it; then a command and a file round trip
  // in it.
  struct Placement {
    std::string id;
    int status_on_b = 0;  // B's GET /sandboxes/{id}
    bool container_of_a = false;
    bool container_of_b = false;
  };
  Placement place_fresh(const std::string& word) {
    sbx::Sandbox fresh = create();
    const Placement out{fresh.id(), status_on_b(fresh.id()),
                        contains(containers_of(*a), fresh.id()),
                        contains(containers_of(*b), fresh.id())};
    use(fresh, word);
    return out;
  }

  // Block "p" of A's config rewritten to `block`, then POST /admin/reload to A.
  Response reload(json::object block) const {
    write_config(config_a, "p", std::move(block));
    return request(a->port(), "POST", "/admin/reload", std::nullopt, auth_a);
  }

  json::object providers() const { return admin_providers(a->port(), auth_a); }
  json::array generations() const { return providers().at("generations").as_array(); }
  json::object current() const {
    for (const auto& g : generations()) {
      if (g.at("current").as_bool()) return g.as_object();
    }
    return {};
  }
  // Waits (up to a minute) until A lists one generation: the old one has drained.
  // The generations once only the current one is left (and, with `empty`, it holds no sandbox: a
  // sandbox whose last reference dropped inside a plugin's callback is released on the host's
  // janitor thread a moment after its DELETE was answered, later under a sanitizer).
  json::array drained(bool empty = false) const {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    json::array gens = generations();
    auto settled = [empty](const json::array& g) {
      return g.size() == 1 && (!empty || g[0].at("sandboxes").as_int64() == 0);
    };
    while (!settled(gens) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(50ms);
      gens = generations();
    }
    return gens;
  }

  // B's own record of a sandbox: 200 when B holds it, 404 otherwise.
  int status_on_b(const std::string& id) const {
    return request(b->port(), "GET", "/sandboxes/" + id, std::nullopt, auth_b).status;
  }
  std::vector<std::string> containers_of(const ServeProcess& server) const {
    return labelled_ids(config_b, "docker", "sbx.run=" + server.run_id());
  }
  std::string metrics_of(const ServeProcess& server,
                         const std::map<std::string, std::string>& auth) const {
    const auto r = request(server.port(), "GET", "/metrics", std::nullopt, auth);
    REQUIRE(r.status == 200);
    return r.body;
  }
  long long creates_on_b() const {
    return requests_total(metrics_of(*b, auth_b), "POST /sandboxes", "202");
  }
};

// The steady load: kSessions threads, each running sessions (create, a command and a file round
// trip, a pause, another command, close) until stopped, counting them by the phase they ran in. A
// session that ran wholly in one phase checks where its sandbox was: on B (B's GET answered 200)
// exactly when that phase is kOnB.
struct Load {
  Servers& s;
  std::atomic<int> phase{kBefore};
  std::atomic<bool> stop{false};
  std::atomic<int> done_in[kPhases];  // sessions that started and ended in that phase
  std::atomic<int> not_on_b{0};       // B's GET /sandboxes/{id} answered 404 to a session
  std::atomic<int> failures{0};
  std::mutex failure_mutex;
  std::string first_failure;
  std::vector<std::thread> threads;

  explicit Load(Servers& servers) : s(servers) {
    for (int t = 0; t < kSessions; ++t)
      threads.emplace_back([this, t] { run(t); });
  }
  ~Load() { finish(); }

  void run(int t) {
    for (int n = 0; !stop; ++n) {
      const int started = phase;
      try {
        sbx::Sandbox box = s.create();
        const int on_b = s.status_on_b(box.id());
        if (on_b == 404) ++not_on_b;
        const std::string word = "w" + std::to_string(t) + "n" + std::to_string(n);
        use(box, word);
        std::this_thread::sleep_for(50ms);
        if (box.exec("echo again").stdout_text != "again\n") throw std::runtime_error("again");
        box.close();
        if (phase != started) continue;
        if (on_b != (started == kOnB ? 200 : 404)) {
          throw std::runtime_error("sandbox " + box.id() + " made in phase " +
                                   std::to_string(started) + ": B's GET answered " +
                                   std::to_string(on_b));
        }
        ++done_in[started];
      } catch (const std::exception& e) {
        std::lock_guard lock(failure_mutex);
        if (failures++ == 0) first_failure = e.what();
      }
    }
  }

  // Waits (up to two minutes) until `count` sessions ran wholly in phase `p`; whether they did
  // (false also when a session failed).
  [[nodiscard]] bool wait_for(int p, int count) const {
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (done_in[p] < count && failures == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(20ms);
    return done_in[p] >= count && failures == 0;
  }

  void finish() {
    stop = true;
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
};

// POST /admin/reload to A after writing block "p": the swap is in service once it answers.
void swap_to(Servers& s, Load& load, json::object block, int swapping) {
  load.phase = swapping;
  const auto r = s.reload(std::move(block));
  load.phase = swapping + 1;
  CAPTURE(r.body);
  REQUIRE(r.status == 200);
  const auto report = r.json();
  CHECK(report.at("changed").as_array() == json::array{"p"});
  CHECK(report.at("added").as_array().empty());
  CHECK(report.at("removed").as_array().empty());
}

}  // namespace

TEST_CASE(
    "a served block swapped from local_docker to opensandbox (another sbx serve) and back under "
    "load: no request fails, new sandboxes go to the new backend, old ones drain on the old") {
  Servers s;
  CHECK(s.current().at("provider_id") == "local_docker");
  Load load(s);

  // Sandboxes held across the swap, on A's local_docker: containers of A's run.
  std::vector<sbx::Sandbox> held = s.create_held();
  const auto a_containers = s.containers_of(*s.a);
  for (auto& box : held) {
    CHECK(contains(a_containers, box.id()));
    CHECK(s.status_on_b(box.id()) == 404);
  }
  CHECK(s.creates_on_b() == 0);
  CHECK(load.wait_for(kBefore, kSessions / 2));

  // Swap 1: block "p" becomes the opensandbox plugin pointed at B.
  swap_to(s, load, opensandbox_block(s.b->port()), kSwapping1);
  {
    const json::array gens = s.generations();
    CAPTURE(json::serialize(gens));
    REQUIRE(gens.size() == 2);
    for (const auto& g : gens) {
      if (g.at("current").as_bool()) {
        CHECK(g.at("provider_id") == "opensandbox");
      } else {
        CHECK(g.at("provider_id") == "local_docker");
        CHECK(g.at("sandboxes").as_int64() >= kHeld);  // the held ones at least
      }
    }
  }
  // A sandbox made now lives on B: B holds it, its container has B's sbx.run. Meanwhile the held
  // ones still work, on the old generation, until closed; then the old generation goes.
  auto fresh = std::async(std::launch::async, [&s] { return s.place_fresh("fresh"); });
  Servers::use_and_close(held, "held");
  for (auto& box : held)
    CHECK(s.status_on_b(box.id()) == 404);
  held.clear();
  {
    const auto placed = fresh.get();
    CAPTURE(placed.id);
    CHECK(placed.status_on_b == 200);
    CHECK(placed.container_of_b);
    CHECK(!placed.container_of_a);
  }
  // Sandboxes for the swap back, made on B while the first generation drains.
  auto next_held = std::async(std::launch::async, [&s] { return s.create_held(); });
  {
    const json::array gens = s.drained();
    CAPTURE(json::serialize(gens));
    REQUIRE(gens.size() == 1);
    CHECK(gens[0].at("provider_id") == "opensandbox");
    CHECK(gens[0].at("current").as_bool());
  }
  CHECK(s.containers_of(*s.a).empty());  // nothing left of the first generation
  CHECK(load.wait_for(kOnB, kSessions));
  CHECK(s.creates_on_b() >= load.done_in[kOnB] + 1);  // each made its sandbox on B

  // Swap 2, back to local_docker, with sandboxes on B held across it.
  held = next_held.get();
  for (auto& box : held)
    CHECK(s.status_on_b(box.id()) == 200);
  swap_to(s, load, docker_block(), kSwapping2);
  CHECK(s.current().at("provider_id") == "local_docker");
  fresh = std::async(std::launch::async, [&s] { return s.place_fresh("back"); });
  Servers::use_and_close(held, "held-on-b");
  for (auto& box : held)
    CHECK(s.status_on_b(box.id()) == 404);  // closed through A's old generation, on B
  held.clear();
  {
    const auto placed = fresh.get();
    CAPTURE(placed.id);
    CHECK(placed.status_on_b == 404);
    CHECK(placed.container_of_a);
    CHECK(!placed.container_of_b);
  }
  CHECK(load.wait_for(kBack, kSessions / 2));

  load.finish();
  CAPTURE(load.first_failure);
  MESSAGE(load.done_in[kBefore].load(), " sessions before the swap, ", load.done_in[kOnB].load(),
          " on B, ", load.done_in[kBack].load(), " after the swap back (", kSessions, " clients)");
  CHECK(load.failures == 0);
  CHECK(load.done_in[kBack] >= kSessions / 2);

  const json::array gens = s.drained(true);
  CAPTURE(json::serialize(gens));
  REQUIRE(gens.size() == 1);
  CHECK(gens[0].at("provider_id") == "local_docker");
  CHECK(gens[0].at("sandboxes").as_int64() == 0);
  CHECK(s.providers().at("reloads").as_int64() == 2);
  const json::value b_list =
      request(s.b->port(), "GET", "/sandboxes", std::nullopt, s.auth_b).json();
  CHECK(b_list.at("pagination").at("totalItems").as_int64() == 0);
  // No request failed on either server; B's only errors are this test's look-ups of sandboxes it
  // does not hold (the sessions' on A's local_docker, the first held ones, and the ones closed or
  // made after the swap back).
  const auto a_errors = error_lines(s.metrics_of(*s.a, s.auth_a));
  for (const auto& line : a_errors)
    MESSAGE("A: ", line);
  CHECK(a_errors.empty());
  const std::string b_metrics = s.metrics_of(*s.b, s.auth_b);
  const auto b_errors = error_lines(b_metrics);
  for (const auto& line : b_errors)
    MESSAGE("B: ", line);
  CHECK(b_errors.size() == 1);
  CHECK(requests_total(b_metrics, "GET /sandboxes/{id}", "404") == load.not_on_b + 3 * kHeld + 1);

  // Both stop cleanly and leave no container of theirs on the daemon.
  const std::string run_a = s.a->run_id();
  const std::string run_b = s.b->run_id();
  CHECK(s.a->stop() == 0);
  CHECK(s.b->stop() == 0);
  CHECK(labelled_ids(s.config_b, "docker", "sbx.run=" + run_a).empty());
  CHECK(labelled_ids(s.config_b, "docker", "sbx.run=" + run_b).empty());
}

TEST_CASE("a sandbox left on a draining opensandbox generation is closed on B when A stops") {
  Servers s(/*on_b=*/true);
  CHECK(s.current().at("provider_id") == "opensandbox");
  // A sandbox no client closes: A holds it, on B.
  const auto created =
      request(s.a->port(), "POST", "/sandboxes",
              R"({"image":{"uri":"sbx-busybox:latest"},"entrypoint":["sleep","600"],)"
              R"("resourceLimits":{},"timeout":600})",
              s.auth_a);
  REQUIRE(created.status == 202);
  const std::string id(created.json().at("id").as_string());
  CHECK(s.status_on_b(id) == 200);

  const auto r = s.reload(docker_block());
  CAPTURE(r.body);
  REQUIRE(r.status == 200);
  const json::array gens = s.generations();
  CAPTURE(json::serialize(gens));
  REQUIRE(gens.size() == 2);
  for (const auto& g : gens) {
    CHECK(g.at("provider_id") == (g.at("current").as_bool() ? "local_docker" : "opensandbox"));
    CHECK(g.at("sandboxes").as_int64() == (g.at("current").as_bool() ? 0 : 1));
  }
  CHECK(request(s.a->port(), "GET", "/sandboxes/" + id, std::nullopt, s.auth_a).status == 200);

  // A's stop closes it through the draining generation, on B, which still runs.
  const std::string run_b = s.b->run_id();
  CHECK(s.a->stop() == 0);
  CHECK(s.status_on_b(id) == 404);
  CHECK(!contains(s.containers_of(*s.b), id));
  CHECK(requests_total(s.metrics_of(*s.b, s.auth_b), "DELETE /sandboxes/{id}", "204") == 1);
  CHECK(s.b->stop() == 0);
  CHECK(labelled_ids(s.config_b, "docker", "sbx.run=" + run_b).empty());
}

TEST_CASE(
    "swapped away and back while the first generation still holds a sandbox: two local_docker "
    "generations and an opensandbox one serve side by side") {
  Servers s;
  sbx::Sandbox first = s.create();
  REQUIRE(s.reload(opensandbox_block(s.b->port())).status == 200);
  sbx::Sandbox second = s.create();
  CHECK(s.status_on_b(second.id()) == 200);
  REQUIRE(s.reload(docker_block()).status == 200);
  sbx::Sandbox third = s.create();
  CHECK(s.status_on_b(third.id()) == 404);
  {
    const json::array gens = s.generations();
    CAPTURE(json::serialize(gens));
    REQUIRE(gens.size() == 3);
    std::vector<std::string> ids;
    for (const auto& g : gens) {
      ids.emplace_back(g.at("provider_id").as_string());
      CHECK(g.at("sandboxes").as_int64() == 1);
    }
    std::sort(ids.begin(), ids.end());
    CHECK(ids == std::vector<std::string>{"local_docker", "local_docker", "opensandbox"});
  }
  // Each works on its own generation. The first closes first: its generation goes while the
  // third, of the same plugin file, serves on.
  use(first, "first");
  first.close();
  use(second, "second");
  use(third, "third");
  second.close();
  third.close();
  const json::array gens = s.drained();
  CAPTURE(json::serialize(gens));
  REQUIRE(gens.size() == 1);
  CHECK(gens[0].at("provider_id") == "local_docker");
  CHECK(gens[0].at("current").as_bool());
  sbx::Sandbox again = s.create();
  use(again, "again");
  again.close();
  CHECK(s.a->stop() == 0);
  CHECK(s.containers_of(*s.a).empty());
  CHECK(s.containers_of(*s.b).empty());
}
