// The opensandbox plugin against the official OpenSandbox Python SDK (PyPI opensandbox 1.1.1,
// async API), both clients of ONE `sbx serve --provider local_docker` this program starts:
//
//   1. client CPU per exec, same workload, same concurrency: S sandboxes created concurrently,
//      each then running N `echo hi` one after the other (stdout and exit code 0 checked), the S
//      sandboxes in parallel, then all closed. Each side runs in its own child process and
//      measures its own user+sys CPU (getrusage(RUSAGE_SELF) deltas around the workload: no
//      interpreter start, imports or plugin loading), reported as one JSON line on stdout. The
//      sides alternate (which goes first too) for R rounds; medians.
//                                          target: python / plugin >= 10x CPU per exec
//   2. threads with 1,000 execs in flight (plugin only, in a child process): E sandboxes (created
//      2 at a time), then K execs started at once with Sandbox::exec_async, K/E per sandbox, each
//      printing a line and then sleeping until one common moment, H s after the submission (an
//      exec that starts later ends at once); /proc/self/task is counted every 50 ms while they
//      run. An exec is in flight from its first output line to its completion; the figure is the
//      most threads seen while all K were in flight at once.           target: <= 8 threads
//      H must exceed the time the server needs to start K execs: about 45 s for 1,000 on a
//      2-core machine, so H is 90 s (--hold).
//
// Usage: opensandbox_vs_python [--quick] [--check] [--image IMAGE] [--sandboxes S] [--execs N]
//          [--rounds R] [--exec-sandboxes E] [--in-flight K] [--hold H] [--python PATH]
//   --check   exit 1 when a target is missed (otherwise 0: this is a report); 2 on an error
//   --python  the venv interpreter with opensandbox 1.1.1; default the build tree's
//             clients/venv/bin/python, installed by tests/clients/setup.sh when missing
// Runs build/bin/sbx (next to this program) as `sbx serve` on 127.0.0.1:0 without an API key, the
// plugin in direct mode (as the SDK by default). Needs the daemon and images of
// scripts/docker-up.sh. Every sandbox is closed, also on failure (the server's graceful stop is
// the backstop); at the end the daemon must hold no container of this server. Not part of ctest.

#include <sbx/sbx.hpp>

#include "bench_util.hpp"
#include "serve_child.hpp"

#include <boost/json.hpp>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace json = boost::json;
namespace fs = std::filesystem;
using sbx::bench::Clock;
using sbx::bench::median;
using sbx::bench::ms_since;
using sbx::bench::ServeChild;

struct Options {
  bool quick = false;
  bool check = false;
  std::string image = "sbx-busybox:latest";
  int sandboxes = 4;        // S
  int execs = 50;           // N, per sandbox
  int rounds = 3;           // R
  int exec_sandboxes = 10;  // E
  int in_flight = 1000;     // K
  double hold_s = 90;       // H: the K execs end H s after their submission
  std::string python;       // empty: the build tree's venv
  // Set in the child processes the benchmark starts: "plugin" (part 1) or "threads" (part 2),
  // with the plugin's host config file.
  std::string child;
  std::string config;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--quick] [--check] [--image IMAGE] [--sandboxes S] [--execs N] "
               "[--rounds R] [--exec-sandboxes E] [--in-flight K] [--hold H] [--python PATH]\n",
               argv0);
  std::exit(2);
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--check") {
      o.check = true;
    } else if (arg == "--image") {
      o.image = value();
    } else if (arg == "--sandboxes") {
      o.sandboxes = std::stoi(value());
    } else if (arg == "--execs") {
      o.execs = std::stoi(value());
    } else if (arg == "--rounds") {
      o.rounds = std::stoi(value());
    } else if (arg == "--exec-sandboxes") {
      o.exec_sandboxes = std::stoi(value());
    } else if (arg == "--in-flight") {
      o.in_flight = std::stoi(value());
    } else if (arg == "--hold") {
      o.hold_s = std::stod(value());
    } else if (arg == "--python") {
      o.python = value();
    } else if (arg == "--child") {
      o.child = value();
    } else if (arg == "--config") {
      o.config = value();
    } else {
      usage(argv[0]);
    }
  }
  // --quick: one round. N stays: the CPU per exec over the whole workload includes the creates,
  // so the ratio depends on N, and a smaller N would not be the target's figure.
  if (o.quick) o.rounds = 1;
  if (o.sandboxes < 1 || o.execs < 1 || o.rounds < 1 || o.exec_sandboxes < 1 ||
      o.in_flight < o.exec_sandboxes || o.hold_s <= 0)
    usage(argv[0]);
  return o;
}

// Raises the soft limit on open files to the hard one: K execs in flight are K connections here
// and more in the server.
void raise_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// ---- In the child processes ---------------------------------------------------------------------

// This process's user and sys CPU so far, in ms (every thread).
struct Cpu {
  double user = 0, sys = 0;
  double total() const { return user + sys; }
};
Cpu cpu_now() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return {ms(usage.ru_utime), ms(usage.ru_stime)};
}

// This process's threads: the entries of /proc/self/task.
int thread_count() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) throw std::runtime_error("cannot read /proc/self/task");
  int n = 0;
  while (const dirent* entry = readdir(dir))
    if (entry->d_name[0] != '.') ++n;
  closedir(dir);
  return n;
}

// This process's threads by name (/proc/self/task/*/comm): "name xCOUNT, ..." (most first), to
// say which threads there are.
std::string thread_names() {
  std::map<std::string, int> names;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    std::string name;
    std::getline(std::ifstream(task.path() / "comm"), name);
    ++names[name];
  }
  std::vector<std::pair<int, std::string>> by_count;
  for (const auto& [name, count] : names)
    by_count.emplace_back(count, name);
  std::sort(by_count.rbegin(), by_count.rend());
  std::string text;
  for (const auto& [count, name] : by_count)
    text += (text.empty() ? "" : ", ") + name + " x" + std::to_string(count);
  return text;
}

// A number of seconds as text, without trailing zeros ("90", "2.5").
std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

// CPU and wall time of consecutive phases from one starting point, as the Python side's.
class Phases {
 public:
  void mark(const std::string& name) {
    const Cpu cpu = cpu_now();
    figures_[name + "_cpu_ms"] = cpu.total() - cpu_.total();
    figures_[name + "_wall_ms"] = ms_since(wall_);
    cpu_ = cpu;
    wall_ = Clock::now();
  }
  json::object total() {
    figures_["cpu_ms"] = cpu_.total() - start_cpu_.total();
    figures_["user_cpu_ms"] = cpu_.user - start_cpu_.user;
    figures_["sys_cpu_ms"] = cpu_.sys - start_cpu_.sys;
    figures_["wall_ms"] = std::chrono::duration<double, std::milli>(wall_ - start_wall_).count();
    return figures_;
  }

 private:
  json::object figures_;
  Cpu start_cpu_ = cpu_now(), cpu_ = start_cpu_;
  Clock::time_point start_wall_ = Clock::now(), wall_ = start_wall_;
};

// The sandbox both sides ask for: the SDK's default resources (1 cpu, 2 GiB) and entrypoint.
sbx::SandboxSpec bench_spec(const Options& o) {
  sbx::SandboxSpec spec;
  spec.image = o.image;
  spec.ttl_s = 1800;
  spec.resources.cpu = 1;
  spec.resources.memory_mib = 2048;
  spec.metadata["bench"] = "opensandbox_vs_python";
  return spec;
}

// Creates `count` sandboxes, `at_once` at a time. When one fails, the others are closed (by their
// destructors) and the first error is thrown.
std::vector<sbx::Sandbox> create_sandboxes(const sbx::Provider& provider,
                                           const sbx::SandboxSpec& spec, int count, int at_once) {
  std::vector<sbx::Sandbox> boxes;
  std::exception_ptr error;
  for (int first = 0; first < count; first += at_once) {
    std::vector<sbx::Operation<sbx::Sandbox>> creating;
    for (int i = first; i < std::min(count, first + at_once); ++i)
      creating.push_back(provider.create_async(spec));
    for (auto& op : creating) {
      try {
        boxes.push_back(op.get());
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }
  return boxes;
}

// Closes every sandbox (all at once); throws the first error after trying them all.
void close_sandboxes(std::vector<sbx::Sandbox>& boxes) {
  std::vector<sbx::Operation<void>> closing;
  for (auto& box : boxes)
    closing.push_back(box.close_async());
  std::exception_ptr error;
  for (auto& op : closing) {
    try {
      op.get();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// Part 1, plugin side: the workload, and this process's CPU over it. The sandboxes run their
// execs on one thread each, the natural use of the synchronous host API.
json::object plugin_workload(const Options& o, const sbx::Provider& provider) {
  Phases phases;
  std::vector<sbx::Sandbox> boxes =
      create_sandboxes(provider, bench_spec(o), o.sandboxes, o.sandboxes);
  phases.mark("create");
  std::vector<std::string> errors(boxes.size());
  std::vector<std::thread> threads;
  for (size_t b = 0; b < boxes.size(); ++b) {
    threads.emplace_back([&, b] {
      try {
        for (int i = 0; i < o.execs && errors[b].empty(); ++i) {
          const sbx::ExecResult r = boxes[b].exec("echo hi");
          if (r.return_code != 0 || r.stdout_text != "hi\n")
            errors[b] = "echo hi in " + boxes[b].id() + ": exit code " +
                        std::to_string(r.return_code) + " " + r.error_type.value_or("") +
                        ", stdout '" + r.stdout_text + "', stderr '" + r.stderr_text + "'";
        }
      } catch (const std::exception& e) {
        errors[b] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
  phases.mark("exec");
  close_sandboxes(boxes);
  phases.mark("close");
  json::object result = phases.total();
  result["side"] = "plugin";
  result["sandboxes"] = o.sandboxes;
  result["execs"] = o.sandboxes * o.execs;
  return result;
}

// Part 2: K execs started at once, this process's threads sampled every 50 ms (on this thread,
// so the sampling adds no thread) until all have completed.
json::object threads_workload(const Options& o, const sbx::Provider& provider) {
  std::vector<sbx::Sandbox> boxes = create_sandboxes(provider, bench_spec(o), o.exec_sandboxes, 2);
  const int idle_threads = thread_count();
  const std::string idle_names = thread_names();

  // What the continuations and output callbacks (plugin threads) count; shared with them, so
  // it outlives any callback even if this function leaves early.
  struct Flight {
    explicit Flight(int n) : first_output(static_cast<size_t>(n)) {}
    std::vector<std::atomic<bool>> first_output;
    std::atomic<int> started{0};             // execs whose first output arrived
    std::atomic<int> completed{0};           // execs whose operation completed (however)
    std::atomic<Clock::rep> all_started{0};  // when the last first output arrived
  };
  const auto flight = std::make_shared<Flight>(o.in_flight);
  // The moment every exec ends (the containers share this machine's clock).
  const auto release = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count() +
                       static_cast<long>(std::ceil(o.hold_s));
  const std::string command = "echo started; t=$((" + std::to_string(release) +
                              " - $(date +%s))); if [ $t -gt 0 ]; then sleep $t; fi";
  std::vector<sbx::Operation<sbx::ExecResult>> ops;
  const auto start = Clock::now();
  for (int i = 0; i < o.in_flight; ++i) {
    sbx::ExecOptions options;
    options.timeout_s = o.hold_s + 120;
    options.on_output = [flight, i, k = o.in_flight](sbx::OutputStream, std::string_view) {
      if (!flight->first_output[static_cast<size_t>(i)].exchange(true) && ++flight->started == k)
        flight->all_started = Clock::now().time_since_epoch().count();
    };
    ops.push_back(boxes[static_cast<size_t>(i % o.exec_sandboxes)].exec_async(command, options));
    ops.back().then([flight](sbx::Operation<sbx::ExecResult>&) { ++flight->completed; });
  }
  const double submit_ms = ms_since(start);

  int max_threads = 0, max_threads_all = -1, peak_in_flight = 0, samples_all = 0;
  std::string max_names;  // the threads by name at the first sample with the most
  const auto deadline = start + std::chrono::seconds(1200);
  while (flight->completed < o.in_flight && Clock::now() < deadline) {
    const int threads = thread_count();
    const int started = flight->started;  // read before `completed`: never over-counts
    const int completed = flight->completed;
    if (threads > max_threads) {
      max_threads = threads;
      max_names = thread_names();
    }
    peak_in_flight = std::max(peak_in_flight, started - completed);
    if (started == o.in_flight && completed == 0) {  // all K in flight at this moment
      ++samples_all;
      max_threads_all = std::max(max_threads_all, threads);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double all_done_ms = ms_since(start);
  const double all_started_ms =
      flight->all_started == 0
          ? -1
          : std::chrono::duration<double, std::milli>(
                Clock::time_point(Clock::duration(flight->all_started)) - start)
                .count();
  const bool timed_out = flight->completed < o.in_flight;
  if (timed_out)
    for (auto& op : ops)
      op.cancel();

  int failed = 0;
  std::string first_failure;
  for (auto& op : ops) {
    try {
      const sbx::ExecResult r = op.get();
      if (r.return_code != 0) {
        ++failed;
        if (first_failure.empty())
          first_failure = "exit code " + std::to_string(r.return_code) + " " +
                          r.error_type.value_or("") + " " + r.stderr_text;
      }
    } catch (const std::exception& e) {
      ++failed;
      if (first_failure.empty()) first_failure = e.what();
    }
  }
  const int threads_after = thread_count();
  close_sandboxes(boxes);
  if (timed_out) throw std::runtime_error("the execs did not all complete within 1200 s");

  json::object result;
  result["side"] = "threads";
  result["idle_threads"] = idle_threads;
  result["idle_thread_names"] = idle_names;
  result["max_thread_names"] = max_names;
  result["max_threads"] = max_threads;
  result["max_threads_all_in_flight"] = max_threads_all;
  result["samples_all_in_flight"] = samples_all;
  result["peak_in_flight"] = peak_in_flight;
  result["submit_ms"] = submit_ms;
  result["all_started_ms"] = all_started_ms;
  result["all_done_ms"] = all_done_ms;
  result["threads_after"] = threads_after;
  result["failed"] = failed;
  result["first_failure"] = first_failure;
  return result;
}

// A child process's main: a host with the plugin's config, one workload, one JSON line.
int child_main(const Options& o) {
  try {
    raise_file_limit();
    sbx::Host::Options host_options;
    host_options.config = sbx::Config::load(o.config);
    host_options.labels["sbx.bench"] = "opensandbox_vs_python";
    sbx::Host host(std::move(host_options));
    const sbx::Provider provider = host.provider("os");
    const json::object result =
        o.child == "plugin" ? plugin_workload(o, provider) : threads_workload(o, provider);
    std::printf("%s\n", json::serialize(result).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::printf("%s\n", json::serialize(json::object{{"error", e.what()}}).c_str());
    return 1;
  }
}

// ---- In the benchmark process -------------------------------------------------------------------

// Set by SIGINT or SIGTERM: the running child is stopped and the benchmark unwinds (stopping the
// server, which closes what the child left).
volatile sig_atomic_t g_interrupted = 0;
void on_signal(int) {
  g_interrupted = 1;
}

// Runs `argv` (stderr shared with this process), returns the JSON object of the last line of its
// stdout that is one. Throws with the child's own message when it reports {"error"}, exits
// non-zero or outlives `timeout_s` (then it is killed; the server's stop closes what it left).
json::object run_child(const std::string& what, const std::vector<std::string>& argv,
                       double timeout_s) {
  if (g_interrupted) throw std::runtime_error(what + ": interrupted");
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    std::vector<char*> args;
    for (const auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  bool killed = false;
  for (;;) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 200) > 0) {
      char buf[4096];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    if (!killed && (g_interrupted || Clock::now() > deadline)) {
      kill(pid, g_interrupted ? SIGTERM : SIGKILL);
      killed = true;
    }
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (killed && g_interrupted) throw std::runtime_error(what + ": interrupted");
  if (killed) throw std::runtime_error(what + ": killed after " + std::to_string(timeout_s) + " s");
  std::optional<json::object> result;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    if (!line.empty() && line.front() == '{') {
      boost::system::error_code ec;
      json::value v = json::parse(line, ec);
      if (!ec && v.is_object()) result = v.as_object();
    }
    at = end + 1;
  }
  if (result && result->contains("error"))
    throw std::runtime_error(what + ": " + std::string(result->at("error").as_string()));
  if (!result || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(what + " failed (exit status " + std::to_string(status) +
                             ") without a result; its stdout: " + text.substr(0, 500));
  return *result;
}

double number(const json::object& o, const char* key) {
  return o.at(key).to_number<double>();
}

std::string first_line_of(const std::string& command) {
  std::string line;
  if (FILE* p = popen(command.c_str(), "r")) {
    char buf[256];
    if (fgets(buf, sizeof buf, p) != nullptr) line = buf;
    pclose(p);
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r'))
    line.pop_back();
  return line;
}

// The containers of this server's run still on the daemon (there must be none once it stopped).
int leftover_containers(const std::string& run_label) {
  const std::string n = first_line_of(
      "docker ps -aq --filter label=sbx.serve=true --filter label=sbx.run=" + run_label +
      " | wc -l");
  return n.empty() ? -1 : std::stoi(n);
}

// The interpreter of the Python side: --python, else the build tree's venv (installed by
// tests/clients/setup.sh, as the client tests do, when missing).
fs::path python_interpreter(const Options& o) {
  if (!o.python.empty()) return o.python;
  const fs::path clients = SBX_BENCH_CLIENTS_DIR;
  const fs::path python = clients / "venv/bin/python";
  if (access(python.c_str(), X_OK) != 0) {
    std::printf("no %s: running tests/clients/setup.sh\n", python.c_str());
    std::fflush(stdout);
    const std::string setup = std::string("bash '") + SBX_BENCH_SOURCE_DIR +
                              "/tests/clients/setup.sh' '" + clients.string() + "' 1>&2";
    if (std::system(setup.c_str()) != 0)
      throw std::runtime_error("tests/clients/setup.sh failed: no Python SDK to measure");
  }
  return python;
}

struct Round {
  json::object plugin, python;
};

// Part 1: R rounds of both sides on the same server, alternating which goes first.
std::vector<Round> measure_cpu(const Options& o, const fs::path& self, const fs::path& python,
                               const fs::path& plugin_config, int port) {
  // The same workload arguments on both sides.
  const std::vector<std::string> workload = {"--image",     o.image,
                                             "--sandboxes", std::to_string(o.sandboxes),
                                             "--execs",     std::to_string(o.execs)};
  auto with_workload = [&](std::vector<std::string> argv) {
    argv.insert(argv.end(), workload.begin(), workload.end());
    return argv;
  };
  const auto plugin_argv =
      with_workload({self.string(), "--child", "plugin", "--config", plugin_config.string()});
  const auto python_argv = with_workload({python.string(), SBX_BENCH_PYTHON_WORKLOAD, "--domain",
                                          "127.0.0.1:" + std::to_string(port)});
  const double timeout_s = 300 + 5.0 * o.execs;
  std::vector<Round> rounds;
  for (int r = 0; r < o.rounds; ++r) {
    Round round;
    if (r % 2 == 0) {
      round.plugin = run_child("the plugin side", plugin_argv, timeout_s);
      round.python = run_child("the Python side", python_argv, timeout_s);
    } else {
      round.python = run_child("the Python side", python_argv, timeout_s);
      round.plugin = run_child("the plugin side", plugin_argv, timeout_s);
    }
    const double execs = o.sandboxes * o.execs;
    std::printf(
        "round %d (%s first): plugin %.1f ms CPU (%.3f ms/exec), %.2f s wall; "
        "python %.1f ms CPU (%.3f ms/exec), %.2f s wall\n",
        r + 1, r % 2 == 0 ? "plugin" : "python", number(round.plugin, "cpu_ms"),
        number(round.plugin, "cpu_ms") / execs, number(round.plugin, "wall_ms") / 1000,
        number(round.python, "cpu_ms"), number(round.python, "cpu_ms") / execs,
        number(round.python, "wall_ms") / 1000);
    std::fflush(stdout);
    rounds.push_back(std::move(round));
  }
  return rounds;
}

// Part 2: one run of the threads workload in a child process.
json::object measure_threads(const Options& o, const fs::path& self,
                             const fs::path& plugin_config) {
  return run_child("the threads measurement",
                   {self.string(), "--child", "threads", "--config", plugin_config.string(),
                    "--image", o.image, "--exec-sandboxes", std::to_string(o.exec_sandboxes),
                    "--in-flight", std::to_string(o.in_flight), "--hold", seconds_text(o.hold_s)},
                   1500);
}

// The plugin's host config: the server in direct mode without a key, no readiness probe (the SDK
// has none: both sides create, fetch the execd endpoint and poll /ping), no create retries (a
// failure is reported, not hidden). `max_connections`: one connection per exec in flight.
std::string plugin_config(int port, int max_connections) {
  return json::serialize(json::object{
      {"providers",
       json::object{
           {"os", json::object{
                      {"plugin", "opensandbox"},
                      {"config",
                       json::object{{"connection",
                                     json::object{{"domain", "127.0.0.1:" + std::to_string(port)},
                                                  {"api_key", nullptr},
                                                  {"request_timeout_s", 120},
                                                  {"max_connections", max_connections}}},
                                    {"create", json::object{{"retries", 0}}},
                                    {"probe", json::object{{"command", nullptr}}}}}}}}}});
}

// Versions for the header: the plugins as the host's probe read them, Docker's server.
std::string versions() {
  std::string plugins;
  sbx::Host host;
  for (const auto& p : host.plugins())
    if (p.ok() && (p.name == "opensandbox" || p.name == "local_docker"))
      plugins += ", " + p.name + " plugin " + p.version;
  return std::string("sbx ") + SBX_BENCH_SBX_VERSION + plugins + ", Docker " +
         first_line_of("docker version --format '{{.Server.Version}}' 2>/dev/null");
}

void print_figure(const char* what, double plugin, double python, const char* unit) {
  std::printf("%-44s %10.3f %10.3f %8.1fx   %s\n", what, plugin, python, python / plugin, unit);
}

// Prints part 1's medians; true when the target is met.
bool report_cpu(const Options& o, const std::vector<Round>& rounds) {
  const double execs = o.sandboxes * o.execs;
  auto med = [&](bool plugin, const char* key) {
    std::vector<double> v;
    for (const auto& r : rounds)
      v.push_back(number(plugin ? r.plugin : r.python, key));
    return median(v);
  };
  const double plugin_per_exec = med(true, "cpu_ms") / execs;
  const double python_per_exec = med(false, "cpu_ms") / execs;
  const double ratio = python_per_exec / plugin_per_exec;
  const bool ok = ratio >= 10;
  std::printf("\n1. client CPU (Python side: Python %s, opensandbox %s)\n",
              std::string(rounds[0].python.at("python").as_string()).c_str(),
              std::string(rounds[0].python.at("sdk").as_string()).c_str());
  std::printf("medians of %zu round(s)%21s %10s %10s %9s\n", rounds.size(), "", "plugin", "python",
              "py/plugin");
  print_figure("CPU per exec, whole workload (ms)", plugin_per_exec, python_per_exec,
               ok ? "target >= 10x: PASS" : "target >= 10x: FAIL");
  print_figure("  of which user (ms)", med(true, "user_cpu_ms") / execs,
               med(false, "user_cpu_ms") / execs, "");
  print_figure("  of which sys (ms)", med(true, "sys_cpu_ms") / execs,
               med(false, "sys_cpu_ms") / execs, "");
  print_figure("CPU per exec, exec phase only (ms)", med(true, "exec_cpu_ms") / execs,
               med(false, "exec_cpu_ms") / execs, "");
  print_figure("CPU of the creates (ms, all S)", med(true, "create_cpu_ms"),
               med(false, "create_cpu_ms"), "");
  print_figure("CPU of the closes (ms, all S)", med(true, "close_cpu_ms"),
               med(false, "close_cpu_ms"), "");
  print_figure("wall time of the workload (s)", med(true, "wall_ms") / 1000,
               med(false, "wall_ms") / 1000, "");
  print_figure("wall time of the exec phase (s)", med(true, "exec_wall_ms") / 1000,
               med(false, "exec_wall_ms") / 1000, "");
  return ok;
}

// Prints part 2's figures; true when the target is met.
bool report_threads(const Options& o, const json::object& t) {
  const bool all_in_flight = number(t, "samples_all_in_flight") > 0;
  const int max_all = static_cast<int>(number(t, "max_threads_all_in_flight"));
  const bool all_ok = number(t, "failed") == 0;
  const bool ok = all_in_flight && max_all <= 8 && all_ok;
  std::printf("\n2. threads of the plugin's process, %d execs started at once on %d sandboxes\n",
              o.in_flight, o.exec_sandboxes);
  std::printf("   threads idle (sandboxes created, no exec): %.0f\n", number(t, "idle_threads"));
  if (all_in_flight)
    std::printf("   max threads while all %d were in flight: %d (%.0f samples)\n", o.in_flight,
                max_all, number(t, "samples_all_in_flight"));
  else
    std::printf("   all %d in flight at once: never (at most %.0f at once)\n", o.in_flight,
                number(t, "peak_in_flight"));
  std::printf("   max threads while any was running: %.0f; after all completed: %.0f\n",
              number(t, "max_threads"), number(t, "threads_after"));
  std::printf("   threads by name, idle: %s\n",
              std::string(t.at("idle_thread_names").as_string()).c_str());
  std::printf("   threads by name, at the most: %s\n",
              std::string(t.at("max_thread_names").as_string()).c_str());
  const double all_started_s = number(t, "all_started_ms") / 1000;
  std::printf("   submitting took %.0f ms; ", number(t, "submit_ms"));
  if (all_started_s >= 0)
    std::printf("the last one started after %.1f s; ", all_started_s);
  else
    std::printf("not every one started; ");
  std::printf("all completed after %.1f s\n", number(t, "all_done_ms") / 1000);
  std::printf("   exits: %.0f of %d not 0%s%s\n", number(t, "failed"), o.in_flight,
              all_ok ? "" : "; first: ", std::string(t.at("first_failure").as_string()).c_str());
  std::printf("   target: all in flight at once with <= 8 threads, every exit 0: %s\n",
              ok ? "PASS" : "FAIL");
  return ok;
}

int run_benchmark(const Options& o, const fs::path& self) {
  raise_file_limit();
  struct sigaction action {};
  action.sa_handler = on_signal;  // no SA_RESTART: poll() in run_child returns at once
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  const fs::path sbx = self.parent_path() / "sbx";
  if (access(sbx.c_str(), X_OK) != 0) throw std::runtime_error(sbx.string() + " is not built");
  const fs::path python = python_interpreter(o);
  char tmpl[] = "/tmp/sbx-osbench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  const fs::path dir = tmpl;
  struct RemoveDir {
    fs::path path;
    ~RemoveDir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_dir{dir};

  std::printf(
      "opensandbox plugin vs the official OpenSandbox Python SDK, against one sbx serve "
      "over local_docker\n");
  std::printf("%s; Python side: %s\n", versions().c_str(), python.c_str());
  std::printf(
      "image %s; 1: S=%d sandboxes x N=%d 'echo hi', R=%d round(s); 2: E=%d sandboxes, "
      "K=%d execs (a line, then sleep until submission + %g s)%s\n",
      o.image.c_str(), o.sandboxes, o.execs, o.rounds, o.exec_sandboxes, o.in_flight, o.hold_s,
      o.quick ? " (--quick)" : "");
  std::fflush(stdout);

  // local_docker's exec.concurrency above the execs in flight: every one really runs in the
  // server (it runs at most that many at once and queues the rest).
  const int concurrency = std::max(64, o.in_flight + o.sandboxes + 16);
  std::ofstream(dir / "serve.json") << json::serialize(json::object{
      {"providers",
       json::object{
           {"docker",
            json::object{{"plugin", "local_docker"},
                         {"config",
                          json::object{{"exec", json::object{{"concurrency", concurrency}}}}}}}}}});
  ServeChild server(sbx, dir / "serve.json", dir / "serve.log");
  std::ofstream(dir / "cpu.json") << plugin_config(server.port(), 100);
  std::ofstream(dir / "threads.json") << plugin_config(server.port(), o.in_flight + 16);
  std::printf(
      "sbx serve on 127.0.0.1:%d (sbx.run=%s), local_docker exec.concurrency %d; plugin: "
      "direct mode, no key, no probe, create.retries 0, max_connections 100 (part 2: %d)\n",
      server.port(), server.run_label().c_str(), concurrency, o.in_flight + 16);
  std::fflush(stdout);

  std::vector<Round> rounds;
  std::optional<json::object> threads;
  std::string failure;
  try {
    rounds = measure_cpu(o, self, python, dir / "cpu.json", server.port());
    threads = measure_threads(o, self, dir / "threads.json");
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const int serve_status = server.stop();
  const int left = leftover_containers(server.run_label());

  bool ok = true;
  if (!rounds.empty()) ok = report_cpu(o, rounds) && ok;
  if (threads) ok = report_threads(o, *threads) && ok;
  std::printf(
      "\nsbx serve exit status after SIGTERM: %d; containers of its run left on the "
      "daemon: %d\n",
      serve_status, left);
  if (!failure.empty()) {
    std::printf("ERROR: %s\n", failure.c_str());
    return 2;
  }
  if (serve_status != 0 || left != 0) return 2;
  std::printf("\n%s\n", ok ? "all targets met" : "some targets missed");
  return o.check && !ok ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  if (!o.child.empty()) return child_main(o);
  try {
    return run_benchmark(o, fs::canonical("/proc/self/exe"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opensandbox_vs_python: %s\n", e.what());
    return 2;
  }
}
