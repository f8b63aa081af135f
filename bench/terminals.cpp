// Terminals (sbx.pty/1) on local_docker with its agent, side by side in one run:
//   - keystroke round trip: write one byte to a terminal running `cat` and read its echo (the
//     line discipline's), through the host API (Pty::write, an attachment)
//                                                               target: median <= 2 ms
//     and through `sbx serve`'s WebSocket (GET /pty/{id}/ws, a 0x00 frame out, the 0x01 back),
//                                                               target: median <= 5 ms
//     and through the host API on local_docker without the agent ("agent": false: a Docker exec
//     with a TTY on a hijacked stream), the three samples alternating (no target: for comparison)
//   - N terminals (200) held by one `sbx serve`, each with a WebSocket attached and a shell that
//     answered a command, over S sandboxes (4: the agent keeps at most 64 per sandbox): the
//     server's resident set and threads idle (S sandboxes) and with the N held
//
// Usage: terminals [--quick] [--check] [--image IMAGE] [--samples N] [--terminals N]
//                  [--sandboxes S]
//   --check   exit 1 when a target is missed (otherwise the exit code is 0: this is a report)
// Runs build/bin/sbx (next to this program) as `sbx serve` on 127.0.0.1:0. Needs the daemon and
// images of scripts/docker-up.sh. Not part of ctest.

#include <sbx/sbx.hpp>
#include <sbx/sdk/websocket.hpp>

#include "bench_util.hpp"
#include "serve_child.hpp"
#include "serve_client.hpp"

#include <boost/json.hpp>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

namespace json = boost::json;
namespace fs = std::filesystem;
using sbx::bench::Clock;
using sbx::bench::median;
using sbx::bench::ms_since;
using sbx::bench::percentile;
using sbx::bench::ServeChild;
using sbx::bench::ServeClient;
using sbx::sdk::WebSocket;
using namespace std::chrono_literals;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "terminals: %s\n", why.c_str());
  std::exit(2);
}

struct Options {
  bool quick = false, check = false;
  std::string image = "sbx-busybox:latest";
  int samples = 400;
  int terminals = 200;
  int sandboxes = 4;
};

// What a host-API attachment has read: the count of bytes, and a wait for more.
struct Counter {
  std::mutex mutex;
  std::condition_variable more;
  size_t bytes = 0;
  void add(size_t n) {
    std::lock_guard lock(mutex);
    bytes += n;
    more.notify_all();
  }
  bool wait_beyond(size_t n) {
    std::unique_lock lock(mutex);
    return more.wait_for(lock, 10s, [&] { return bytes > n; });
  }
  size_t now() {
    std::lock_guard lock(mutex);
    return bytes;
  }
};

// One byte out through the WebSocket, until a stdout frame comes back.
double ws_round_trip(WebSocket& ws) {
  const auto start = Clock::now();
  ws.send_binary(std::string("\x00x", 2));
  for (;;) {
    auto m = ws.receive();
    if (!m) die("the terminal's WebSocket ended");
    if (m->kind == WebSocket::Message::Kind::binary && m->payload.size() > 1 &&
        m->payload[0] == '\x01')
      return ms_since(start);
  }
}

std::string new_terminal(ServeClient& client, const std::string& sandbox,
                         const std::string& command) {
  const auto res =
      client.call(boost::beast::http::verb::post, "/sandboxes/" + sandbox + "/proxy/44772/pty",
                  json::serialize(json::object{{"command", command}}));
  if (res.result_int() != 200) die("POST /pty answered " + std::to_string(res.result_int()));
  return std::string(json::parse(res.body()).as_object().at("session_id").as_string());
}

WebSocket attach(int port, const std::string& sandbox, const std::string& terminal) {
  WebSocket ws =
      WebSocket::open({.port = static_cast<uint16_t>(port)},
                      "/sandboxes/" + sandbox + "/proxy/44772/pty/" + terminal + "/ws", {}, 30s);
  for (;;) {  // up to "connected"
    auto m = ws.receive();
    if (!m) die("a terminal's WebSocket ended before connected");
    if (m->kind == WebSocket::Message::Kind::text &&
        m->payload.find("\"connected\"") != std::string::npos)
      return ws;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--quick") {
      o.quick = true;
      o.samples = 100;
      o.terminals = 40;
      o.sandboxes = 1;
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--image") {
      o.image = value();
    } else if (a == "--samples") {
      o.samples = std::stoi(value());
    } else if (a == "--terminals") {
      o.terminals = std::stoi(value());
    } else if (a == "--sandboxes") {
      o.sandboxes = std::stoi(value());
    } else {
      die("unknown argument " + a);
    }
  }
  const fs::path sbx = fs::canonical("/proc/self/exe").parent_path() / "sbx";
  std::string pattern = (fs::temp_directory_path() / "sbx-bench-terminals-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) die("mkdtemp failed");
  const fs::path dir = pattern;
  struct RemoveDir {
    fs::path path;
    ~RemoveDir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_dir{dir};
  const std::string config_text = json::serialize(json::object{
      {"providers",
       json::object{{"docker", json::object{{"plugin", "local_docker"}}},
                    {"docker_exec", json::object{{"plugin", "local_docker"},
                                                 {"config", json::object{{"agent", false}}}}}}}});
  std::ofstream(dir / "sbx.json") << config_text;

  ServeChild server(sbx, dir / "sbx.json", dir / "serve.log");
  sbx::Host::Options host_options;
  host_options.config = sbx::Config::parse(config_text, "bench");
  host_options.labels["sbx.bench"] = "terminals";
  sbx::Host host(std::move(host_options));
  sbx::Provider provider = host.provider("docker");
  std::printf(
      "terminals on local_docker with its agent (image %s): %d round trips each way, "
      "%d terminals over %d sandboxes%s\n",
      o.image.c_str(), o.samples, o.terminals, o.sandboxes, o.quick ? " (--quick)" : "");
  std::fflush(stdout);

  // Round trips: the host API and the gateway, alternating.
  sbx::SandboxSpec spec;
  spec.image = o.image;
  spec.ttl_s = 1800;
  sbx::Sandbox direct = provider.create(spec);
  sbx::Pty pty = direct.open_pty({.command = "cat"});
  Counter seen;
  auto reader = pty.attach_async(
      {.since = 0, .on_output = [&](sbx::OutputStream, uint64_t, std::string_view bytes) {
         seen.add(bytes.size());
       }});
  sbx::Sandbox hijacked = host.provider("docker_exec").create(spec);
  sbx::Pty exec_pty = hijacked.open_pty({.command = "cat"});
  Counter exec_seen;
  auto exec_reader = exec_pty.attach_async(
      {.since = 0, .on_output = [&](sbx::OutputStream, uint64_t, std::string_view bytes) {
         exec_seen.add(bytes.size());
       }});
  ServeClient client(server.port());
  const std::string gateway_box = client.create_sandbox(o.image);
  WebSocket ws = attach(server.port(), gateway_box, new_terminal(client, gateway_box, "cat"));

  auto host_round_trip = [&](sbx::Pty& terminal, Counter& echoed) {
    const size_t before = echoed.now();
    const auto start = Clock::now();
    terminal.write("x");
    if (!echoed.wait_beyond(before)) die("no echo through the host API within 10 s");
    return ms_since(start);
  };
  for (int i = 0; i < 20; ++i) {  // warm all three
    host_round_trip(pty, seen);
    ws_round_trip(ws);
    host_round_trip(exec_pty, exec_seen);
  }
  std::vector<double> direct_ms, gateway_ms, exec_ms;
  for (int i = 0; i < o.samples; ++i) {
    direct_ms.push_back(host_round_trip(pty, seen));
    gateway_ms.push_back(ws_round_trip(ws));
    exec_ms.push_back(host_round_trip(exec_pty, exec_seen));
  }
  const double direct_median = median(direct_ms), gateway_median = median(gateway_ms);
  std::printf("keystroke round trip, host API:        median %.3f ms, p90 %.3f ms  (target <= 2)\n",
              direct_median, percentile(direct_ms, 0.9));
  std::printf("keystroke round trip, serve WebSocket: median %.3f ms, p90 %.3f ms  (target <= 5)\n",
              gateway_median, percentile(gateway_ms, 0.9));
  std::printf("ratio serve / host API: %.2fx\n", gateway_median / direct_median);
  const double exec_median = median(exec_ms);
  std::printf(
      "keystroke round trip, host API without the agent (Docker exec TTY): median %.3f ms, "
      "p90 %.3f ms; %.2fx the agent's\n",
      exec_median, percentile(exec_ms, 0.9), exec_median / direct_median);
  std::fflush(stdout);
  exec_reader.cancel();
  exec_pty.close();
  hijacked.close();
  reader.cancel();
  pty.close();
  direct.close();

  // N terminals held by the server.
  std::vector<std::string> boxes{gateway_box};
  while (static_cast<int>(boxes.size()) < o.sandboxes)
    boxes.push_back(client.create_sandbox(o.image));
  const pid_t pid = server.pid();
  const double idle_kib = sbx::bench::rss_kib(pid);
  const double idle_threads = sbx::bench::proc_status(pid, "Threads");
  std::vector<WebSocket> held;
  held.reserve(static_cast<size_t>(o.terminals));
  const auto opening = Clock::now();
  for (int i = 0; i < o.terminals; ++i) {
    const std::string& box = boxes[static_cast<size_t>(i) % boxes.size()];
    held.push_back(attach(server.port(), box, new_terminal(client, box, "")));
    held.back().send_binary(std::string(1, '\0') + "echo ready-$((1+1))\n");
  }
  for (auto& h : held) {  // each shell answered
    std::string out;
    while (out.find("ready-2") == std::string::npos) {
      auto m = h.receive();
      if (!m) die("a held terminal ended");
      if (m->kind == WebSocket::Message::Kind::binary && !m->payload.empty())
        out += m->payload.substr(1);
    }
  }
  const double open_s = ms_since(opening) / 1000.0;
  const double held_kib = sbx::bench::rss_kib(pid);
  const double held_threads = sbx::bench::proc_status(pid, "Threads");
  std::printf(
      "%d terminals held (opened and answering in %.1f s): sbx serve's resident set "
      "%.1f MiB (idle %.1f MiB, +%.1f MiB, %.0f KiB per terminal); threads %.0f (idle "
      "%.0f)\n",
      o.terminals, open_s, held_kib / 1024, idle_kib / 1024, (held_kib - idle_kib) / 1024,
      (held_kib - idle_kib) / o.terminals, held_threads, idle_threads);
  std::fflush(stdout);
  held.clear();
  ServeClient closer(server.port());  // the first client's connection may have idled out
  for (const auto& box : boxes)
    closer.delete_sandbox(box);
  const bool ok = direct_median <= 2.0 && gateway_median <= 5.0;
  std::printf("%s\n", ok ? "targets met" : "a target was missed");
  return o.check && !ok ? 1 : 0;
}
