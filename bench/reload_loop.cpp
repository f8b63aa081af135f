// N hot swaps of `sbx serve`'s provider plugin in a loop, under a steady load of client threads
// (issue 12: "200 reloads in a loop leave the server's memory and open file count flat ...,
// together with the p99 latency of requests during a swap against the p99 without one"):
//   - the server's resident memory, open files, threads, generations and mapped plugin images,
//     sampled after W warm-up reloads and every S reloads
//                                          target: RSS growth <= 4 MiB, open files <= +2
//   - after the loop, the sandboxes made before it closed (they stayed on the first generation
//     through every reload) and the old generations drained: the plugin images still mapped
//                                          target: only the one in service
//   - the latency of the clients' timed requests on those sandboxes that overlapped a reload (from
//     the POST /admin/reload sent to its answer) against those that did not: count, p50, p99,
//     max, side by side                    target: no request and no reload fails
//
// Usage: reload_loop [--quick] [--check] [--reloads N] [--clients K] [--warmup W] [--every S]
//                    [--gap-ms G] [--request status|exec] [--v1 FILE] [--v2 FILE]
//   --quick    40 reloads (default 200; 4 clients, 10 warm-up reloads, samples every 20, 100 ms
//              between reloads)
//   --request  the timed request: `status` (default), GET /v1/sandboxes/{id}, the provider's
//              status call on the sandbox's generation; `exec`, a command `true` through the
//              server-proxy execd route. The server keeps a record of every command of a sandbox
//              until it closes (GET /command/status/{id}), ~0.5 KiB each: with `exec` the memory
//              grows with the requests, whatever the reloads do.
//   --check    exit 1 when a target is missed (otherwise 0: this is a report); 2 on an error
//
// The server is build/bin/sbx (next to this program), `sbx serve --provider p` on 127.0.0.1:0 with
// an API key, on the test_processes plugin (sandboxes are host processes: no container runtime in
// what is measured; not local_docker, whose reloads would measure docker). Block "p" names a plugin
// file in this program's temp dir; each reload replaces it the way a deploy does (copy beside,
// rename over) with the other of two builds of test_processes (0.1.0 and 2.0.0; --v1, --v2), then
// POSTs /admin/reload and checks that "p" changed. The server's TMPDIR is in that temp dir too, so
// the copies a reload loads (docs/hot-swap.md) are told apart in /proc/PID/maps, and its plugin
// probe cache ($SBX_PLUGIN_CACHE) is a file of its own (the user's may hold entries of many runs,
// all read and written again at each reload). Besides the timed requests, each client every 25th
// request makes a sandbox on the generation in service, runs `true` in it and deletes it (so
// generations that held sandboxes drain too); those sessions count for failures only. While a
// sample is taken the clients pause (in-flight requests hold sockets and pipes: the open file
// count would be noise). The server is stopped (SIGTERM) and the temp dir removed in every case.
// Not part of ctest.

#include "bench_util.hpp"
#include "serve_child.hpp"
#include "serve_client.hpp"

#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef SBX_BENCH_TEST_PLUGIN
#define SBX_BENCH_TEST_PLUGIN ""
#endif
#ifndef SBX_BENCH_TEST_PLUGIN_V2
#define SBX_BENCH_TEST_PLUGIN_V2 ""
#endif

namespace {

namespace http = boost::beast::http;
namespace json = boost::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using sbx::bench::Clock;
using sbx::bench::percentile;
using sbx::bench::ServeChild;
using sbx::bench::ServeClient;

// The targets of --check.
// RSS from the first sample (after the warm-up) to the last: 4 MiB, 20 KiB per reload over 200. A
// reload that leaves a thread behind unjoined (its stack stays mapped) costs ~29 KiB; with none
// left, 200 reloads grew it by ~1.2 MiB, most of it in the first 20.
constexpr double kMaxRssGrowthKib = 4 * 1024;
constexpr int kMaxFdGrowth = 2;
constexpr int kSessionEvery = 25;  // a client's create-exec-delete session, every N requests
constexpr const char* kKeyVar = "SBX_RELOAD_BENCH_KEY";
constexpr const char* kKey = "reload-bench-key-0123456789";

struct Options {
  bool quick = false;
  bool check = false;
  int reloads = 200;
  int clients = 4;
  int warmup = 10;
  int every = 20;
  int gap_ms = 100;
  bool exec = false;  // the timed request: GET /v1/sandboxes/{id}, or a command `true` (--request)
  fs::path v1 = SBX_BENCH_TEST_PLUGIN;
  fs::path v2 = SBX_BENCH_TEST_PLUGIN_V2;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--quick] [--check] [--reloads N] [--clients K] [--warmup W] "
               "[--every S] [--gap-ms G] [--request status|exec] [--v1 FILE] [--v2 FILE]\n",
               argv0);
  std::exit(2);
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool reloads_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    auto number = [&](int min) {
      const std::string text = value();
      size_t used = 0;
      int n = 0;
      try {
        n = std::stoi(text, &used);
      } catch (const std::exception&) {
        usage(argv[0]);
      }
      if (used != text.size() || n < min) usage(argv[0]);
      return n;
    };
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--check") {
      o.check = true;
    } else if (arg == "--reloads") {
      o.reloads = number(1);
      reloads_given = true;
    } else if (arg == "--clients") {
      o.clients = number(1);
    } else if (arg == "--warmup") {
      o.warmup = number(0);
    } else if (arg == "--every") {
      o.every = number(1);
    } else if (arg == "--gap-ms") {
      o.gap_ms = number(0);
    } else if (arg == "--request") {
      const std::string request = value();
      if (request != "status" && request != "exec") usage(argv[0]);
      o.exec = request == "exec";
    } else if (arg == "--v1") {
      o.v1 = value();
    } else if (arg == "--v2") {
      o.v2 = value();
    } else {
      usage(argv[0]);
    }
  }
  if (o.quick && !reloads_given) o.reloads = 40;
  return o;
}

[[noreturn]] void die(const std::string& message) {
  throw std::runtime_error(message);
}

// A client request: when it was sent and answered, and whether it succeeded.
struct Sample {
  Clock::time_point start, end;
  bool ok = false;
};

// A reload in flight: from its POST sent to its answer.
struct Window {
  Clock::time_point start, end;
};

// Lets the main thread stop the clients between two of their requests (while it samples the
// server) and let them go on.
class Gate {
 public:
  explicit Gate(int clients) : clients_(clients) {}

  // A client, before each request: waits while the gate is closed. False once stopping.
  bool pass() {
    std::unique_lock lock(mutex_);
    if (closed_) {
      ++waiting_;
      changed_.notify_all();
      changed_.wait(lock, [&] { return !closed_ || stopping_; });
      --waiting_;
    }
    return !stopping_;
  }
  // A client that is done (a failure or the stop) no longer holds up close().
  void leave() {
    std::lock_guard lock(mutex_);
    --clients_;
    changed_.notify_all();
  }
  // Closes the gate and waits until every client waits at it.
  void close() {
    std::unique_lock lock(mutex_);
    closed_ = true;
    if (!changed_.wait_for(lock, 120s, [&] { return waiting_ >= clients_; }))
      die("the clients did not pause within 120 s");
  }
  void open() {
    std::lock_guard lock(mutex_);
    closed_ = false;
    changed_.notify_all();
  }
  void stop() {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int clients_;
  int waiting_ = 0;
  bool closed_ = false;
  bool stopping_ = false;
};

// What the load's client threads found.
struct Load {
  std::vector<std::vector<Sample>> samples;  // per client
  std::atomic<long> failures{0};
  std::atomic<long> sessions{0};
  std::atomic<long> session_failures{0};
  std::mutex first_failure_mutex;
  std::string first_failure;

  void failed(const std::string& what) {
    std::lock_guard lock(first_failure_mutex);
    if (first_failure.empty()) first_failure = what;
  }
};

// One row of the table: the server as sampled after `reload` reloads of the measured loop.
struct Row {
  int reload = 0;
  double rss_kib = 0;
  int fds = 0;
  double threads = 0;
  size_t generations = 0;
  size_t images = 0;
  size_t mappings = 0;
};

class Bench {
 public:
  Bench(const Options& o, const fs::path& sbx, const fs::path& dir)
      : o_(o), dir_(dir), plugin_(dir / "plugin.so"), gate_(o.clients) {
    fs::create_directories(dir_ / "root");
    fs::create_directories(dir_ / "tmp");
    install(o_.v1);
    const json::object config{
        {"providers",
         json::object{
             {"p", json::object{{"plugin", plugin_.string() + "#test_processes"},
                                {"config", json::object{{"root", (dir_ / "root").string()}}}}}}}};
    std::ofstream(dir_ / "sbx.json") << json::serialize(config);
    server_ = std::make_unique<ServeChild>(
        sbx, dir_ / "sbx.json", dir_ / "serve.log",
        ServeChild::Options{
            .provider = "p",
            .args = {"--api-key-env", kKeyVar},
            .env = {std::string(kKeyVar) + "=" + kKey, "TMPDIR=" + (dir_ / "tmp").string(),
                    "SBX_PLUGIN_CACHE=" + (dir_ / "plugin-scan.json").string()}});
    admin_ = std::make_unique<ServeClient>(server_->port(), auth());
  }

  int run() {
    std::printf(
        "reload_loop: %d reloads of sbx serve's provider plugin under %d client threads%s\n",
        o_.reloads, o_.clients, o_.quick ? " (--quick)" : "");
    std::printf(
        "provider: test_processes (sandboxes are host processes; not local_docker: the figures "
        "are the server's and the reload's, no container runtime's)\n");
    std::printf("plugin builds, alternating: %s, %s\n", o_.v1.c_str(), o_.v2.c_str());
    std::printf(
        "timed request: %s; after every %d, a create, exec and delete on the generation in "
        "service\n",
        request_name().c_str(), kSessionEvery);
    std::printf(
        "each reload: copy beside, rename over, POST /admin/reload; %d ms apart; %d warm-up "
        "reloads, then samples every %d (clients paused while sampling)\n",
        o_.gap_ms, o_.warmup, o_.every);
    std::fflush(stdout);

    // The sandboxes of the timed requests, made before the loop: they stay on the first generation
    // through every reload.
    std::vector<std::string> sandboxes;
    for (int c = 0; c < o_.clients; ++c) {
      sandboxes.push_back(admin_->create_sandbox("local/any:latest", 3600));
      for (int i = 0; i < 5; ++i)  // warm: a command's first run on a sandbox
        if (!admin_->run(sandboxes.back(), "true")) die("a warm-up command failed");
    }

    Load load;
    load.samples.resize(static_cast<size_t>(o_.clients));
    std::vector<std::thread> threads;
    for (int c = 0; c < o_.clients; ++c)
      threads.emplace_back([&, c] { client(load, c, sandboxes[static_cast<size_t>(c)]); });
    struct Join {
      Gate& gate;
      std::vector<std::thread>& threads;
      ~Join() {
        gate.stop();
        for (auto& t : threads)
          if (t.joinable()) t.join();
      }
    } join{gate_, threads};

    for (int i = 0; i < o_.warmup; ++i)
      reload();
    std::vector<Row> rows;
    rows.push_back(sample(0));
    const auto measured_from = Clock::now();
    std::vector<Window> windows;
    for (int i = 1; i <= o_.reloads; ++i) {
      windows.push_back(reload());
      if (i % o_.every == 0 || i == o_.reloads) {
        rows.push_back(sample(i));
        std::printf("  %d reloads\n", i);
        std::fflush(stdout);
      }
    }
    const auto measured_to = Clock::now();
    gate_.stop();
    for (auto& t : threads)
      t.join();

    // The sandboxes made before the loop close; then only the generation in service is left.
    int closed = 0;
    for (const auto& id : sandboxes)
      closed += admin_->delete_sandbox(id) ? 1 : 0;
    const auto drain_start = Clock::now();
    size_t generations = generation_count();
    while (generations > 1 && Clock::now() - drain_start < 30s) {
      std::this_thread::sleep_for(50ms);
      generations = generation_count();
    }
    const double drain_ms = sbx::bench::ms_since(drain_start);
    std::this_thread::sleep_for(200ms);
    const Row after = sample_now(-1);
    const std::set<std::string> images_after = images();
    const int exit_status = server_->stop();

    // ---- The report
    std::printf("\n%8s %12s %9s %8s %12s %14s %9s\n", "reloads", "RSS (KiB)", "open fds", "threads",
                "generations", "mapped images", "mappings");
    for (const auto& r : rows)
      print_row(std::to_string(r.reload), r);
    print_row("closed", after);
    const Row& first = rows.front();
    const Row& last = rows.back();
    const double rss_growth = last.rss_kib - first.rss_kib;
    const int fd_growth = last.fds - first.fds;
    const bool rss_ok = rss_growth <= kMaxRssGrowthKib;
    const bool fds_ok = fd_growth <= kMaxFdGrowth;
    std::printf(
        "growth from reload 0 to %d: RSS %+.0f KiB (%+.1f KiB per reload; target <= %+.0f KiB: "
        "%s), open fds %+d (target <= %+d: %s), threads %+.0f, mappings %+ld (a thread left "
        "unjoined keeps its stack: 2 each)\n",
        last.reload, rss_growth, rss_growth / std::max(1, last.reload), kMaxRssGrowthKib,
        rss_ok ? "PASS" : "FAIL", fd_growth, kMaxFdGrowth, fds_ok ? "PASS" : "FAIL",
        last.threads - first.threads,
        static_cast<long>(last.mappings) - static_cast<long>(first.mappings));

    const long reloads_total = static_cast<long>(reload_ms_.size());
    std::printf(
        "\nreloads: %ld ok, %ld failed (%d warm-up + %d measured); time to answer p50 %.1f "
        "ms, p99 %.1f ms, max %.1f ms\n",
        reloads_total - reload_failures_, reload_failures_, o_.warmup, o_.reloads,
        percentile(reload_ms_, 0.5), percentile(reload_ms_, 0.99), percentile(reload_ms_, 1.0));
    std::string versions;
    for (const auto& v : versions_)
      versions += (versions.empty() ? "" : ", ") + v;
    std::printf("plugin versions in service after the reloads: %s\n", versions.c_str());
    if (!first_reload_failure_.empty())
      std::printf("  first reload failure: %s\n", first_reload_failure_.c_str());
    const bool closed_ok = closed == o_.clients;
    const bool drained = generations == 1;
    const bool images_ok = images_after.size() == 1;
    std::printf(
        "sandboxes made before the loop, closed after it: %d of %d (%s); generations left: %zu "
        "after %.0f ms (%s); plugin images mapped: %zu (target 1: %s)\n",
        closed, o_.clients, closed_ok ? "PASS" : "FAIL", generations, drain_ms,
        drained ? "PASS" : "FAIL", images_after.size(), images_ok ? "PASS" : "FAIL");
    for (const auto& image : images_after)
      std::printf("  mapped: %s\n", image.c_str());

    // Latency of the timed requests in the measured loop, by whether they overlapped a reload.
    std::vector<double> during, outside;
    for (const auto& per_client : load.samples) {
      for (const auto& s : per_client) {
        if (!s.ok || s.start < measured_from || s.end > measured_to) continue;
        const double ms = std::chrono::duration<double, std::milli>(s.end - s.start).count();
        (overlaps(windows, s) ? during : outside).push_back(ms);
      }
    }
    const long requests = static_cast<long>(during.size() + outside.size());
    std::printf(
        "\nrequests: %s on the sandboxes made before the loop, %d clients, during the %d measured "
        "reloads\n",
        request_name().c_str(), o_.clients, o_.reloads);
    std::printf("%-24s %9s %10s %10s %10s\n", "", "count", "p50 (ms)", "p99 (ms)", "max (ms)");
    std::printf("%-24s %9zu %10.2f %10.2f %10.2f\n", "during a swap", during.size(),
                percentile(during, 0.5), percentile(during, 0.99), percentile(during, 1.0));
    std::printf("%-24s %9zu %10.2f %10.2f %10.2f\n", "not during a swap", outside.size(),
                percentile(outside, 0.5), percentile(outside, 0.99), percentile(outside, 1.0));
    const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::printf("%-24s %9s %9.2fx %9.2fx %9.2fx\n", "ratio (during / not)", "",
                ratio(percentile(during, 0.5), percentile(outside, 0.5)),
                ratio(percentile(during, 0.99), percentile(outside, 0.99)),
                ratio(percentile(during, 1.0), percentile(outside, 1.0)));
    const long failures = load.failures + load.session_failures;
    const bool requests_ok = failures == 0 && requests > 0;
    std::printf(
        "failed requests: %ld (timed: %ld; sessions: %ld failed of %ld create-exec-delete on the "
        "generation in service) (target 0: %s)\n",
        failures, load.failures.load(), load.session_failures.load(),
        load.sessions.load() + load.session_failures.load(), requests_ok ? "PASS" : "FAIL");
    if (!load.first_failure.empty())
      std::printf("  first failure: %s\n", load.first_failure.c_str());
    std::printf("sbx serve exit status after SIGTERM: %d\n", exit_status);
    if (exit_status != 0) print_log_tail();

    const bool all = rss_ok && fds_ok && reload_failures_ == 0 && closed_ok && drained &&
                     images_ok && requests_ok;
    std::printf("\n%s\n", all ? "all targets met" : "some targets missed");
    return o_.check && !all ? 1 : 0;
  }

 private:
  std::map<std::string, std::string> auth() const { return {{"OPEN-SANDBOX-API-KEY", kKey}}; }

  // An operator's replacement of the plugin file: a copy beside it, renamed over it.
  void install(const fs::path& file) const {
    const fs::path next = dir_ / "plugin.so.new";
    fs::copy_file(file, next, fs::copy_options::overwrite_existing);
    fs::rename(next, plugin_);
  }

  // The next build installed and reloaded; the window the reload was in flight. A failure counts.
  Window reload() {
    install(++reloads_ % 2 == 1 ? o_.v2 : o_.v1);
    Window w;
    w.start = Clock::now();
    std::string failure;
    try {
      const auto res = admin_->call(http::verb::post, "/admin/reload");
      w.end = Clock::now();
      if (res.result() != http::status::ok) {
        failure = "HTTP " + std::to_string(res.result_int()) + ": " + res.body();
      } else {
        const json::value report = json::parse(res.body());
        const auto& changed = report.at("changed").as_array();
        if (changed.size() != 1 || changed[0].as_string() != "p")
          failure = "'p' not changed: " + res.body();
      }
    } catch (const std::exception& e) {
      w.end = Clock::now();
      failure = e.what();
    }
    if (failure.empty()) versions_.insert(current_version());
    reload_ms_.push_back(std::chrono::duration<double, std::milli>(w.end - w.start).count());
    if (!failure.empty()) {
      if (reload_failures_++ == 0) first_reload_failure_ = failure;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(o_.gap_ms));
    return w;
  }

  // A client thread: `true` on its sandbox, timed, until stopped; every kSessionEvery requests a
  // session on the generation in service.
  void client(Load& load, int c, const std::string& sandbox) {
    try {
      ServeClient conn(server_->port(), auth());
      auto& samples = load.samples[static_cast<size_t>(c)];
      for (long n = 1; gate_.pass(); ++n) {
        Sample s;
        s.start = Clock::now();
        try {
          s.ok = o_.exec ? conn.run(sandbox, "true") : status_ok(conn, sandbox);
          if (!s.ok) load.failed(request_name() + " on " + sandbox + " failed");
        } catch (const std::exception& e) {
          load.failed(e.what());
        }
        s.end = Clock::now();
        if (!s.ok) ++load.failures;
        samples.push_back(s);
        if (n % kSessionEvery == 0) {
          try {
            const std::string id = conn.create_sandbox("local/any:latest", 600);
            const bool ran = conn.run(id, "true");
            const bool deleted = conn.delete_sandbox(id);
            if (!ran || !deleted) throw std::runtime_error("a session on " + id + " failed");
            ++load.sessions;
          } catch (const std::exception& e) {
            ++load.session_failures;
            load.failed(std::string("session: ") + e.what());
          }
        }
      }
    } catch (const std::exception& e) {
      ++load.failures;
      load.failed(e.what());
    }
    gate_.leave();
  }

  std::string request_name() const {
    return o_.exec ? "POST /v1/sandboxes/{id}/proxy/44772/command \"true\""
                   : "GET /v1/sandboxes/{id}";
  }

  // GET /v1/sandboxes/{id} (the provider's status call, on the sandbox's generation): true when it
  // answers 200 with the sandbox running.
  static bool status_ok(ServeClient& conn, const std::string& sandbox) {
    const auto res = conn.call(http::verb::get, "/v1/sandboxes/" + sandbox);
    return res.result() == http::status::ok && res.body().find("\"Running\"") != std::string::npos;
  }

  json::object providers() {
    const auto res = admin_->call(http::verb::get, "/admin/providers");
    if (res.result() != http::status::ok) die("GET /admin/providers: " + res.body());
    return json::parse(res.body()).as_object();
  }
  size_t generation_count() { return providers().at("generations").as_array().size(); }
  std::string current_version() {
    const json::object report = providers();
    for (const auto& g : report.at("generations").as_array())
      if (g.at("current").as_bool()) return std::string(g.at("plugin_version").as_string());
    return "?";
  }

  // The plugin images the server maps: the first generation's file (in the temp dir) and the
  // copies reloads load (in its TMPDIR, also there).
  std::set<std::string> images() const {
    std::set<std::string> out = sbx::bench::mapped_files(server_->pid(), dir_.string() + "/");
    std::erase_if(out, [](const std::string& f) { return f.find(".so") == std::string::npos; });
    return out;
  }

  // With the clients paused: an old generation with no sandbox left drains first (bounded).
  Row sample(int reload) {
    gate_.close();
    const auto deadline = Clock::now() + 10s;
    while (generation_count() > 2 && Clock::now() < deadline)
      std::this_thread::sleep_for(20ms);
    std::this_thread::sleep_for(100ms);
    Row row = sample_now(reload);
    gate_.open();
    return row;
  }
  Row sample_now(int reload) {
    const pid_t pid = server_->pid();
    return Row{reload,
               sbx::bench::rss_kib(pid),
               sbx::bench::open_files(pid),
               sbx::bench::proc_status(pid, "Threads"),
               generation_count(),
               images().size(),
               sbx::bench::mapping_count(pid)};
  }
  static void print_row(const std::string& label, const Row& r) {
    std::printf("%8s %12.0f %9d %8.0f %12zu %14zu %9zu\n", label.c_str(), r.rss_kib, r.fds,
                r.threads, r.generations, r.images, r.mappings);
  }

  // Whether a request overlapped any reload (the windows are in order and do not overlap).
  static bool overlaps(const std::vector<Window>& windows, const Sample& s) {
    const auto it =
        std::lower_bound(windows.begin(), windows.end(), s.start,
                         [](const Window& w, Clock::time_point t) { return w.end < t; });
    return it != windows.end() && it->start <= s.end;
  }

  void print_log_tail() const {
    std::ifstream log(dir_ / "serve.log");
    std::deque<std::string> last;
    for (std::string line; std::getline(log, line);) {
      last.push_back(line);
      if (last.size() > 8) last.pop_front();
    }
    for (const auto& line : last)
      std::printf("  serve.log: %s\n", line.c_str());
  }

  const Options& o_;
  fs::path dir_;
  fs::path plugin_;
  Gate gate_;
  std::unique_ptr<ServeChild> server_;
  std::unique_ptr<ServeClient> admin_;
  long reloads_ = 0;
  long reload_failures_ = 0;
  std::string first_reload_failure_;
  std::vector<double> reload_ms_;
  std::set<std::string> versions_;  // of the generation in service after each reload
};

int run_benchmark(const Options& o, const fs::path& self_dir) {
  const fs::path sbx = self_dir / "sbx";
  if (access(sbx.c_str(), X_OK) != 0) die(sbx.string() + " is not built");
  for (const auto& file : {o.v1, o.v2})
    if (file.empty() || !fs::is_regular_file(file))
      die("no plugin file '" + file.string() + "' (build test_processes, or give --v1/--v2)");
  char tmpl[] = "/tmp/sbx-reload-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) die("mkdtemp failed");
  struct RemoveDir {
    fs::path path;
    ~RemoveDir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_dir{tmpl};
  Bench bench(o, sbx, remove_dir.path);  // destroyed (the server stopped) before the dir goes
  return bench.run();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  try {
    const fs::path self = fs::canonical("/proc/self/exe").parent_path();
    return run_benchmark(o, self);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reload_loop: %s\n", e.what());
    return 2;
  }
}
