// ld_kill_target: a small host-API program that the TTL kill tests kill with SIGKILL at chosen
// instants. It creates a busybox sandbox on local_docker with a TTL, runs one command and closes
// the sandbox; the test finds its container by the sbx.run label ($SBX_RUN_ID) and checks that the
// reaper or the TTL removes it, with no sbx process left to help.
//
// Usage: ld_kill_target [--ttl S] [--command CMD] [--file-mib N] [--label K=V]...
//   --file-mib N  a startup file of N MiB: the container stays in "created" while it is written
//   --label K=V   spec metadata (container labels)

// Only the tests' constants are used from support.hpp; this is not a doctest program.
#define DOCTEST_CONFIG_DISABLE
#include "support.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  try {
    sbx::SandboxSpec spec;
    spec.image = ldtest::kBusybox;
    spec.ttl_s = 5;
    std::string command = "sleep 1";
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      const std::string value = argv[i + 1];
      if (flag == "--ttl") {
        spec.ttl_s = std::stod(value);
      } else if (flag == "--command") {
        command = value;
      } else if (flag == "--file-mib") {
        spec.files["/big.bin"] = std::string(std::stoul(value) << 20, 'x');
      } else if (flag == "--label") {
        const size_t eq = value.find('=');
        spec.metadata[value.substr(0, eq)] = eq == std::string::npos ? "" : value.substr(eq + 1);
      } else {
        std::cerr << "ld_kill_target: unknown option " << flag << "\n";
        return 2;
      }
    }
    sbx::Host::Options options;
    options.config = sbx::Config::parse(
        R"({"providers": {"docker": {"plugin": "local_docker", "config": {}}}})", "ld_kill_target");
    options.labels[ldtest::kSuiteLabel] = ldtest::kSuiteValue;
    sbx::Host host(std::move(options));
    sbx::Sandbox box = host.provider("docker").create(spec);
    const sbx::ExecResult result = box.exec(command);
    box.close();
    return result.return_code;
  } catch (const std::exception& e) {
    std::cerr << "ld_kill_target: " << e.what() << "\n";
    return 1;
  }
}
