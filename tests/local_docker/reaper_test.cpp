// local_docker's TTL reaper: the container sbx-reaper that removes expired sandboxes in any state,
// so that nothing outlives its TTL when its host dies, also a container created but never started.
// Hosts are killed with SIGKILL (build/bin/sbx and build/bin/ld_kill_target) and no sbx process
// runs afterwards: only the reaper and the TTL inside the containers can remove what they left.

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <signal.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

using namespace std::chrono_literals;
using ldtest::docker;
using ldtest::seconds_since;

namespace {

namespace json = boost::json;
constexpr const char* kReaper = "sbx-reaper";

// A fresh provider instance (its own host): each ensures the reaper again on its first create.
sbx::Host::Options options_with(const std::string& config) {
  sbx::Host::Options options;
  options.config = sbx::Config::parse(
      R"({"providers": {"p": {"plugin": "local_docker", "config": )" + config + "}}}", "test");
  options.labels[ldtest::kSuiteLabel] = ldtest::kSuiteValue;
  return options;
}

// Creates a sandbox with a TTL through a new provider instance, and closes it.
void create_with_ttl(const std::string& config = "{}") {
  sbx::Host host(options_with(config));
  auto spec = ldtest::spec();
  spec.ttl_s = 60;
  sbx::Sandbox box = host.provider("p").create(spec);
  box.close();
}

std::string label_of(const json::object& inspect, const std::string& key) {
  const auto& labels = inspect.at("Config").at("Labels").as_object();
  const auto* value = labels.if_contains(key);
  return value ? std::string(value->as_string()) : std::string();
}

// A container named sbx-reaper that sleeps, with these labels: another build's reaper, or a
// stranger that happens to have the name.
std::string create_impostor(const json::object& labels) {
  docker().remove(kReaper);
  const json::object body{{"Image", ldtest::kBusybox},
                          {"Entrypoint", json::array{"sleep", "600"}},
                          {"Labels", labels},
                          {"HostConfig", json::object{{"NetworkMode", "none"}}}};
  const auto created = docker().send("POST", std::string("/containers/create?name=") + kReaper,
                                     json::serialize(body));
  REQUIRE_MESSAGE(created.status == 201, created.body);
  const auto started = docker().send("POST", std::string("/containers/") + kReaper + "/start");
  REQUIRE_MESSAGE(started.status == 204, started.body);
  return std::string(json::parse(created.body).at("Id").as_string());
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The daemon's events of the containers with a label, recorded as they happen: GET /events streams
// them (a later query would miss some, the daemon keeps only its last 256 events).
class EventLog {
 public:
  explicit EventLog(const std::string& label)
      : client_({.base_url = "http://docker", .unix_socket = ldtest::kDockerSocket}) {
    const json::object filters{{"label", json::array{label}}, {"type", json::array{"container"}}};
    sbx::sdk::http::Request request;
    request.target = "/events?filters=" + sbx::sdk::http::url_encode(json::serialize(filters));
    request.on_body = [this](std::string_view bytes) { feed(bytes); };
    call_ = client_.start(std::move(request));
  }
  ~EventLog() {
    call_.cancel();
    try {
      call_.get();
    } catch (...) {  // cancelled, as intended
    }
  }
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // sbx.run label -> action -> the time of its first event (unix ns). Waits a moment for the last.
  std::map<std::string, std::map<std::string, int64_t>> by_run() const {
    std::this_thread::sleep_for(300ms);
    std::lock_guard lock(mutex_);
    return runs_;
  }

 private:
  void feed(std::string_view bytes) {  // on the client's loop thread
    std::lock_guard lock(mutex_);
    pending_.append(bytes);
    for (size_t end; (end = pending_.find('\n')) != std::string::npos;) {
      boost::system::error_code ec;
      const json::value event = json::parse(std::string_view(pending_).substr(0, end), ec);
      pending_.erase(0, end + 1);
      if (ec || !event.is_object()) continue;
      const auto* actor = event.get_object().if_contains("Actor");
      const auto* attributes =
          actor && actor->is_object() ? actor->get_object().if_contains("Attributes") : nullptr;
      const auto* run = attributes && attributes->is_object()
                            ? attributes->get_object().if_contains("sbx.run")
                            : nullptr;
      if (!run || !run->is_string()) continue;
      runs_[std::string(run->get_string())].emplace(std::string(event.at("Action").as_string()),
                                                    event.at("timeNano").to_number<int64_t>());
    }
  }

  sbx::sdk::http::Client client_;
  sbx::sdk::http::Call call_;
  mutable std::mutex mutex_;
  std::string pending_;
  std::map<std::string, std::map<std::string, int64_t>> runs_;
};

}  // namespace

TEST_CASE("the reaper: replaced when its hash differs, left alone when it matches, restarted") {
  const std::string old_id = create_impostor({{"sbx.reaper", "0000000000000000"}});
  create_with_ttl();
  auto reaper = docker().inspect(kReaper);
  REQUIRE(reaper);
  const std::string hash = label_of(*reaper, "sbx.reaper");
  CHECK(hash.size() == 16);
  CHECK(hash != "0000000000000000");
  CHECK(std::string(reaper->at("Id").as_string()) != old_id);
  CHECK(reaper->at("Config").at("Image").as_string() == "sbx-local-docker-reaper:" + hash);
  CHECK(reaper->at("State").at("Running").as_bool());
  const auto& host_config = reaper->at("HostConfig").as_object();
  CHECK(host_config.at("RestartPolicy").at("Name").as_string() == "unless-stopped");
  CHECK(host_config.at("NetworkMode").as_string() == "none");
  CHECK(host_config.at("Binds").at(0).as_string() == "/var/run/docker.sock:/var/run/docker.sock");
  CHECK(label_of(*reaper, "sbx.sandbox").empty());  // not a sandbox: CI counts those as leaks
  CHECK(docker().image_exists("sbx-local-docker-reaper:" + hash));

  // The same hash: left alone, not restarted.
  const std::string id = std::string(reaper->at("Id").as_string());
  const std::string started_at = std::string(reaper->at("State").at("StartedAt").as_string());
  create_with_ttl();
  reaper = docker().inspect(kReaper);
  REQUIRE(reaper);
  CHECK(std::string(reaper->at("Id").as_string()) == id);
  CHECK(std::string(reaper->at("State").at("StartedAt").as_string()) == started_at);

  // Stopped (docker stop): started again, the same container.
  const auto stopped = docker().send("POST", std::string("/containers/") + kReaper + "/stop?t=5");
  REQUIRE_MESSAGE(stopped.status < 300, stopped.body);
  CHECK_FALSE(docker().inspect(kReaper)->at("State").at("Running").as_bool());
  create_with_ttl();
  reaper = docker().inspect(kReaper);
  REQUIRE(reaper);
  CHECK(std::string(reaper->at("Id").as_string()) == id);
  CHECK(reaper->at("State").at("Running").as_bool());
}

TEST_CASE("the reaper: a stranger named sbx-reaper is left alone; disabled, none is made") {
  const std::string stranger = create_impostor({{"owner", "someone else"}});
  CHECK_NOTHROW(create_with_ttl());  // create succeeds (a warning is logged)
  auto found = docker().inspect(kReaper);
  REQUIRE(found);
  CHECK(std::string(found->at("Id").as_string()) == stranger);
  docker().remove(kReaper);

  create_with_ttl(R"({"reaper": {"enabled": false}})");
  CHECK_FALSE(docker().exists(kReaper));
  // Without a TTL there is nothing to reap: no reaper either.
  {
    sbx::Host host(options_with("{}"));
    auto spec = ldtest::spec();
    spec.ttl_s.reset();
    sbx::Sandbox box = host.provider("p").create(spec);
    box.close();
  }
  CHECK_FALSE(docker().exists(kReaper));
  create_with_ttl(R"({"reaper": {"interval_s": 2}})");  // back for the other cases
  CHECK(docker().exists(kReaper));
}

TEST_CASE("a sandbox whose host was killed before it started is removed at its TTL") {
  create_with_ttl();  // the reaper runs
  const std::string run = ldtest::unique();
  // 64 MiB of startup files keep the container in "created" while they are written.
  ldtest::Child host({.argv = {ldtest::test_binary("ld_kill_target"), "--ttl", "5", "--file-mib",
                               "64", "--command", "sleep 100"},
                      .env = {"SBX_RUN_ID=" + run}});
  std::string name;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  while (name.empty() && std::chrono::steady_clock::now() < give_up && host.running()) {
    const auto names = ldtest::leftovers("sbx.run", run);
    if (!names.empty()) name = names.front();
    if (name.empty()) std::this_thread::sleep_for(5ms);
  }
  REQUIRE_MESSAGE(!name.empty(), "the container of the run never appeared");
  host.kill(SIGKILL);
  REQUIRE(host.wait_for(10s));
  const auto inspect = docker().inspect(name);
  REQUIRE(inspect);
  REQUIRE(inspect->at("State").at("Status").as_string() == "created");  // never started
  const int64_t expires_at = std::stoll(label_of(*inspect, "sbx.expires_at"));

  // Still there shortly before its expiry; gone by expiry + 4 s (the reaper's 2 s interval, the
  // removal, and a second of rounding in the label), with no sbx process running.
  while (unix_now() < expires_at - 1)
    std::this_thread::sleep_for(100ms);
  CHECK(docker().exists(name));
  while (docker().exists(name) && unix_now() < expires_at + 4)
    std::this_thread::sleep_for(100ms);
  const bool gone = !docker().exists(name);
  CHECK(gone);
  if (gone) MESSAGE("removed about ", unix_now() - expires_at, " s after its expiry");
  docker().remove(name);
}

TEST_CASE("hosts killed at 30 instants over create, exec and close leave nothing past the TTL") {
  create_with_ttl();  // the reaper runs
  const std::string batch = ldtest::unique();
  const std::string tag = "sbx.test.kill=" + batch;
  const std::string suite = std::string(ldtest::kSuiteLabel) + "=" + ldtest::kSuiteValue;
  const EventLog events(tag);
  // The two hosts, each running a short command in a sandbox with a 10 s TTL: the CLI and a
  // host-API program. A run not killed takes up to ~5 s under ASan on a busy machine (create ~4 s):
  // the TTL must not end it first.
  constexpr auto kTtl = 10s;
  const std::string ttl = std::to_string(kTtl.count());
  sbx::testing::TempDir logs("sbx-ld-reaper-kill");
  auto argv_of = [&](bool cli) -> std::vector<std::string> {
    if (cli) {
      return {ldtest::sbx_binary(),
              "run",
              "--image",
              ldtest::kBusybox,
              "--ttl",
              ttl,
              "--metadata",
              suite,
              "--metadata",
              tag,
              "--",
              "sleep",
              "0.5"};
    }
    return {ldtest::test_binary("ld_kill_target"),
            "--ttl",
            ttl,
            "--label",
            tag,
            "--command",
            "sleep 0.5"};
  };

  // A batch: 5 runs of each host, interleaved, one started every 150 ms, each killed at its own
  // instant after its own start.
  using Seconds = std::chrono::duration<double>;
  constexpr int kInstants = 30;
  constexpr int kPerBatch = 5;
  constexpr Seconds kStagger{0.15};
  struct Run {
    std::string id;
    bool cli = false;
    Seconds spawn_at{0};                // after the batch's start
    std::optional<Seconds> kill_after;  // after its own start
    std::optional<ldtest::Child> child;
    std::chrono::system_clock::time_point spawned{};
    std::chrono::system_clock::time_point killed{};
    Seconds took{0};  // start to exit
  };
  // Batch b (of 6) takes the instants b, b + 6, ..., b + 24 of each host, so that every batch
  // mixes phases; batch -1 is not killed.
  auto batch_of = [&](int b, const std::function<std::optional<Seconds>(int, bool)>& kill) {
    std::vector<Run> runs;
    for (int k = 0; k < kPerBatch; ++k) {
      const int i = b + k * (kInstants / kPerBatch);
      for (int cli = 0; cli < 2; ++cli) {
        Run run;
        run.id = batch + "-" + (cli ? "cli-" : "api-") + (b < 0 ? "calibrate-" : "") +
                 std::to_string(b < 0 ? k : i);
        run.cli = cli == 1;
        run.spawn_at = kStagger * static_cast<double>(runs.size());
        run.kill_after = kill(i, run.cli);
        runs.push_back(std::move(run));
      }
    }
    return runs;
  };
  // Starts and kills at the instants, then waits until every process has ended.
  auto run_batch = [&](std::vector<Run>& runs) {
    std::vector<std::pair<Seconds, size_t>> schedule;  // (when, 2 * run + 1 for a kill)
    for (size_t i = 0; i < runs.size(); ++i) {
      schedule.emplace_back(runs[i].spawn_at, 2 * i);
      if (runs[i].kill_after) {
        schedule.emplace_back(runs[i].spawn_at + *runs[i].kill_after, 2 * i + 1);
      }
    }
    std::sort(schedule.begin(), schedule.end());
    const auto start = std::chrono::steady_clock::now();
    for (const auto& [when, what] : schedule) {
      std::this_thread::sleep_until(start + when);
      Run& run = runs[what / 2];
      if (what % 2 == 0) {
        run.spawned = std::chrono::system_clock::now();
        run.child.emplace(ldtest::Child::Options{.argv = argv_of(run.cli),
                                                 .env = {"SBX_RUN_ID=" + run.id},
                                                 .stderr_path = (logs.path / run.id).string()});
      } else {
        run.child->kill(SIGKILL);
        run.killed = std::chrono::system_clock::now();
      }
    }
    for (size_t left = runs.size(); left > 0;) {
      REQUIRE(seconds_since(start) < 120);
      left = 0;
      for (auto& run : runs) {
        if (run.took.count() > 0) continue;
        if (run.child->running()) {
          ++left;
        } else {
          run.took = std::chrono::steady_clock::now() - (start + run.spawn_at);
        }
      }
      std::this_thread::sleep_for(5ms);
    }
  };

  auto unix_ns = [](std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };

  // The phases of a whole run here, under the same load (one batch left to finish), from the
  // daemon's events: the median time from the start of the process to the container's start
  // (create ends) and to its death (close begins), and to the process's exit.
  struct Phases {
    double started = 0, died = 0, ended = 0;
  } phases_of[2];
  {
    auto runs = batch_of(-1, [](int, bool) { return std::nullopt; });
    run_batch(runs);
    const auto times = events.by_run();
    std::vector<double> started[2], died[2], ended[2];
    for (auto& run : runs) {
      CHECK_MESSAGE(run.child->wait_for(0ms) == 0, run.id,
                    " failed: ", sbx::testing::read_file(logs.path / run.id));
      const auto& t = times.at(run.id);
      started[run.cli].push_back((t.at("start") - unix_ns(run.spawned)) / 1e9);
      died[run.cli].push_back((t.at("die") - unix_ns(run.spawned)) / 1e9);
      ended[run.cli].push_back(run.took.count());
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (int cli = 0; cli < 2; ++cli) {
      phases_of[cli] = {median(started[cli]), median(died[cli]), median(ended[cli])};
      MESSAGE(std::string(cli ? "sbx run" : "host API"), ": started after ", phases_of[cli].started,
              " s, close from ", phases_of[cli].died, " s, exit after ", phases_of[cli].ended,
              " s (medians)");
    }
  }

  // 30 instants per host: 10 spread over create (up to the container's start), 10 over the probe
  // and the command, 10 over close and a little past the end (a kill after the end kills nothing).
  auto instant = [&](int i, bool cli) {
    const Phases& p = phases_of[cli ? 1 : 0];
    const double f = (i % 10 + 0.5) / 10;
    if (i < 10) return f * f * p.started;  // denser early: the container exists after ~0.1 s
    if (i < 20) return p.started + f * (p.died - p.started);
    return p.died - 0.05 + f * (p.ended - p.died + 0.15);
  };
  std::vector<std::pair<std::string, std::chrono::system_clock::time_point>> kills;
  auto last_kill = std::chrono::steady_clock::now();
  for (int b = 0; b < kInstants / kPerBatch; ++b) {
    auto runs = batch_of(
        b, [&](int i, bool cli) -> std::optional<Seconds> { return Seconds(instant(i, cli)); });
    run_batch(runs);  // every process has ended: none is left to help
    for (auto& run : runs)
      kills.emplace_back(run.id, run.killed);
    last_kill = std::chrono::steady_clock::now();
  }

  // Where each kill landed, from the daemon's events of these containers (create, start, die).
  const auto times_of = events.by_run();
  std::map<std::string, int> phases;
  for (const auto& [run, killed] : kills) {
    const int64_t at = unix_ns(killed);
    const auto it = times_of.find(run);
    const std::map<std::string, int64_t> none;
    const auto& times = it == times_of.end() ? none : it->second;
    auto before = [&](const char* action) {
      const auto it = times.find(action);
      return it == times.end() || at < it->second;
    };
    if (before("create")) {
      ++phases["1 create, no container yet"];
    } else if (before("start")) {
      ++phases["2 create, container not started"];
    } else if (before("die")) {
      ++phases["3 started: probe or exec"];
    } else {
      ++phases["4 close or later"];
    }
  }
  std::string summary;
  for (const auto& [phase, count] : phases)
    summary += phase + ": " + std::to_string(count) + "; ";
  MESSAGE("where the 60 kills landed: ", summary);
  CHECK(phases["1 create, no container yet"] > 0);
  CHECK(phases["3 started: probe or exec"] > 0);
  CHECK(phases["4 close or later"] > 0);

  // The TTL plus 4 s of margin (the reaper's 2 s interval, the removal, a second of rounding in
  // the label) must clear every container, with no sbx process running.
  const auto deadline = last_kill + kTtl + 4s;
  auto left = docker().containers_with_label(tag);
  while (!left.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(200ms);
    left = docker().containers_with_label(tag);
  }
  std::string names;
  for (const auto& name : left) {
    const auto inspect = docker().inspect(name);
    names += name + " (" +
             (inspect ? std::string(inspect->at("State").at("Status").as_string()) : "gone") + ") ";
    docker().remove(name);
  }
  CHECK_MESSAGE(left.empty(), "left past the TTL: ", names);
  MESSAGE("cleared ", seconds_since(last_kill), " s after the last kill");
}
