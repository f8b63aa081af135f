// local_docker with its agent (sbx-agent in each sandbox) against local_docker with Docker exec
// ("agent": false), side by side in one run, through the host API (bench/README.md).
//   1. trivial command latency (`true`), samples interleaved between the modes;
//   2. throughput of `true` over S sandboxes from T client threads, and the host CPU per command
//      (this process plus dockerd, containerd and the containerd shims, from /proc);
//   3. K commands in flight at once (agent mode): the process's threads; and the agents' resident
//      memory while idle (VmRSS of the sbx-agent processes, from the host's /proc);
//   4. an M MiB file uploaded and downloaded back, R round trips per mode, interleaved.
#include <sbx/sbx.hpp>

#include "bench_util.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using sbx::bench::Clock;
using sbx::bench::median;
using sbx::bench::ms_since;

struct Options {
  bool quick = false;
  bool check = false;
  int samples = 200;
  int sandboxes = 32;
  int threads = 16;
  double seconds = 10;
  int in_flight = 1000;
  int file_mib = 256;
  int round_trips = 3;
  std::string image = "sbx-busybox:latest";
};

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "local_docker_agent: %s\n", why.c_str());
  std::exit(2);
}

// CPU time (user + system, in clock ticks) of this process and of the daemon's processes.
long cpu_ticks() {
  long total = 0;
  DIR* proc = ::opendir("/proc");
  if (!proc) return 0;
  const pid_t self = ::getpid();
  while (const dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream stat(std::string("/proc/") + entry->d_name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    const std::string comm = line.substr(open + 1, close - open - 1);
    const bool counted = pid == self || comm == "dockerd" || comm == "containerd" ||
                         comm.rfind("containerd-shim", 0) == 0 || comm == "runc";
    if (!counted) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::atol(field.c_str());
      if (i == 15) stime = std::atol(field.c_str());
    }
    total += utime + stime;
  }
  ::closedir(proc);
  return total;
}

// VmRSS (KiB) of every process named sbx-agent: the agents of the sandboxes, seen from the host.
std::vector<double> agent_rss_kib() {
  std::vector<double> rss;
  DIR* proc = ::opendir("/proc");
  if (!proc) return rss;
  while (const dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::ifstream status(std::string("/proc/") + entry->d_name + "/status");
    std::string line;
    bool agent = false;
    while (std::getline(status, line)) {
      if (line.rfind("Name:", 0) == 0) agent = line.find("sbx-agent") != std::string::npos;
      if (agent && line.rfind("VmRSS:", 0) == 0) rss.push_back(std::atof(line.c_str() + 6));
    }
  }
  ::closedir(proc);
  return rss;
}

int threads_of_self() {
  int n = 0;
  DIR* tasks = ::opendir("/proc/self/task");
  if (!tasks) return -1;
  while (const dirent* entry = ::readdir(tasks))
    if (entry->d_name[0] != '.') ++n;
  ::closedir(tasks);
  return n;
}

// The threads' names (`comm`), counted: "sbx-pool x2, ...".
std::string thread_names() {
  std::map<std::string, int> names;
  DIR* tasks = ::opendir("/proc/self/task");
  if (!tasks) return "";
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + entry->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    ++names[name];
  }
  ::closedir(tasks);
  std::string out;
  for (const auto& [name, count] : names)
    out += (out.empty() ? "" : ", ") + name + (count > 1 ? " x" + std::to_string(count) : "");
  return out;
}

sbx::SandboxSpec spec_of(const Options& o, const std::string& run) {
  sbx::SandboxSpec spec;
  spec.image = o.image;
  spec.ttl_s = 1800;
  spec.metadata["sbx.bench"] = run;
  return spec;
}

std::vector<sbx::Sandbox> create_many(sbx::Provider& provider, const sbx::SandboxSpec& spec,
                                      int count) {
  std::vector<sbx::Sandbox> boxes;
  for (int i = 0; i < count; i += 8) {
    std::vector<sbx::Operation<sbx::Sandbox>> ops;
    for (int j = i; j < std::min(count, i + 8); ++j)
      ops.push_back(provider.create_async(spec));
    for (auto& op : ops)
      boxes.push_back(op.get());
  }
  return boxes;
}

struct Throughput {
  double per_second = 0;
  double cpu_ms_per_command = 0;
};

Throughput throughput(std::vector<sbx::Sandbox>& boxes, const Options& o) {
  std::atomic<long> commands{0};
  const long ticks_before = cpu_ticks();
  const double rate = sbx::bench::throughput(o.threads, o.seconds, [&](int t) {
    const long n = commands.fetch_add(1);
    auto& box = boxes[static_cast<size_t>((t + n) % static_cast<long>(boxes.size()))];
    return box.exec("true").return_code == 0;
  });
  const long ticks = cpu_ticks() - ticks_before;
  const double ms =
      1000.0 * static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  return {rate, ms / static_cast<double>(commands.load())};
}

// Upload and download times (ms) of `local` through `box`, R round trips; each download is checked
// for its size.
struct RoundTrips {
  std::vector<double> up_ms, down_ms;
};
void round_trip(sbx::Sandbox& box, const std::filesystem::path& local, RoundTrips& into) {
  const auto back = std::filesystem::path(local).replace_extension(".back");
  auto start = Clock::now();
  box.upload(local, "/tmp/bench.bin");
  into.up_ms.push_back(ms_since(start));
  start = Clock::now();
  box.download("/tmp/bench.bin", back);
  into.down_ms.push_back(ms_since(start));
  if (std::filesystem::file_size(back) != std::filesystem::file_size(local)) {
    die("the downloaded file's size differs from the uploaded one's");
  }
  std::filesystem::remove(back);
}

bool row(const char* what, double agent, double docker, double ratio, const char* target,
         bool met) {
  std::printf("%-44s %12.2f %12.2f %9.1fx  %-12s %s\n", what, agent, docker, ratio, target,
              met ? "met" : "MISSED");
  return met;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--quick") {
      o.quick = true;
      o.samples = 50;
      o.sandboxes = 8;
      o.seconds = 4;
      o.in_flight = 200;
      o.file_mib = 64;
      o.round_trips = 1;
    } else if (arg == "--check") {
      o.check = true;
    } else if (arg == "--samples") {
      o.samples = std::stoi(value());
    } else if (arg == "--sandboxes") {
      o.sandboxes = std::stoi(value());
    } else if (arg == "--threads") {
      o.threads = std::stoi(value());
    } else if (arg == "--seconds") {
      o.seconds = std::stod(value());
    } else if (arg == "--in-flight") {
      o.in_flight = std::stoi(value());
    } else if (arg == "--file-mib") {
      o.file_mib = std::stoi(value());
    } else if (arg == "--round-trips") {
      o.round_trips = std::stoi(value());
    } else if (arg == "--image") {
      o.image = value();
    } else {
      die("unknown argument " + arg +
          " (--quick --check --samples N --sandboxes S --threads T --seconds X --in-flight K "
          "--file-mib M --round-trips R --image IMAGE)");
    }
  }
  const std::string run = std::to_string(std::random_device{}());
  sbx::Host::Options options;
  options.config = sbx::Config::parse(R"({"providers": {
      "agent": {"plugin": "local_docker", "config": {"agent": true}},
      "docker_exec": {"plugin": "local_docker",
                      "config": {"agent": false, "exec": {"concurrency": 64}}}}})",
                                      "bench");
  options.labels["sbx.bench"] = run;
  sbx::Host host(std::move(options));
  sbx::Provider agent = host.provider("agent");
  sbx::Provider docker = host.provider("docker_exec");
  const sbx::SandboxSpec spec = spec_of(o, run);

  std::printf(
      "local_docker: agent against Docker exec, image %s, %d latency samples, %d sandboxes "
      "x %d threads x %.0f s, %d in flight%s\n",
      o.image.c_str(), o.samples, o.sandboxes, o.threads, o.seconds, o.in_flight,
      o.quick ? " (--quick)" : "");
  std::fflush(stdout);

  bool met = true;
  try {
    // 1. Latency, interleaved.
    sbx::Sandbox a = agent.create(spec);
    sbx::Sandbox d = docker.create(spec);
    for (int i = 0; i < 5; ++i) {  // warm-up: connections, page cache
      a.exec("true");
      d.exec("true");
    }
    std::vector<double> a_ms, d_ms;
    for (int i = 0; i < o.samples; ++i) {
      auto start = Clock::now();
      if (a.exec("true").return_code != 0) die("true failed (agent)");
      a_ms.push_back(ms_since(start));
      start = Clock::now();
      if (d.exec("true").return_code != 0) die("true failed (Docker exec)");
      d_ms.push_back(ms_since(start));
    }
    a.close();
    d.close();

    // 2. Throughput and CPU.
    std::vector<sbx::Sandbox> a_boxes = create_many(agent, spec, o.sandboxes);
    const std::vector<double> idle_rss = agent_rss_kib();  // before any command
    const Throughput a_tp = throughput(a_boxes, o);
    std::vector<sbx::Sandbox> d_boxes = create_many(docker, spec, o.sandboxes);
    const Throughput d_tp = throughput(d_boxes, o);
    for (auto& box : d_boxes)
      box.close();

    // 3. In flight (agent): every command sleeps 3 s; threads counted while they all run. First
    // the pool threads of the creates and Docker execs above retire (idle ones exit after 30 s:
    // the count must hold for 35 s).
    const auto settling = Clock::now();
    for (int last = -1, same = 0; same < 70 && ms_since(settling) < 120'000;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const int now = threads_of_self();
      same = now == last ? same + 1 : 0;
      last = now;
    }
    const int idle_threads = threads_of_self();
    const std::string idle_names = thread_names();
    std::vector<sbx::Operation<sbx::ExecResult>> ops;
    const auto started = Clock::now();
    for (int i = 0; i < o.in_flight; ++i)
      ops.push_back(a_boxes[static_cast<size_t>(i) % a_boxes.size()].exec_async("sleep 3"));
    const double submit_ms = ms_since(started);
    int most_threads = 0;
    while (ms_since(started) < 2500) {
      most_threads = std::max(most_threads, threads_of_self());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    int failed = 0;
    for (auto& op : ops)
      if (op.get().return_code != 0) ++failed;
    for (auto& box : a_boxes)
      box.close();

    // 4. Files: one file of pseudo-random bytes (not sparse: every byte is read and written),
    // round trips interleaved between the modes.
    char dir_template[] = "/tmp/sbx-bench-files-XXXXXX";
    if (!::mkdtemp(dir_template)) die("mkdtemp failed");
    const std::filesystem::path files_dir = dir_template;
    const std::filesystem::path local = files_dir / "bench.bin";
    {
      std::ofstream out(local, std::ios::binary);
      std::mt19937_64 random(42);
      std::vector<uint64_t> block(1 << 17);  // 1 MiB
      for (int i = 0; i < o.file_mib; ++i) {
        for (auto& word : block)
          word = random();
        out.write(reinterpret_cast<const char*>(block.data()),
                  static_cast<std::streamsize>(block.size() * sizeof(uint64_t)));
      }
      if (!out) die("cannot write " + local.string());
    }
    RoundTrips a_files, d_files;
    {
      sbx::Sandbox fa = agent.create(spec);
      sbx::Sandbox fd = docker.create(spec);
      for (int i = 0; i < o.round_trips; ++i) {
        round_trip(fa, local, a_files);
        round_trip(fd, local, d_files);
      }
      fa.close();
      fd.close();
    }
    std::filesystem::remove(local);
    std::filesystem::remove(files_dir);  // made above, empty again
    const auto mib_per_s = [&](const std::vector<double>& ms) {
      return o.file_mib * 1000.0 / median(ms);
    };

    const double a_med = median(a_ms), d_med = median(d_ms);
    std::printf("\n%-44s %12s %12s %10s  %-12s %s\n", "", "agent", "Docker exec", "ratio", "target",
                "");
    met &= row("trivial command, median ms", a_med, d_med, d_med / a_med, ">= 15x, <= 3ms",
               a_med <= 3 && d_med / a_med >= 15);
    met &=
        row("throughput, commands/s", a_tp.per_second, d_tp.per_second,
            a_tp.per_second / d_tp.per_second, ">= 20x", a_tp.per_second / d_tp.per_second >= 20);
    met &= row("host CPU per command, ms", a_tp.cpu_ms_per_command, d_tp.cpu_ms_per_command,
               d_tp.cpu_ms_per_command / a_tp.cpu_ms_per_command, "<= 1/10",
               d_tp.cpu_ms_per_command / a_tp.cpu_ms_per_command >= 10);
    std::printf("%-44s %12.0f %12s %10s  %-12s %s\n", "agent resident memory, idle, median KiB",
                idle_rss.empty() ? 0.0 : median(idle_rss), "", "", "", "");
    std::printf("  (%zu agents measured)\n", idle_rss.size());
    std::printf("%-44s %12d %12s %10s  %-12s %s\n", "threads with commands in flight (agent)",
                most_threads, "", "", "<= 8", most_threads <= 8 && failed == 0 ? "met" : "MISSED");
    std::printf("  (%d commands submitted in %.0f ms; idle before: %d threads: %s; failed: %d)\n",
                o.in_flight, submit_ms, idle_threads, idle_names.c_str(), failed);
    met &= most_threads <= 8 && failed == 0;
    const double a_up = mib_per_s(a_files.up_ms), d_up = mib_per_s(d_files.up_ms);
    const double a_down = mib_per_s(a_files.down_ms), d_down = mib_per_s(d_files.down_ms);
    const std::string file_row = std::to_string(o.file_mib) + " MiB ";
    met &= row((file_row + "upload, median MiB/s").c_str(), a_up, d_up, a_up / d_up, ">= 1x",
               a_up >= d_up);
    met &= row((file_row + "download, median MiB/s").c_str(), a_down, d_down, a_down / d_down,
               ">= 1x", a_down >= d_down);
    std::printf(
        "  (%d round trips per mode; upload to /tmp in the sandbox, download to this "
        "machine's /tmp)\n",
        o.round_trips);
  } catch (const std::exception& e) {
    die(e.what());
  }
  return o.check && !met ? 1 : 0;
}
