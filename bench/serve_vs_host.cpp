// `sbx serve` against the host API, on the same provider (local_docker), side by side in one run:
//   - latency of a trivial command: POST /command {"command":"true"} through the gateway on a
//     kept-alive connection, read to the end of its event stream, against Sandbox::exec("true")
//     in this process; samples alternate between the two      target: gateway <= 1.3x direct
//   - client-observed throughput: C client threads, each looping that command for a fixed time,
//     through the gateway (one connection per thread) and through the host API
//   - the server's memory: sbx serve's resident set idle (one sandbox) and while it holds N
//     concurrently open command streams (`sleep` commands, each read up to its first line)
//                                                               target: < 100 MiB above idle
//   - an upload of M MiB (256): POST /files/upload (multipart, from memory) against
//     Sandbox::upload_bytes, rounds alternating      target: gateway >= 0.8x the host API's rate
//
// Usage: serve_vs_host [--quick] [--check] [--image IMAGE] [--streams N] [--clients C]
//                      [--seconds S] [--samples N] [--upload-mib M]
//   --check   exit 1 when a target is missed (otherwise the exit code is 0: this is a report)
// Runs build/bin/sbx (next to this program) as `sbx serve` on 127.0.0.1:0. Needs the daemon and
// images of scripts/docker-up.sh. Not part of ctest.

#include <sbx/sbx.hpp>

#include "bench_util.hpp"
#include "serve_child.hpp"
#include "serve_client.hpp"

#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace http = boost::beast::http;
namespace json = boost::json;
namespace fs = std::filesystem;
using sbx::bench::Clock;
using sbx::bench::median;
using sbx::bench::ms_since;
using sbx::bench::percentile;
using sbx::bench::proc_status;
using sbx::bench::rss_kib;
using sbx::bench::ServeChild;
using Client = sbx::bench::ServeClient;
using sbx::bench::throughput;

struct Options {
  bool quick = false;
  bool check = false;
  std::string image = "sbx-busybox:latest";
  int samples = 300;
  int clients = 8;
  double seconds = 15;
  int streams = 1000;
  std::string plugin = "local_docker";  // a provider id or a plugin file (its config stays {})
  double hold_s = 0;                    // keep the streams open this long after measuring
  int upload_mib = 256;
  int upload_rounds = 3;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--quick] [--check] [--image IMAGE] [--streams N] [--clients C] "
               "[--seconds S] [--samples N] [--plugin ID|FILE] [--hold S] [--upload-mib M]\n",
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
    } else if (arg == "--streams") {
      o.streams = std::stoi(value());
    } else if (arg == "--clients") {
      o.clients = std::stoi(value());
    } else if (arg == "--seconds") {
      o.seconds = std::stod(value());
    } else if (arg == "--hold") {
      o.hold_s = std::stod(value());
    } else if (arg == "--plugin") {
      o.plugin = value();
    } else if (arg == "--samples") {
      o.samples = std::stoi(value());
    } else if (arg == "--upload-mib") {
      o.upload_mib = std::stoi(value());
    } else {
      usage(argv[0]);
    }
  }
  if (o.quick) {
    o.samples = std::min(o.samples, 60);
    o.seconds = std::min(o.seconds, 4.0);
    o.streams = std::min(o.streams, 200);
    o.upload_mib = std::min(o.upload_mib, 64);
  }
  return o;
}

[[noreturn]] void die(const std::string& message) {
  throw std::runtime_error(message);
}

// Raises the soft limit on open files to the hard one: N streams are N sockets here and at least
// as many in the server.
void raise_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// An open command stream held by a raw socket: the request is sent and the response read up to
// a marker (the command's first line); the socket then stays open (the command keeps running) until
// destroyed.
class HeldStream {
 public:
  HeldStream(int port, const std::string& sandbox_id, const std::string& command) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) die(std::string("socket: ") + std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      die(std::string("connect: ") + std::strerror(errno));
    const std::string body = json::serialize(json::object{{"command", command}});
    const std::string request = "POST /sandboxes/" + sandbox_id +
                                "/proxy/44772/command HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                "Content-Type: application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body;
    if (write(fd_, request.data(), request.size()) != static_cast<ssize_t>(request.size()))
      die("short write of a command request");
  }
  ~HeldStream() {
    if (fd_ >= 0) close(fd_);
  }
  HeldStream(const HeldStream&) = delete;
  HeldStream& operator=(const HeldStream&) = delete;

  // The command id its `init` event gave (after wait_for).
  const std::string& command_id() const { return command_id_; }

  // Reads until `marker` has arrived (or fails on a non-200 answer).
  void wait_for(const std::string& marker) {
    std::string seen;
    char buf[2048];
    while (seen.find(marker) == std::string::npos) {
      const ssize_t n = read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) die("a command stream closed before " + marker + ": " + seen.substr(0, 300));
      seen.append(buf, static_cast<size_t>(n));
      if (seen.rfind("HTTP/1.1 200", 0) != 0 && seen.size() >= 12)
        die("a command stream was refused: " + seen.substr(0, 300));
    }
    const std::string init = R"("type":"init","text":")";
    if (const auto at = seen.find(init); at != std::string::npos)
      command_id_ =
          seen.substr(at + init.size(), seen.find('"', at + init.size()) - at - init.size());
  }

 private:
  int fd_ = -1;
  std::string command_id_;
};

// ---- The measurements ---------------------------------------------------------------------------

int run_benchmark(const Options& o, const fs::path& self_dir) {
  raise_file_limit();
  const fs::path sbx = self_dir / "sbx";
  if (access(sbx.c_str(), X_OK) != 0) die(sbx.string() + " is not built");
  char tmpl[] = "/tmp/sbx-serve-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) die("mkdtemp failed");
  const fs::path dir = tmpl;
  struct RemoveDir {
    fs::path path;
    ~RemoveDir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_dir{dir};
  // local_docker's exec.concurrency above the stream count: every held stream's command really
  // runs (it runs at most that many execs at once and queues the rest).
  json::object provider_config;
  if (o.plugin == "local_docker")
    provider_config["exec"] =
        json::object{{"concurrency", std::max(32, o.streams + o.clients + 8)}};
  const std::string config_text = json::serialize(json::object{
      {"providers",
       json::object{{"docker", json::object{{"plugin", o.plugin}, {"config", provider_config}}}}}});
  std::ofstream(dir / "sbx.json") << config_text;

  ServeChild server(sbx, dir / "sbx.json", dir / "serve.log");
  sbx::Host::Options host_options;
  host_options.config = sbx::Config::parse(config_text, "bench");
  host_options.labels["sbx.bench"] = "serve_vs_host";
  sbx::Host host(std::move(host_options));
  sbx::Provider provider = host.provider("docker");

  std::printf("sbx serve vs the host API, both on %s (image %s)\n", o.plugin.c_str(),
              o.image.c_str());
  std::printf("%d latency samples, %d clients x %.0f s, %d streams%s\n", o.samples, o.clients,
              o.seconds, o.streams, o.quick ? " (--quick)" : "");
  std::fflush(stdout);

  sbx::SandboxSpec spec;
  spec.image = o.image;
  spec.ttl_s = 1800;
  sbx::Sandbox direct = provider.create(spec);
  Client client(server.port());
  const std::string id = client.create_sandbox(o.image);

  // Latency: warm both, then alternate.
  for (int i = 0; i < 10; ++i) {
    direct.exec("true");
    if (!client.run(id, "true")) die("a command through the gateway failed");
  }
  std::vector<double> direct_ms, gateway_ms;
  for (int i = 0; i < o.samples; ++i) {
    auto start = Clock::now();
    if (direct.exec("true").return_code != 0) die("a direct command failed");
    direct_ms.push_back(ms_since(start));
    start = Clock::now();
    if (!client.run(id, "true")) die("a command through the gateway failed");
    gateway_ms.push_back(ms_since(start));
  }
  std::printf("latency done: direct p50 %.2f ms p90 %.2f ms; gateway p50 %.2f ms p90 %.2f ms\n",
              median(direct_ms), percentile(direct_ms, 0.9), median(gateway_ms),
              percentile(gateway_ms, 0.9));
  std::fflush(stdout);

  // Throughput: the same number of client threads through each path.
  const double direct_rate =
      throughput(o.clients, o.seconds, [&](int) { return direct.exec("true").return_code == 0; });
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < o.clients; ++i)
    clients.push_back(std::make_unique<Client>(server.port()));
  const double gateway_rate =
      throughput(o.clients, o.seconds, [&](int t) { return clients[t]->run(id, "true"); });
  clients.clear();
  std::printf("throughput done: direct %.1f/s; gateway %.1f/s\n", direct_rate, gateway_rate);
  std::fflush(stdout);

  // Uploads: the same bytes, rounds alternating between the two paths.
  std::string payload(static_cast<size_t>(o.upload_mib) << 20, '\0');
  for (size_t i = 0; i < payload.size(); i += 4096)
    payload[i] = static_cast<char>(i * 2654435761u >> 24);
  const std::string boundary = "sbxbenchboundary0123456789";
  const std::string multipart =
      "--" + boundary +
      "\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\r\n"
      R"({"path":"/tmp/up-gateway.bin","mode":644})"
      "\r\n--" +
      boundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n" +
      payload + "\r\n--" + boundary + "--\r\n";
  std::vector<double> direct_mibps, gateway_mibps;
  for (int round = 0; round < o.upload_rounds; ++round) {
    auto start = Clock::now();
    direct.upload_bytes(payload, "/tmp/up-direct.bin");
    direct_mibps.push_back(o.upload_mib / (ms_since(start) / 1000.0));
    start = Clock::now();
    const auto res = client.call(http::verb::post, "/sandboxes/" + id + "/proxy/44772/files/upload",
                                 multipart, "multipart/form-data; boundary=" + boundary);
    if (res.result() != http::status::ok)
      die("an upload through the gateway failed: " + res.body());
    gateway_mibps.push_back(o.upload_mib / (ms_since(start) / 1000.0));
  }
  std::printf("uploads done: direct %.0f MiB/s; gateway %.0f MiB/s (medians of %d)\n",
              median(direct_mibps), median(gateway_mibps), o.upload_rounds);
  std::fflush(stdout);
  payload.clear();
  direct.close();

  // Memory: idle (one sandbox, no stream), then N open streams, then after they are gone.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double idle_kib = rss_kib(server.pid());
  const double idle_threads = proc_status(server.pid(), "Threads");
  double held_kib = 0, held_threads = 0;
  std::vector<std::string> command_ids;
  {
    std::vector<std::unique_ptr<HeldStream>> streams;
    const auto start = Clock::now();
    for (int i = 0; i < o.streams; ++i)
      streams.push_back(
          std::make_unique<HeldStream>(server.port(), id, "echo started; exec sleep 600"));
    for (auto& s : streams)  // each command runs: its first line came back
      s->wait_for("\"started\"");
    std::printf("%d streams open in %.1f s\n", o.streams, ms_since(start) / 1000.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    held_kib = rss_kib(server.pid());
    held_threads = proc_status(server.pid(), "Threads");
    if (o.hold_s > 0) {
      std::printf("holding them %.0f s (sbx serve is pid %d)\n", o.hold_s, server.pid());
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::duration<double>(o.hold_s));
    }
    for (auto& s : streams)
      command_ids.push_back(s->command_id());
  }  // closing the sockets cancels the commands
  // Each cancelled command is over once its status says so.
  const auto cancel_start = Clock::now();
  for (const auto& command : command_ids) {
    for (;;) {
      const auto res = client.call(http::verb::get,
                                   "/sandboxes/" + id + "/proxy/44772/command/status/" + command);
      if (res.result() != http::status::ok) die("status of a cancelled command: " + res.body());
      if (!json::parse(res.body()).as_object().at("running").as_bool()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  std::printf("the %zu commands ended %.1f s after their clients left\n", command_ids.size(),
              ms_since(cancel_start) / 1000.0);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double after_kib = rss_kib(server.pid());

  const int status = server.stop();

  const double latency_ratio = median(gateway_ms) / median(direct_ms);
  const double memory_mib = (held_kib - idle_kib) / 1024.0;
  const bool latency_ok = latency_ratio <= 1.3;
  const double upload_ratio = median(gateway_mibps) / median(direct_mibps);
  const bool upload_ok = upload_ratio >= 0.8;
  const bool memory_ok = memory_mib < 100.0 * o.streams / 1000.0;
  std::printf("\n%-40s %12s %12s %9s %10s %7s\n", "", "host API", "gateway", "ratio", "target",
              "result");
  std::printf("%-40s %12.2f %12.2f %8.2fx %10s %7s\n", "trivial command latency, median (ms)",
              median(direct_ms), median(gateway_ms), latency_ratio, "<=1.30x",
              latency_ok ? "PASS" : "FAIL");
  std::printf("%-40s %12.2f %12.2f %8.2fx %10s %7s\n", "trivial command latency, p90 (ms)",
              percentile(direct_ms, 0.9), percentile(gateway_ms, 0.9),
              percentile(gateway_ms, 0.9) / percentile(direct_ms, 0.9), "-", "");
  std::printf("%-40s %12.1f %12.1f %8.2fx %10s %7s\n", "throughput (commands/s)", direct_rate,
              gateway_rate, gateway_rate / direct_rate, "-", "");
  std::printf("%-40s %12.0f %12.0f %8.2fx %10s %7s\n", "upload MiB/s, median", median(direct_mibps),
              median(gateway_mibps), upload_ratio, ">=0.80x", upload_ok ? "PASS" : "FAIL");
  std::printf("%-40s %12.3f %12.3f %9s %10s %7s\n", "server's added latency, median (ms)", 0.0,
              median(gateway_ms) - median(direct_ms), "", "<=0.30",
              median(gateway_ms) - median(direct_ms) <= 0.3 ? "PASS" : "FAIL");
  std::printf(
      "\nsbx serve resident memory: idle %.1f MiB, with %d open streams %.1f MiB "
      "(+%.1f MiB, %.1f KiB per stream; target < %.0f MiB: %s), after they closed %.1f "
      "MiB\n",
      idle_kib / 1024, o.streams, held_kib / 1024, memory_mib, (held_kib - idle_kib) / o.streams,
      100.0 * o.streams / 1000.0, memory_ok ? "PASS" : "FAIL", after_kib / 1024);
  std::printf("sbx serve threads: idle %.0f, with the streams open %.0f\n", idle_threads,
              held_threads);
  std::printf("sbx serve exit status after SIGTERM: %d\n", status);
  if (status != 0) {  // say why: the server's last log lines
    std::ifstream log(dir / "serve.log");
    std::deque<std::string> last;
    for (std::string line; std::getline(log, line);) {
      last.push_back(line);
      if (last.size() > 8) last.pop_front();
    }
    for (const auto& line : last)
      std::printf("  serve.log: %s\n", line.c_str());
  }
  const bool all = latency_ok && memory_ok && upload_ok && status == 0;
  std::printf("\n%s\n", all ? "all targets met" : "some targets missed");
  return o.check && !all ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  try {
    const fs::path self = fs::canonical("/proc/self/exe").parent_path();
    return run_benchmark(o, self);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve_vs_host: %s\n", e.what());
    return 2;
  }
}
