// Shared helpers of the local_docker tests: a host with provider blocks for the cases, a raw Docker
// Engine API client to check from the outside what the plugin did, and small utilities.
// Everything runs against the real daemon on /var/run/docker.sock (scripts/docker-up.sh).
#pragma once

#include <doctest/doctest.h>

#include <sbx/sbx.hpp>
#include <sbx/sdk/http.hpp>

#include <boost/json.hpp>

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ldtest {

inline constexpr const char* kBusybox = "sbx-busybox:latest";
inline constexpr const char* kBash = "sbx-bash:latest";
inline constexpr const char* kRegistryBusybox = "127.0.0.1:5000/sbx/busybox:latest";
inline constexpr const char* kDockerSocket = "/var/run/docker.sock";

// Every sandbox these tests create carries this host label, so the final check (leftovers_test)
// finds anything a test left behind without touching other suites' sandboxes.
inline constexpr const char* kSuiteLabel = "sbx.test.suite";
inline constexpr const char* kSuiteValue = "local_docker";

// The Docker Engine API, raw, for checks from outside the plugin.
class Docker {
 public:
  Docker();
  // GET /containers/{name}/json, or nothing when the daemon does not know the container.
  std::optional<boost::json::object> inspect(const std::string& container);
  bool exists(const std::string& container) { return inspect(container).has_value(); }
  // Names of the containers (any state) with this label filter ("key" or "key=value").
  std::vector<std::string> containers_with_label(const std::string& filter);
  void remove(const std::string& container);  // force, missing is fine
  void kill(const std::string& container);    // SIGKILL, the container stays (exited)
  bool image_exists(const std::string& image);
  void untag_image(const std::string& image);  // missing is fine
  // Waits until the container is gone; false if it is still there at the deadline.
  bool wait_gone(const std::string& container, std::chrono::seconds limit);
  // The daemon's storage driver can enforce per-container size limits (overlay2 needs xfs+pquota).
  bool storage_supports_size_limit();
  // Runs `argv` in `container` as root through the Engine API's exec, beside the plugin (as root
  // inside the sandbox would): its exit code and its stdout and stderr together. `detach`: starts
  // it and returns at once (exit code -1, no output).
  struct ExecOutput {
    int exit_code = -1;
    std::string output;
  };
  ExecOutput exec(const std::string& container, const std::vector<std::string>& argv,
                  bool detach = false);
  // Any request (a JSON body when `body` is not empty); the response whatever its status.
  sbx::sdk::http::Response send(const std::string& method, const std::string& target,
                                const std::string& body = "");

 private:
  sbx::sdk::http::Client client_;
};

Docker& docker();

// The host of these tests; provider blocks (all plugin local_docker):
//   docker            defaults (network none)
//   docker_bridge     network bridge (ports)
//   docker_volumes    create.allowed_host_paths = [the temporary directory]
//   docker_disk_warn  create.disk_limit = warn
//   docker_no_limits  create.apply_resource_limits = false
//   docker_small      exec.concurrency = 2
//   docker_sh         exec.shell = sh
//   docker_noshell    exec.shell = a shell no image has, probe disabled
//   docker_unreachable socket pointing nowhere
//   docker_slow_probe probe that needs 3 s
//   docker_bad_probe  probe that always fails
sbx::Host& host();
sbx::Provider provider(const std::string& name = "docker");

// A spec on busybox with a TTL (a crashed run must not leak forever) and a unique test label.
sbx::SandboxSpec spec(const std::string& image = kBusybox);

// A fresh random token, e.g. for unique label values.
std::string unique();

// Seconds since `start`.
double seconds_since(std::chrono::steady_clock::time_point start);

// Sandboxes whose containers carry `key=value` (checks "nothing left behind").
std::vector<std::string> leftovers(const std::string& key, const std::string& value);

// A spec carrying a label unique to this value, to check afterwards that nothing was left.
struct Tracked {
  std::string run = unique();
  sbx::SandboxSpec spec = [this] {
    auto s = ldtest::spec();
    s.metadata["sbx.test.run"] = run;
    return s;
  }();
  std::vector<std::string> left() const { return leftovers("sbx.test.run", run); }
};

// The message of what `fn` throws; "" when it throws nothing.
std::string what_of(const std::function<void()>& fn);

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every failure of a create is a CreateError (decision 57); its status() keeps the reason. Fails
// the test case when the create succeeds.
sbx_status create_failure(const sbx::Provider& p, const sbx::SandboxSpec& spec);

// Whether the suite runs local_docker with its agent (the default) or with Docker exec
// ("agent": false in every config): $SBX_TEST_LOCAL_DOCKER_AGENT=0 asks for Docker exec. ctest
// runs each local_docker test in both modes (tests/local_docker/CMakeLists.txt).
bool agent_mode();

// Host options with one provider block "p" of local_docker with `config` (JSON text), and this
// suite's label; provider_with(host) is that block.
sbx::Host::Options options_with(const std::string& config);
inline sbx::Provider provider_with(sbx::Host& host) {
  return host.provider("p");
}

// build/bin/sbx, next to the test programs.
std::string sbx_binary();
// A program next to the test programs (build/bin/<name>).
std::string test_binary(const std::string& name);

// A child process started with posix_spawn: stdout and stderr to files (or a pipe for stdout), the
// environment of this process plus `env`. Killed (SIGKILL) and reaped at destruction if still
// running. One thread uses it.
class Child {
 public:
  struct Options {
    std::vector<std::string> argv;
    std::vector<std::string> env;           // extra "K=V" entries
    std::string stdout_path = "/dev/null";  // ignored with pipe_stdout
    std::string stderr_path = "/dev/null";
    bool pipe_stdout = false;  // stdout_fd() is the read end of a pipe
  };
  explicit Child(const Options& options);
  ~Child();
  Child(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child& operator=(Child&&) = delete;

  pid_t pid() const { return pid_; }
  int stdout_fd() const { return stdout_fd_; }
  void close_stdout();
  void kill(int signal);
  // Waits for the exit: the exit code, 128 + N when a signal N ended it; nothing when `limit`
  // passed first (the child is left running).
  std::optional<int> wait_for(std::chrono::milliseconds limit);
  bool running();

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::optional<int> status_;
};

}  // namespace ldtest
