// local_docker (through the sbx host API) against the docker CLI command sequence NeMo Gym's
// DockerProvider runs (`docker run -d ... sleep`, `docker exec` for the probe and each command,
// `docker rm -f`), side by side in one run:
//   - median latency of a trivial exec                   target: local_docker >= 1.4x lower
//   - client CPU time per exec (this process's getrusage for local_docker, RUSAGE_CHILDREN for
//     the CLI processes)                                  target: >= 20x lower
//   - exec throughput with 32 sandboxes, 32 client threads each looping execs for a fixed time
//                                                          target: >= 1.5x higher
// Also reported, without a target: create-to-ready time.
//
// Usage: local_docker_vs_cli [--quick] [--check] [--image IMAGE] [--docker PATH] [--seconds N]
//   --check   exit 1 when a target is missed (otherwise the exit code is 0: this is a report)
// Needs the daemon and images of scripts/docker-up.sh. Not part of ctest.

#include <sbx/sbx.hpp>

#include "bench_util.hpp"

#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using sbx::bench::Clock;
using sbx::bench::median;
using sbx::bench::ms_since;
using sbx::bench::percentile;
using sbx::bench::throughput;

struct Options {
  bool quick = false;
  bool check = false;
  std::string image = "sbx-busybox:latest";
  std::string docker = "/usr/bin/docker";
  int latency_samples = 200;
  int create_samples = 5;
  int sandboxes = 32;
  double throughput_seconds = 20;
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--check") {
      o.check = true;
    } else if (arg == "--image") {
      o.image = value();
    } else if (arg == "--docker") {
      o.docker = value();
    } else if (arg == "--seconds") {
      o.throughput_seconds = std::stod(value());
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--check] [--image IMAGE] [--docker PATH] [--seconds N]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  if (o.quick) {
    o.latency_samples = 40;
    o.create_samples = 2;
    o.throughput_seconds = std::min(o.throughput_seconds, 5.0);
  }
  return o;
}

double cpu_ms(int who) {
  rusage usage{};
  getrusage(who, &usage);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(usage.ru_utime) + ms(usage.ru_stime);
}

std::string random_hex() {
  std::random_device device;
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%08x%08x", device(), device());
  return buffer;
}

// ---- The docker CLI, spawned like NeMo Gym's provider does (no shell in between) ----------------

class Cli {
 public:
  explicit Cli(std::string binary) : binary_(std::move(binary)) {}

  // Runs `docker args...`, output discarded; returns the exit status (-1 if it could not run).
  int run(const std::vector<std::string>& args) const {
    std::vector<std::string> full{binary_};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : full)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, binary_.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return -1;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
      if (errno != EINTR) return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // NeMo Gym's create: docker run -d --name N --label ... --init --network none --rm
  // --entrypoint /bin/sh IMAGE -c "sleep <ttl>", then the readiness probe through docker exec.
  bool create(const std::string& name, const std::string& image,
              const std::string& run_label) const {
    if (run({"run", "-d", "--name", name, "--label", "nemo-gym.sandbox=1", "--label", run_label,
             "--init", "--network", "none", "--rm", "--entrypoint", "/bin/sh", image, "-c",
             "sleep 600"}) != 0) {
      return false;
    }
    return exec(name, "printf docker-sandbox-ready") == 0;
  }
  int exec(const std::string& name, const std::string& command) const {
    return run({"exec", name, "sh", "-c", command});
  }
  void remove(const std::string& name) const { run({"rm", "-f", name}); }

 private:
  std::string binary_;
};

// Removes the CLI's containers however the benchmark ends.
struct CliContainers {
  const Cli& cli;
  std::vector<std::string> names;
  ~CliContainers() {
    for (const auto& name : names)
      cli.remove(name);
  }
};

struct Row {
  const char* what;
  double sbx;
  double cli;
  bool lower_is_better;
  double target;  // ratio target; 0 = informational
};

// Ends the run through main's handler, so that every container is removed on the way out.
[[noreturn]] void die(const std::string& message) {
  throw std::runtime_error(message);
}

// ---- The measurements ---------------------------------------------------------------------------

sbx::SandboxSpec sandbox_spec(const Options& o) {
  sbx::SandboxSpec spec;
  spec.image = o.image;
  spec.ttl_s = 600;  // the same lifetime the CLI containers get
  return spec;
}

struct Latency {
  std::vector<double> ms;
  double cpu_per_exec_ms = 0;
};

Latency sbx_latency(sbx::Sandbox& box, int samples) {
  for (int i = 0; i < 10; ++i)
    box.exec("true");  // warm connections and the pool
  Latency out;
  const double cpu_before = cpu_ms(RUSAGE_SELF);
  for (int i = 0; i < samples; ++i) {
    const auto start = Clock::now();
    const auto r = box.exec("true");
    out.ms.push_back(ms_since(start));
    if (r.return_code != 0) die("local_docker exec failed");
  }
  out.cpu_per_exec_ms = (cpu_ms(RUSAGE_SELF) - cpu_before) / samples;
  return out;
}

Latency cli_latency(const Cli& cli, const std::string& name, int samples) {
  for (int i = 0; i < 3; ++i)
    cli.exec(name, "true");
  Latency out;
  const double cpu_before = cpu_ms(RUSAGE_CHILDREN);
  for (int i = 0; i < samples; ++i) {
    const auto start = Clock::now();
    const int rc = cli.exec(name, "true");
    out.ms.push_back(ms_since(start));
    if (rc != 0) die("docker exec failed with status " + std::to_string(rc));
  }
  out.cpu_per_exec_ms = (cpu_ms(RUSAGE_CHILDREN) - cpu_before) / samples;
  return out;
}

void print_table(const std::vector<Row>& rows, bool& all_pass) {
  std::printf("\n%-34s %14s %14s %9s %8s %7s\n", "", "local_docker", "docker CLI", "ratio",
              "target", "result");
  for (const Row& r : rows) {
    const double ratio = r.lower_is_better ? r.cli / r.sbx : r.sbx / r.cli;
    char target[16] = "-";
    const char* result = "";
    if (r.target > 0) {
      std::snprintf(target, sizeof target, ">=%.1fx", r.target);
      result = ratio >= r.target ? "PASS" : "FAIL";
      if (ratio < r.target) all_pass = false;
    }
    std::printf("%-34s %14.2f %14.2f %8.1fx %8s %7s\n", r.what, r.sbx, r.cli, ratio, target,
                result);
  }
}

int run_benchmark(const Options& o) {
  const Cli cli(o.docker);
  if (access(o.docker.c_str(), X_OK) != 0) die(o.docker + " is not executable");
  if (cli.run({"version"}) != 0) die(o.docker + " cannot talk to the daemon");

  const std::string run = random_hex();
  sbx::Host::Options host_options;
  host_options.config = sbx::Config::parse(
      R"({"providers": {"docker": {"plugin": "local_docker", "config": {}}}})", "bench");
  host_options.labels["sbx.bench"] = run;
  sbx::Host host(std::move(host_options));
  sbx::Provider provider = host.provider("docker");
  CliContainers cli_containers{cli, {}};
  auto cli_name = [&](int i) { return "sbx-bench-cli-" + run + "-" + std::to_string(i); };

  std::printf("local_docker vs the docker CLI sequence of NeMo Gym's DockerProvider\n");
  std::printf("image %s, network none, CLI %s, %d latency samples, %d sandboxes x %.0f s%s\n",
              o.image.c_str(), o.docker.c_str(), o.latency_samples, o.sandboxes,
              o.throughput_seconds, o.quick ? " (--quick)" : "");
  std::fflush(stdout);

  // Create to ready: sbx create (pull check, create, start, probe, shell detection) against
  // docker run + the probe exec.
  std::vector<double> sbx_create_ms, cli_create_ms;
  for (int i = 0; i < o.create_samples; ++i) {
    auto start = Clock::now();
    sbx::Sandbox box = provider.create(sandbox_spec(o));
    sbx_create_ms.push_back(ms_since(start));
    box.close();
    const std::string name = cli_name(1000 + i);
    cli_containers.names.push_back(name);
    start = Clock::now();
    if (!cli.create(name, o.image, "sbx.bench=" + run)) die("docker run failed");
    cli_create_ms.push_back(ms_since(start));
    cli.remove(name);
  }

  // Sequential exec latency and client CPU.
  sbx::Sandbox box = provider.create(sandbox_spec(o));
  const Latency sbx_lat = sbx_latency(box, o.latency_samples);
  box.close();
  cli_containers.names.push_back(cli_name(0));
  if (!cli.create(cli_name(0), o.image, "sbx.bench=" + run)) die("docker run failed");
  const Latency cli_lat = cli_latency(cli, cli_name(0), o.latency_samples);
  cli.remove(cli_name(0));
  std::printf("latency done: local_docker p50 %.2f ms p90 %.2f ms; CLI p50 %.2f ms p90 %.2f ms\n",
              median(sbx_lat.ms), percentile(sbx_lat.ms, 0.9), median(cli_lat.ms),
              percentile(cli_lat.ms, 0.9));
  std::fflush(stdout);

  // Throughput: 32 sandboxes, one client thread each, looping `true`.
  std::vector<sbx::Operation<sbx::Sandbox>> creating;
  for (int i = 0; i < o.sandboxes; ++i)
    creating.push_back(provider.create_async(sandbox_spec(o)));
  std::vector<sbx::Sandbox> boxes;
  for (auto& op : creating)
    boxes.push_back(op.get());
  const double sbx_tput = throughput(o.sandboxes, o.throughput_seconds, [&](int t) {
    return boxes[static_cast<size_t>(t)].exec("true").return_code == 0;
  });
  for (auto& b : boxes)
    b.close();
  boxes.clear();

  std::vector<std::thread> starters;
  std::atomic<bool> create_failed{false};
  for (int i = 0; i < o.sandboxes; ++i)
    cli_containers.names.push_back(cli_name(i + 1));
  for (int i = 0; i < o.sandboxes; ++i) {
    starters.emplace_back([&, i] {
      if (!cli.create(cli_name(i + 1), o.image, "sbx.bench=" + run)) create_failed = true;
    });
  }
  for (auto& t : starters)
    t.join();
  if (create_failed) die("docker run failed while creating the throughput containers");
  const double cli_tput = throughput(o.sandboxes, o.throughput_seconds,
                                     [&](int t) { return cli.exec(cli_name(t + 1), "true") == 0; });

  bool all_pass = true;
  print_table(
      {
          {"exec latency, median (ms)", median(sbx_lat.ms), median(cli_lat.ms), true, 1.4},
          {"client CPU per exec (ms)", sbx_lat.cpu_per_exec_ms, cli_lat.cpu_per_exec_ms, true, 20},
          {"exec throughput, 32 sandboxes (/s)", sbx_tput, cli_tput, false, 1.5},
          {"create to ready, median (ms)", median(sbx_create_ms), median(cli_create_ms), true, 0},
      },
      all_pass);
  std::printf("\n%s\n", all_pass ? "all targets met" : "some targets missed");
  // cli_containers' destructor removes the CLI containers; the sandboxes are closed already.
  return o.check && !all_pass ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  spdlog::set_level(spdlog::level::warn);  // the table, not a line per sandbox
  try {
    return run_benchmark(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "local_docker_vs_cli: %s\n", e.what());
    return 2;
  }
}
