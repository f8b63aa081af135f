// exec_loop: the C++ side of bench/python_vs_host.py. Creates one sandbox on a provider through the
// host API, then for each line "N" read on stdin runs `true` N times in a row and prints one line
// of JSON: each command's latency in ms and this process's CPU time (user + system) over them.
// An empty line or EOF closes the sandbox and exits.
//
// Usage: exec_loop CONFIG_JSON_FILE PROVIDER IMAGE

#include <sbx/sbx.hpp>

#include "bench_util.hpp"

#include <sys/resource.h>

#include <cstdio>
#include <iostream>
#include <string>

namespace {

using sbx::bench::Clock;
using sbx::bench::ms_since;

double cpu_ms() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: exec_loop CONFIG_JSON_FILE PROVIDER IMAGE\n");
    return 2;
  }
  sbx::Host::Options options;
  options.config = sbx::Config::load(argv[1]);
  options.labels["sbx.bench"] = "python_vs_host";
  sbx::Host host(std::move(options));
  sbx::Sandbox box = host.provider(argv[2]).create({.image = argv[3], .ttl_s = 1800});
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line) && !line.empty()) {
    const int n = std::stoi(line);
    std::string out = "{\"ms\": [";
    const double cpu_before = cpu_ms();
    for (int i = 0; i < n; ++i) {
      const auto start = Clock::now();
      if (box.exec("true").return_code != 0) return 1;
      out += (i ? "," : "") + std::to_string(ms_since(start));
    }
    out += "], \"cpu_ms\": " + std::to_string(cpu_ms() - cpu_before) + "}";
    std::printf("%s\n", out.c_str());
    std::fflush(stdout);
  }
  box.close();
  return 0;
}
