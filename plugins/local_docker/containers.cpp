#include "containers.hpp"

#include "agent.hpp"
#include "exec.hpp"
#include "host_dirs.hpp"

#include <boost/json/array.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace sbx::local_docker {
namespace {

namespace json = boost::json;

constexpr int64_t kMiB = 1024 * 1024;

// The longest TTL taken (about 68 years; once the longest sleep busybox and coreutils accept).
constexpr int64_t kMaxSleepSeconds = 2147483647;

// The TTL's clock, a shell function shared by the keep-alive and the entrypoint watchdog:
// `w EXPIRES_AT DIR` returns once the expiry has passed. The expiry in force is that of the file
// expires_at in DIR (the host's, mounted read-only: reaper/expiry_file.hpp), else the argument.
// It enters DIR first and reads the file relative to it from then on, so a /.sbx renamed or
// replaced by the sandbox's root later changes nothing. It reads the file with the shell's
// builtin `read`, compares with `date +%s` and sleeps the time left, at most 20 s, so a renew is
// seen within 20 s and an idle sandbox runs two short processes (date, sleep) every 20 s. A file
// that cannot be read once the expiry passed is read again 1 s later, twice, before the last
// expiry seen counts. Without a working `date` it only sleeps, and the reaper ends the sandbox.
constexpr std::string_view kExpiryClock =
    "w() {\n"
    "  e=$1 f= m=0\n"
    "  if [ -n \"$2\" ] && cd \"$2\" 2>/dev/null; then f=expires_at; fi\n"
    "  while :; do\n"
    "    if [ -z \"$f\" ]; then m=0\n"
    "    elif read -r v <\"$f\" && [ \"$v\" -gt 0 ]; then e=$v m=0\n"
    "    else m=$((m + 1)); fi 2>/dev/null\n"
    "    n=$(date +%s 2>/dev/null)\n"
    "    case $n in\n"
    "    ''|*[!0-9]*) s=20 ;;\n"
    "    *) if [ \"$n\" -lt \"$e\" ]; then s=$((e - n)); if [ $s -gt 20 ]; then s=20; fi\n"
    "       elif [ $m -eq 0 ] || [ $m -gt 2 ]; then return 0\n"
    "       else s=1; fi ;;\n"
    "    esac\n"
    "    sleep $s\n"
    "  done\n"
    "}\n";

// The keep-alive of a sandbox with a TTL and no entrypoint: the main process ends (status 0) at
// the expiry. Arguments: $1 = expiry (Unix seconds), $2 = the expiry file's directory or "".
constexpr std::string_view kTtlKeepalive = "w \"$1\" \"$2\"\nexit 0\n";

// Runs the spec's entrypoint under the TTL: when it expires the entrypoint gets SIGTERM, then
// SIGKILL 10 s later, and the shell (the container's main process) exits, which ends the container
// and lets AutoRemove delete it. Signals sent to the container are passed on to the entrypoint.
// Arguments: $1 = expiry (Unix seconds), $2 = the expiry file's directory or "", then the
// entrypoint's argv.
constexpr std::string_view kTtlWatchdog =
    "e=$1 f=$2; shift 2\n"
    "\"$@\" & p=$!\n"
    "trap 'kill -TERM $p 2>/dev/null' TERM INT HUP\n"
    "(w \"$e\" \"$f\"; kill -TERM $p 2>/dev/null; sleep 10; kill -KILL $p 2>/dev/null) "
    ">/dev/null 2>&1 </dev/null &\n"
    "wait $p; r=$?\n"
    "while kill -0 $p 2>/dev/null; do wait $p; r=$?; done\n"
    "exit $r\n";

std::string port_key(uint16_t port) {
  return std::to_string(port) + "/tcp";
}

int64_t ttl_seconds(std::chrono::milliseconds ttl) {
  const int64_t ms = ttl.count();
  const int64_t s = ms / 1000 + (ms % 1000 > 0 ? 1 : 0);  // ceil, without overflow
  return std::clamp<int64_t>(s, 1, kMaxSleepSeconds);
}

json::array string_array(const std::vector<std::string>& items) {
  json::array out;
  for (const auto& item : items)
    out.emplace_back(item);
  return out;
}

json::object labels_of(const sdk::Spec& spec, std::optional<int64_t> expires_at, bool expiry_file) {
  json::object labels;
  // Metadata first: the host's labels (used to find and reap sandboxes) win over a metadata key
  // of the same name, and the sandbox marker wins over both.
  for (const auto& [key, value] : spec.metadata)
    labels[key] = value;
  for (const auto& [key, value] : spec.labels)
    labels[key] = value;
  labels[kSandboxLabel] = "1";
  if (expires_at) labels[kExpiresAtLabel] = std::to_string(*expires_at);
  if (expires_at && expiry_file) labels[expiry::kFileLabel] = expiry::kPath;
  if (spec.workdir) labels[kWorkdirLabel] = *spec.workdir;
  if (!spec.ports.empty()) {
    std::string ports;
    for (uint16_t port : spec.ports)
      ports += (ports.empty() ? "" : ",") + std::to_string(port);
    labels[kPortsLabel] = ports;
  }
  return labels;
}

// Refuses an environment and entrypoint that the kernel would refuse to start (E2BIG), which the
// daemon only reports as a main process that exited 1.
void check_exec_sizes(const sdk::Spec& spec) {
  const size_t longest = max_arg_strlen() - 1;  // without the NUL
  size_t total = 0;
  for (const auto& [key, value] : spec.env) {
    const size_t size = key.size() + 1 + value.size();
    if (size > longest) {
      throw sdk::Error::invalid_argument(
          "spec.env: " + key + " is " + std::to_string(size) + " bytes as KEY=value; Linux takes " +
          "at most " + std::to_string(longest) + " bytes per environment string (MAX_ARG_STRLEN)");
    }
    total += size + 1;
  }
  if (spec.entrypoint) {
    for (size_t i = 0; i < spec.entrypoint->size(); ++i) {
      const size_t size = (*spec.entrypoint)[i].size();
      if (size > longest) {
        throw sdk::Error::invalid_argument("spec.entrypoint[" + std::to_string(i) + "] is " +
                                           std::to_string(size) + " bytes; Linux takes at most " +
                                           std::to_string(longest) +
                                           " bytes per argument (MAX_ARG_STRLEN)");
      }
      total += size + 1;
    }
  }
  if (total > kMaxSpecEnvBytes) {
    throw sdk::Error::invalid_argument(
        "spec.env and spec.entrypoint take " + std::to_string(total) +
        " bytes together; local_docker accepts at most " + std::to_string(kMaxSpecEnvBytes) +
        " (1 MiB): the kernel gives every process 2 MiB for arguments and environment, and "
        "the sandbox's environment goes to each command too. Pass large values as files.");
  }
}

json::array env_of(const sdk::KeyValues& env) {
  json::array out;
  for (const auto& [key, value] : env) {
    if (key.empty() || key.find('=') != std::string::npos || key.find('\0') != std::string::npos) {
      throw sdk::Error::invalid_argument("spec.env: invalid variable name '" + key + "'");
    }
    out.emplace_back(key + "=" + value);
  }
  return out;
}

// With the agent, it is the main process and does the shell's work below itself: it serves until
// the expiry (or forever), runs the spec's entrypoint as its child under the TTL, passes signals
// on to it and ends with it (agent/README.md, "PID 1").
void set_agent_process(json::object& body, json::object& host, const sdk::Spec& spec,
                       std::optional<int64_t> expires_at, bool expiry_file,
                       const AgentLaunch& agent) {
  json::array argv{std::string(kAgentBinary), "--listen", "unix:" + std::string(kAgentSocket),
                   "--state-dir", std::string(kAgentRunDir)};
  if (!agent.user.empty()) {
    body["User"] = "0:0";
    if (spec.entrypoint) {  // the entrypoint's user; commands get it per request
      argv.emplace_back("--user");
      argv.emplace_back(agent.user);
    }
  }
  if (spec.ttl) {
    host["AutoRemove"] = true;
    argv.emplace_back("--expires-at");
    argv.emplace_back(std::to_string(expires_at.value_or(0)));
    if (expiry_file) {
      argv.emplace_back("--expiry-file");
      argv.emplace_back(std::string(expiry::kPath));
    }
  }
  if (spec.entrypoint) {
    argv.emplace_back("--");
    for (const auto& arg : *spec.entrypoint)
      argv.emplace_back(arg);
  }
  body["Entrypoint"] = std::move(argv);
  body["Cmd"] = json::array{};
}

// Entrypoint and Cmd: the keep-alive process, the spec's entrypoint, or either under the TTL.
void set_process(json::object& body, json::object& host, const CreateConfig& create,
                 const sdk::Spec& spec, std::optional<int64_t> expires_at, bool expiry_file) {
  const std::string& shell = create.keepalive_shell;
  if (spec.ttl) {
    // The container must end by itself even if the host process dies: AutoRemove deletes it when
    // its main process exits, and the main process exits when the TTL expires.
    host["AutoRemove"] = true;
    const std::string expiry = std::to_string(expires_at.value_or(0));
    const std::string file = expiry_file ? std::string(kTtlDir) : "";
    const std::string clock(kExpiryClock);
    if (spec.entrypoint) {
      body["Entrypoint"] = json::array{
          shell, "-c", clock + std::string(kTtlWatchdog), "sbx-ttl-watchdog", expiry, file};
      body["Cmd"] = string_array(*spec.entrypoint);
    } else {
      body["Entrypoint"] =
          json::array{shell, "-c", clock + std::string(kTtlKeepalive), "sbx-ttl", expiry, file};
    }
  } else if (spec.entrypoint) {
    body["Entrypoint"] = string_array(*spec.entrypoint);
  } else {
    body["Entrypoint"] = json::array{shell, "-c", create.keepalive_cmd};
  }
  // An explicit Entrypoint replaces the image's; an empty Cmd keeps the image's CMD out of argv.
  if (!body.contains("Cmd")) body["Cmd"] = json::array{};
}

void set_resources(json::object& host, const CreateConfig& create, const sdk::Resources& r,
                   bool with_disk_limit) {
  if (r.gpu_type) {
    throw sdk::Error::invalid_argument(
        "resources.gpu_type ('" + *r.gpu_type +
        "') is not supported by local_docker: Docker cannot choose GPUs by model. Request a "
        "count with resources.gpu and run on a machine with the GPU you need.");
  }
  // Docker's smallest CPU quota is 0.01 CPUs; a smaller value would round to NanoCpus 0, which
  // Docker reads as "no limit".
  if (r.cpu && !(*r.cpu >= 0.01)) {
    throw sdk::Error::invalid_argument("resources.cpu must be >= 0.01 (Docker's smallest quota)");
  }
  if (r.memory_mib && *r.memory_mib <= 0) {
    throw sdk::Error::invalid_argument("resources.memory_mib must be > 0");
  }
  if (r.disk_gib && *r.disk_gib <= 0) {
    throw sdk::Error::invalid_argument("resources.disk_gib must be > 0");
  }
  if (r.cpu && !(*r.cpu <= 1e6)) throw sdk::Error::invalid_argument("resources.cpu is too large");
  if (r.memory_mib && *r.memory_mib > INT64_MAX / kMiB) {
    throw sdk::Error::invalid_argument("resources.memory_mib is too large");
  }
  if (create.apply_resource_limits) {
    if (r.cpu) host["NanoCpus"] = static_cast<int64_t>(std::llround(*r.cpu * 1e9));
    if (r.memory_mib) {
      // Swap equal to memory: the limit is a hard cap, the container cannot swap past it.
      host["Memory"] = *r.memory_mib * kMiB;
      host["MemorySwap"] = *r.memory_mib * kMiB;
    }
  }
  if (r.gpu && *r.gpu > 0) {
    host["DeviceRequests"] =
        json::array{json::object{{"Driver", ""},
                                 {"Count", *r.gpu},
                                 {"DeviceIDs", nullptr},
                                 {"Capabilities", json::array{json::array{"gpu"}}},
                                 {"Options", json::object{}}}};
  }
  if (r.disk_gib && with_disk_limit) {
    host["StorageOpt"] = json::object{{"size", std::to_string(*r.disk_gib) + "G"}};
  }
}

void set_ports(json::object& body, json::object& host, const CreateConfig& create,
               const std::vector<uint16_t>& ports) {
  if (ports.empty()) return;
  if (create.network == "none") {
    throw sdk::Error::invalid_argument(
        "spec.ports needs a network: published ports cannot be reached from a container with "
        "network \"none\". Set create.network in the local_docker config (e.g. \"bridge\").");
  }
  json::object exposed;
  json::object bindings;
  for (uint16_t port : ports) {
    exposed[port_key(port)] = json::object{};
    // An empty HostPort lets the daemon choose a free one.
    bindings[port_key(port)] =
        json::array{json::object{{"HostIp", create.publish_host}, {"HostPort", ""}}};
  }
  body["ExposedPorts"] = std::move(exposed);
  // With the host's network the ports are the host's own; there is nothing to publish.
  if (create.network != "host") host["PortBindings"] = std::move(bindings);
}

void set_volumes(json::object& host, const SandboxOptions& options) {
  if (!options.binds.empty()) host["Binds"] = string_array(options.binds);
  if (options.mounts.empty()) return;
  json::array mounts;
  for (const Mount& m : options.mounts) {
    mounts.emplace_back(json::object{{"Type", m.source.starts_with('/') ? "bind" : "volume"},
                                     {"Source", m.source},
                                     {"Target", m.target},
                                     {"ReadOnly", m.read_only}});
  }
  host["Mounts"] = std::move(mounts);
}

std::string string_of(const json::object& object, std::string_view key) {
  const auto* v = object.if_contains(key);
  return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

const json::object* object_of(const json::object& object, std::string_view key) {
  const auto* v = object.if_contains(key);
  return v && v->is_object() ? &v->get_object() : nullptr;
}

bool contains_ci(std::string_view text, std::string_view needle) {
  auto lower = [](std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return out;
  };
  return lower(text).find(lower(needle)) != std::string::npos;
}

sdk::SandboxInfo info_from_summary(const json::object& item) {
  sdk::SandboxInfo info;
  if (const auto* names = item.if_contains("Names"); names && names->is_array()) {
    for (const auto& name : names->get_array()) {
      if (!name.is_string()) continue;
      std::string_view text = name.get_string();
      if (text.starts_with('/')) text.remove_prefix(1);
      // A container linked into another has extra names with a '/'; its own name has none.
      if (text.find('/') == std::string_view::npos) {
        info.id = std::string(text);
        break;
      }
    }
  }
  if (info.id.empty()) info.id = string_of(item, "Id");
  info.status = status_from_state(string_of(item, "State"));
  if (const auto* labels = object_of(item, "Labels")) {
    for (const auto& member : *labels) {
      if (member.value().is_string()) {
        info.labels.emplace(member.key(), std::string(member.value().get_string()));
      }
    }
  }
  if (const auto* created = item.if_contains("Created"); created && created->is_number()) {
    info.created_unix_ms = created->to_number<int64_t>() * 1000;
  }
  return info;
}

std::string bracket_ipv6(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

}  // namespace

std::optional<int64_t> expiry_of(const sdk::Spec& spec) {
  if (!spec.ttl) return std::nullopt;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(now).count();
  return now_s + ttl_seconds(*spec.ttl);
}

json::object container_config(const Config& config, const sdk::Spec& spec,
                              const SandboxOptions& options, const ImageRef& image,
                              std::optional<int64_t> expires_at, bool with_disk_limit,
                              const std::string& ttl_dir, const AgentLaunch* agent) {
  const CreateConfig& create = config.create;
  const bool expiry_file = expires_at && !ttl_dir.empty();
  json::object body;
  json::object host;
  body["Image"] = image.name;
  body["Labels"] = labels_of(spec, expires_at, expiry_file);
  // Only ever the host's (never the spec's metadata): connect trusts it as commands' default user.
  body["Labels"].as_object().erase(kAgentUserLabel);
  if (agent) {
    body["Labels"].as_object()[kAgentLabel] = agent->run_dir;
    if (!agent->user.empty()) body["Labels"].as_object()[kAgentUserLabel] = agent->user;
  }
  check_exec_sizes(spec);
  body["Env"] = env_of(spec.env);
  if (spec.workdir) body["WorkingDir"] = *spec.workdir;
  body["AttachStdin"] = false;
  body["AttachStdout"] = false;
  body["AttachStderr"] = false;
  body["Tty"] = false;
  body["OpenStdin"] = false;
  if (agent) {
    set_agent_process(body, host, spec, expires_at, expiry_file, *agent);
  } else {
    set_process(body, host, create, spec, expires_at, expiry_file);
  }
  set_resources(host, create, spec.resources, with_disk_limit);
  set_ports(body, host, create, spec.ports);
  set_volumes(host, options);
  // The agent is the init: under Docker's it would not be PID 1 (and `kill -9 -1` inside, which
  // PID 1 is immune to, would end it).
  host["Init"] = create.init && !agent;
  if (agent) {
    json::array& binds =
        host["Binds"].is_array() ? host["Binds"].as_array() : host["Binds"].emplace_array();
    binds.emplace_back(agent->binary + ":" + std::string(kAgentBinary) + ":ro");
    binds.emplace_back(agent->run_dir + ":" + std::string(kAgentRunDir));
  }
  if (expiry_file) {
    // A bind "mount" (not a Binds string) fails the create when the source is missing, as it is
    // for a daemon that does not share this machine's files: the expiry would not be the host's.
    json::array& mounts =
        host["Mounts"].is_array() ? host["Mounts"].as_array() : host["Mounts"].emplace_array();
    mounts.emplace_back(json::object{{"Type", "bind"},
                                     {"Source", ttl_dir},
                                     {"Target", std::string(kTtlDir)},
                                     {"ReadOnly", true}});
  }
  host["NetworkMode"] = create.network;
  host["ReadonlyRootfs"] = create.read_only;
  if (!create.cap_drop.empty()) host["CapDrop"] = string_array(create.cap_drop);
  if (!create.security_opt.empty()) host["SecurityOpt"] = string_array(create.security_opt);
  if (create.pids_limit) host["PidsLimit"] = *create.pids_limit;
  body["HostConfig"] = std::move(host);
  return body;
}

std::string create_container(DockerApi& api, const std::string& name, const json::object& body,
                             const sdk::Logger& log, const sdk::CancelToken& cancel) {
  const http::Response response =
      api.call("POST", "/containers/create?name=" + http::url_encode(name), json::serialize(body),
               "creating container " + name, cancel);
  const json::object result = parse_body(response.body, "creating container " + name);
  if (const auto* warnings = result.if_contains("Warnings"); warnings && warnings->is_array()) {
    for (const auto& warning : warnings->get_array()) {
      if (warning.is_string()) log.warn("container ", name, ": ", warning.get_string());
    }
  }
  const std::string id = string_of(result, "Id");
  if (id.empty())
    throw sdk::Error::internal("creating container " + name + ": no Id in the answer");
  return id;
}

bool is_storage_opt_unsupported(const sdk::Error& error) {
  // e.g. "--storage-opt is supported only for overlay over xfs with 'pquota' mount option"
  const std::string_view text = error.what();
  return error.http_status() >= 400 &&
         (contains_ci(text, "storage-opt") || contains_ci(text, "storage opt") ||
          contains_ci(text, "storageopt"));
}

void start_container(DockerApi& api, const std::string& container,
                     std::chrono::milliseconds timeout, const sdk::CancelToken& cancel) {
  api.call("POST", "/containers/" + container + "/start", "", "starting container " + container,
           cancel, timeout);
}

ExitWatch::ExitWatch(DockerApi& api, const std::string& container, const sdk::CancelToken& cancel) {
  http::Request request;
  request.method = "POST";
  request.target = "/containers/" + container + "/wait?condition=next-exit";
  call_ = api.start(std::move(request), cancel);
}

ExitWatch::~ExitWatch() {
  call_.cancel();
  try {
    call_.get();
  } catch (...) {  // cancelled, as intended
  }
}

std::optional<int64_t> ExitWatch::exit_code(std::chrono::milliseconds limit) const {
  if (!call_.wait_until(std::chrono::steady_clock::now() + limit)) return std::nullopt;
  try {
    const http::Response response = call_.get();
    if (response.status != 200) return std::nullopt;
    const json::object body = parse_body(response.body, "waiting for a container");
    const auto* code = body.if_contains("StatusCode");
    if (code && code->is_number()) return code->to_number<int64_t>();
  } catch (const sdk::Error&) {
  }
  return std::nullopt;
}

std::string container_output_tail(DockerApi& api, const std::string& container, int lines) {
  try {
    http::Request request;
    request.target =
        "/containers/" + container + "/logs?stdout=1&stderr=1&tail=" + std::to_string(lines);
    const http::Response response = api.send(std::move(request), sdk::CancelToken());
    if (response.status != 200) return {};
    // Without a TTY the log is multiplexed: 8-byte frame headers (stream, 0, 0, 0, big-endian
    // size).
    std::string text;
    std::string_view rest = response.body;
    while (rest.size() >= 8 && static_cast<unsigned char>(rest[0]) <= 2 && rest[1] == 0 &&
           rest[2] == 0 && rest[3] == 0) {
      const auto byte = [&](size_t i) {
        return static_cast<uint32_t>(static_cast<uint8_t>(rest[i]));
      };
      const size_t size = (byte(4) << 24) | (byte(5) << 16) | (byte(6) << 8) | byte(7);
      rest.remove_prefix(8);
      text.append(rest.substr(0, size));
      rest.remove_prefix(std::min(size, rest.size()));
    }
    if (text.empty()) text = std::string(rest);  // a TTY container's plain log
    return shorten(text, 1000);
  } catch (const std::exception&) {
    return {};
  }
}

json::object inspect_container(DockerApi& api, const std::string& container,
                               const sdk::CancelToken& cancel) {
  const http::Response response = api.call("GET", "/containers/" + container + "/json", "",
                                           "inspecting container " + container, cancel);
  return parse_body(response.body, "inspecting container " + container);
}

sdk::SandboxStatus status_from_state(std::string_view state) {
  if (state == "running") return sdk::SandboxStatus::running;
  if (state == "paused") return sdk::SandboxStatus::paused;
  if (state == "created" || state == "restarting") return sdk::SandboxStatus::starting;
  if (state == "exited" || state == "removing" || state == "dead") {
    return sdk::SandboxStatus::stopped;
  }
  return sdk::SandboxStatus::unknown;
}

sdk::SandboxStatus container_status(DockerApi& api, const std::string& container,
                                    const sdk::CancelToken& cancel) {
  http::Request request;
  request.target = "/containers/" + container + "/json";
  const http::Response response = api.send(std::move(request), cancel);
  if (response.status == 404) return sdk::SandboxStatus::stopped;
  if (response.status != 200) {
    throw api_error(response.status, response.body, "inspecting container " + container);
  }
  const json::object inspect = parse_body(response.body, "inspecting container " + container);
  const json::object* state = object_of(inspect, "State");
  return status_from_state(state ? string_of(*state, "Status") : std::string());
}

void remove_container(DockerApi& api, const std::string& container, const sdk::CancelToken& cancel,
                      std::optional<std::chrono::steady_clock::time_point> deadline) {
  // 0: the request timeout; otherwise what is left of the deadline.
  auto timeout = [&] {
    if (!deadline) return std::chrono::milliseconds(0);
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      throw sdk::Error::timeout("removing container " + container + ": out of time");
    }
    return left;
  };
  http::Request request;
  request.method = "DELETE";
  request.target = "/containers/" + container + "?force=1&v=1";
  request.timeout = timeout();
  const http::Response response = api.send(std::move(request), cancel);
  if (response.status < 300 || response.status == 404) return;
  // A container with AutoRemove that just ended is being removed by the daemon already: wait for
  // that, so that the container is gone when this returns.
  if (response.status == 409 && contains_ci(docker_message(response.body), "already in progress")) {
    http::Request wait;
    wait.method = "POST";
    wait.target = "/containers/" + container + "/wait?condition=removed";
    wait.timeout = timeout();
    const http::Response waited = api.send(std::move(wait), cancel);
    if (waited.status < 300 || waited.status == 404) return;
    throw api_error(waited.status, waited.body,
                    "waiting for the removal of container " + container);
  }
  throw api_error(response.status, response.body, "removing container " + container);
}

std::vector<sdk::SandboxInfo> list_containers(DockerApi& api, const sdk::KeyValues& selector,
                                              const sdk::CancelToken& cancel) {
  json::array label_filters{std::string(kSandboxLabel) + "=1"};
  for (const auto& [key, value] : selector) {
    if (key == kSandboxLabel) continue;
    // Docker's label filter: "key" matches any value, "key=value" that value.
    label_filters.emplace_back(value.empty() ? key : key + "=" + value);
  }
  const json::object filters{{"label", std::move(label_filters)}};
  const http::Response response = api.call(
      "GET", "/containers/json?all=1&filters=" + http::url_encode(json::serialize(filters)), "",
      "listing containers", cancel);
  boost::system::error_code ec;
  const json::value list = json::parse(response.body, ec);
  if (ec || !list.is_array()) {
    throw sdk::Error::internal("listing containers: unexpected answer: " +
                               shorten(response.body, 200));
  }
  std::vector<sdk::SandboxInfo> out;
  for (const auto& item : list.get_array()) {
    if (item.is_object()) out.push_back(info_from_summary(item.get_object()));
  }
  return out;
}

sdk::Endpoint endpoint_from_inspect(const json::object& inspect, uint16_t port,
                                    const std::string& publish_host, const std::string& container) {
  const json::object* host_config = object_of(inspect, "HostConfig");
  if (host_config && string_of(*host_config, "NetworkMode") == "host") {
    return {"http://" + bracket_ipv6(publish_host) + ":" + std::to_string(port), {}};
  }
  const json::object* settings = object_of(inspect, "NetworkSettings");
  const json::object* ports = settings ? object_of(*settings, "Ports") : nullptr;
  const auto* bindings = ports ? ports->if_contains(port_key(port)) : nullptr;
  if (!bindings || !bindings->is_array() || bindings->get_array().empty()) {
    throw sdk::Error::failed_precondition("container " + container + " has no host binding for " +
                                          port_key(port) + " (is the sandbox still running?)");
  }
  // Prefer the binding on publish_host; Docker may add an IPv6 twin of an IPv4 binding.
  const json::object* chosen = nullptr;
  for (const auto& binding : bindings->get_array()) {
    if (!binding.is_object()) continue;
    if (!chosen) chosen = &binding.get_object();
    if (string_of(binding.get_object(), "HostIp") == publish_host) {
      chosen = &binding.get_object();
      break;
    }
  }
  const std::string host_port = chosen ? string_of(*chosen, "HostPort") : std::string();
  if (host_port.empty()) {
    throw sdk::Error::failed_precondition("container " + container + " reports no host port for " +
                                          port_key(port));
  }
  std::string host_ip = string_of(*chosen, "HostIp");
  if (host_ip.empty() || host_ip == "0.0.0.0" || host_ip == "::") host_ip = publish_host;
  return {"http://" + bracket_ipv6(host_ip) + ":" + host_port, {}};
}

}  // namespace sbx::local_docker
