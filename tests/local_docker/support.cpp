#include "support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <utility>

extern char** environ;

namespace ldtest {
namespace {

namespace http = sbx::sdk::http;

constexpr const char* kHostConfig = R"({
  "providers": {
    "docker": {"plugin": "local_docker", "config": {}},
    "docker_bridge": {"plugin": "local_docker", "config": {"create": {"network": "bridge"}}},
    "docker_volumes": {"plugin": "local_docker",
                       "config": {"create": {"allowed_host_paths": ["@TMP@"]}}},
    "docker_disk_warn": {"plugin": "local_docker", "config": {"create": {"disk_limit": "warn"}}},
    "docker_no_limits": {"plugin": "local_docker",
                         "config": {"create": {"apply_resource_limits": false}}},
    "docker_small": {"plugin": "local_docker",
                     "config": {"agent": false, "exec": {"concurrency": 2}}},
    "docker_sh": {"plugin": "local_docker", "config": {"exec": {"shell": "sh"}}},
    "docker_noshell": {"plugin": "local_docker",
                       "config": {"exec": {"shell": "/no/such/shell"}, "probe": {"command": null}}},
    "docker_unreachable": {"plugin": "local_docker",
                           "config": {"socket": "/nonexistent/sbx-test/docker.sock"}},
    "docker_slow_probe": {"plugin": "local_docker",
                          "config": {"probe": {"command": "sleep 3; printf ok",
                                               "expected_stdout": "ok", "timeout_s": 20}}},
    "docker_bad_probe": {"plugin": "local_docker",
                         "config": {"probe": {"command": "echo not ready; exit 1",
                                              "timeout_s": 1}}}
  }
})";

// Every local_docker block in Docker exec mode ("agent": false) when the suite runs in that mode.
std::string in_mode(const std::string& text) {
  if (agent_mode()) return text;
  boost::json::value config = boost::json::parse(text);
  for (auto& [name, block] : config.at("providers").as_object()) {
    (void)name;
    block.as_object()["config"].as_object()["agent"] = false;
  }
  return boost::json::serialize(config);
}

}  // namespace

bool agent_mode() {
  const char* mode = std::getenv("SBX_TEST_LOCAL_DOCKER_AGENT");
  return !(mode && std::string_view(mode) == "0");
}

Docker::Docker()
    : client_(http::ClientOptions{.base_url = "http://docker", .unix_socket = kDockerSocket}) {}

http::Response Docker::send(const std::string& method, const std::string& target,
                            const std::string& body) {
  http::Request request;
  request.method = method;
  request.target = target;
  if (!body.empty()) {
    request.body = body;
    request.headers.emplace_back("Content-Type", "application/json");
  }
  request.timeout = std::chrono::seconds(60);
  return client_.send(std::move(request));
}

Docker::ExecOutput Docker::exec(const std::string& container, const std::vector<std::string>& argv,
                                bool detach) {
  boost::json::array cmd;
  for (const auto& arg : argv)
    cmd.emplace_back(arg);
  const auto made = send("POST", "/containers/" + container + "/exec",
                         boost::json::serialize(boost::json::object{{"Cmd", std::move(cmd)},
                                                                    {"User", "0"},
                                                                    {"AttachStdout", !detach},
                                                                    {"AttachStderr", !detach}}));
  REQUIRE_MESSAGE(made.status == 201, made.body);
  const std::string id(boost::json::parse(made.body).at("Id").as_string());
  const auto started = send("POST", "/exec/" + id + "/start",
                            boost::json::serialize(boost::json::object{{"Detach", detach}}));
  REQUIRE_MESSAGE(started.status == 200, started.body);
  ExecOutput out;
  if (detach) return out;
  // The multiplexed stream: an 8-byte header (stream, 0, 0, 0, big-endian length) per frame.
  for (size_t at = 0; at + 8 <= started.body.size();) {
    size_t n = 0;
    for (size_t i = 4; i < 8; ++i)
      n = (n << 8) | static_cast<unsigned char>(started.body[at + i]);
    out.output += started.body.substr(at + 8, n);
    at += 8 + n;
  }
  const auto inspected = send("GET", "/exec/" + id + "/json");
  REQUIRE_MESSAGE(inspected.status == 200, inspected.body);
  const boost::json::value answer = boost::json::parse(inspected.body);
  const auto& code = answer.at("ExitCode");
  out.exit_code = code.is_int64() ? static_cast<int>(code.as_int64()) : -1;
  return out;
}

std::optional<boost::json::object> Docker::inspect(const std::string& container) {
  const auto response = send("GET", "/containers/" + container + "/json");
  if (response.status == 404) return std::nullopt;
  REQUIRE_MESSAGE(response.status == 200, response.body);
  return boost::json::parse(response.body).as_object();
}

std::vector<std::string> Docker::containers_with_label(const std::string& filter) {
  const boost::json::object filters{{"label", boost::json::array{filter}}};
  const auto response = send(
      "GET", "/containers/json?all=1&filters=" + http::url_encode(boost::json::serialize(filters)));
  REQUIRE_MESSAGE(response.status == 200, response.body);
  std::vector<std::string> names;
  const boost::json::value list = boost::json::parse(response.body);
  for (const auto& item : list.as_array()) {
    const auto& name = item.as_object().at("Names").as_array().at(0).as_string();
    names.emplace_back(std::string_view(name).substr(1));
  }
  return names;
}

void Docker::remove(const std::string& container) {
  const auto response = send("DELETE", "/containers/" + container + "?force=1&v=1");
  REQUIRE_MESSAGE((response.status < 300 || response.status == 404 || response.status == 409),
                  response.body);
}

void Docker::kill(const std::string& container) {
  const auto response = send("POST", "/containers/" + container + "/kill?signal=KILL");
  REQUIRE_MESSAGE(response.status < 300, response.body);
}

bool Docker::image_exists(const std::string& image) {
  return send("GET", "/images/" + image + "/json").status == 200;
}

void Docker::untag_image(const std::string& image) {
  const auto response = send("DELETE", "/images/" + image + "?noprune=1");
  REQUIRE_MESSAGE((response.status < 300 || response.status == 404), response.body);
}

bool Docker::wait_gone(const std::string& container, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!exists(container)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return !exists(container);
}

bool Docker::storage_supports_size_limit() {
  const auto response = send("GET", "/info");
  REQUIRE(response.status == 200);
  const auto info = boost::json::parse(response.body).as_object();
  const std::string driver(info.at("Driver").as_string());
  if (driver != "overlay2") return driver == "devicemapper" || driver == "btrfs" || driver == "zfs";
  for (const auto& pair : info.at("DriverStatus").as_array()) {
    const auto& kv = pair.as_array();
    if (kv.at(0).as_string() == "Backing Filesystem" && kv.at(1).as_string() == "xfs") return true;
  }
  return false;
}

Docker& docker() {
  static Docker instance;
  return instance;
}

sbx::Host& host() {
  static sbx::Host instance = [] {
    sbx::Host::Options options;
    // The test's own temporary directories (sbx::testing::TempDir) may be bind-mounted.
    std::string text = kHostConfig;
    text.replace(text.find("@TMP@"), 5, std::filesystem::temp_directory_path().string());
    options.config = sbx::Config::parse(in_mode(text), "local_docker tests");
    options.labels[kSuiteLabel] = kSuiteValue;
    return sbx::Host(std::move(options));
  }();
  return instance;
}

sbx::Provider provider(const std::string& name) {
  return host().provider(name);
}

sbx::SandboxSpec spec(const std::string& image) {
  sbx::SandboxSpec s;
  s.image = image;
  s.ttl_s = 900;
  s.metadata["sbx.test.owner"] = "local_docker-tests";
  return s;
}

std::string unique() {
  static std::mt19937_64 engine{std::random_device{}()};
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(engine()));
  return buffer;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

sbx_status create_failure(const sbx::Provider& p, const sbx::SandboxSpec& spec) {
  try {
    p.create(spec);
  } catch (const sbx::CreateError& e) {
    return e.status();
  }
  FAIL("create must fail with a CreateError");
  return SBX_STATUS_OK;
}

sbx::Host::Options options_with(const std::string& config) {
  sbx::Host::Options options;
  options.config = sbx::Config::parse(
      in_mode(R"({"providers": {"p": {"plugin": "local_docker", "config": )" + config + "}}}"),
      "test");
  options.labels[kSuiteLabel] = kSuiteValue;
  return options;
}

std::vector<std::string> leftovers(const std::string& key, const std::string& value) {
  return docker().containers_with_label(key + "=" + value);
}

std::string test_binary(const std::string& name) {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / name).string();
}

std::string sbx_binary() {
  return test_binary("sbx");
}

Child::Child(const Options& options) {
  REQUIRE_FALSE(options.argv.empty());
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  int pipe_fds[2] = {-1, -1};
  if (options.pipe_stdout) {
    REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options.stdout_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, options.stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> argv;
  for (const auto& arg : options.argv)
    argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e)
    env_text.emplace_back(*e);
  for (const auto& e : options.env)
    env_text.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_text)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  const int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (options.pipe_stdout) {
    ::close(pipe_fds[1]);
    stdout_fd_ = pipe_fds[0];
  }
  REQUIRE_MESSAGE(rc == 0, "posix_spawn ", options.argv[0], ": ", std::strerror(rc));
}

Child::Child(Child&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      stdout_fd_(std::exchange(other.stdout_fd_, -1)),
      status_(other.status_) {}

Child::~Child() {
  close_stdout();
  if (pid_ > 0 && running()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

void Child::close_stdout() {
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
  stdout_fd_ = -1;
}

void Child::kill(int signal) {
  if (pid_ > 0 && running()) ::kill(pid_, signal);
}

bool Child::running() {
  if (status_ || pid_ <= 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return false;
}

std::optional<int> Child::wait_for(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status_;
}

}  // namespace ldtest
