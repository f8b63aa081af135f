// The `sbx` command: a thin host over the core library.
//
//   sbx plugins   [--json]                     list plugin files and the providers they offer
//   sbx providers [--json]                     list the configured provider blocks
//   sbx run --provider NAME [options] -- CMD   run one command in a fresh sandbox
//
// Global options (before or after the subcommand): --config FILE (default $SBX_CONFIG),
// --plugin-dir DIR (repeatable), --log-level LEVEL.

#include <sbx/sbx.hpp>
#include <sbx/sdk/json.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kExitUsage = 2;
constexpr int kExitLocalIo = 74;   // EX_IOERR: writing our output or a local file failed
constexpr int kExitFailure = 125;  // like `docker run`: the sandbox, not the command, failed
constexpr int kExitInterrupted = 130;
constexpr double kDefaultStopTimeout = 10;

const char* const kMainHelp = R"(sbx - run commands in sandboxes through provider plugins

Usage:
  sbx [global options] <command> [options]

Commands:
  plugins     List plugin files and the providers they offer
  providers   List configured providers (and plugin providers usable by id)
  run         Create a sandbox, run one command in it, close it
  list        List a provider's sandboxes by label
  reap        Remove a provider's sandboxes by label (e.g. leaks of a crashed run)

Global options:
  --config FILE       Host configuration (JSON); default: $SBX_CONFIG if set
  --plugin-dir DIR    Also look for plugins in DIR (repeatable); $SBX_PLUGIN_PATH is also used
  --log-level LEVEL   trace, debug, info, warn (default), error, off
  -h, --help          Show help (also: sbx <command> --help)
  --version           Show the sbx and ABI versions
)";

const char* const kPluginsHelp = R"(Usage: sbx plugins [--json]

Lists every plugin file found in the plugin directories: its name, version, ABI version and the
provider ids it offers, or why it cannot be used. Loads each plugin to read its descriptor.

Options:
  --json   Print a JSON array instead of text
)";

const char* const kProvidersHelp = R"(Usage: sbx providers [--json]

Lists the provider blocks of the configuration, then the provider ids offered by plugins that no
block shadows (usable by id with their default config).

Options:
  --json   Print a JSON array instead of text
)";

const char* const kListHelp = R"(Usage: sbx list --provider NAME [--label K=V]... [--json]

Lists the sandboxes of a provider whose labels match every --label (K=V: that value; K: any value).
Every sandbox sbx creates carries sbx.run, sbx.host and sbx.provider labels plus its metadata.

Options:
  --provider NAME   Provider block name or provider id
  --label K=V       Label selector (repeatable)
  --json            Print a JSON array instead of text
)";

const char* const kReapHelp = R"(Usage: sbx reap --provider NAME (--label K=V... | --all) [--json]

Force-removes the sandboxes of a provider whose labels match every --label, and prints them.
Without a selector it refuses to run unless --all is given.

Options:
  --provider NAME   Provider block name or provider id
  --label K=V       Label selector (repeatable); e.g. --label sbx.run=3f2a9c0d1e4b
  --all             Remove every sandbox of the provider
  --json            Print a JSON array instead of text
)";

const char* const kRunHelp = R"(Usage: sbx run --provider NAME [options] -- COMMAND [ARG...]

Creates a sandbox, uploads files, runs COMMAND (through the sandbox's shell; several words are
quoted and joined), prints its stdout and stderr as they arrive, downloads files, and closes the
sandbox, also when something fails or on Ctrl-C. Exits with the command's return code; 125 when
the sandbox could not run it (timeout, backend error, or a return code no exit status can carry);
2 for usage errors; 74 when writing the output or a downloaded file failed (e.g. a full disk; the
command is stopped); 130 when interrupted (SIGINT, SIGTERM, SIGHUP); 141 when the output's reader
went away (the command is stopped). After a stop, sbx waits at most --stop-timeout seconds for
the provider to end the command and close the sandbox (a second Ctrl-C stops waiting at once),
then says what may be left and how to remove it.

Options:
  --provider NAME          Provider block name, or a plugin's provider id (default config);
                           default: the config's default_provider, else its only block,
                           else local_docker when the config has none
  --image IMAGE            Sandbox image
  --env K=V                Environment variable of the sandbox (repeatable)
  --workdir DIR            Working directory of the command
  --timeout S              Command timeout in seconds (default: the provider's)
  --ttl S                  Sandbox lifetime in seconds
  --user USER              Run the command as USER (name or uid)
  --cpu N                  CPUs (may be fractional)
  --memory MIB             Memory limit in MiB
  --metadata K=V           Sandbox metadata (repeatable)
  --upload LOCAL:REMOTE    Copy a local file in before the command (repeatable)
  --download REMOTE:LOCAL  Copy a sandbox file out after the command (repeatable)
  --provider-options JSON  Provider-specific options (a JSON object)
  --stop-timeout S         After a stop, how long to wait for the provider (default: 10)
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Global {
  std::optional<std::string> config;
  std::vector<std::filesystem::path> plugin_dirs;
  std::string log_level = "warn";
};

// Pulls "--name value" / "--name=value" options off an argument list.
class Args {
 public:
  explicit Args(std::vector<std::string> args) : args_(std::move(args)) {}

  bool empty() const { return pos_ >= args_.size(); }
  const std::string& peek() const { return args_[pos_]; }
  std::string next() { return args_[pos_++]; }

  // If the current argument is `--name`, consumes it and its value.
  std::optional<std::string> value(std::string_view name) {
    if (empty()) return std::nullopt;
    const std::string& a = peek();
    if (a == name) {
      if (pos_ + 1 >= args_.size()) throw UsageError(std::string(name) + " needs a value");
      pos_ += 2;
      return args_[pos_ - 1];
    }
    if (a.starts_with(std::string(name) + "=")) {
      ++pos_;
      return a.substr(name.size() + 1);
    }
    return std::nullopt;
  }
  bool flag(std::string_view name) {
    if (!empty() && peek() == name) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::vector<std::string> rest() {
    std::vector<std::string> out(args_.begin() + static_cast<std::ptrdiff_t>(pos_), args_.end());
    pos_ = args_.size();
    return out;
  }

 private:
  std::vector<std::string> args_;
  size_t pos_ = 0;
};

bool global_option(Args& args, Global& g) {
  if (auto v = args.value("--config")) return g.config = *v, true;
  if (auto v = args.value("--plugin-dir")) return g.plugin_dirs.emplace_back(*v), true;
  if (auto v = args.value("--log-level")) return g.log_level = *v, true;
  return false;
}

std::pair<std::string, std::string> split_pair(const std::string& text, char sep,
                                               std::string_view what) {
  const size_t at = text.find(sep);
  if (at == std::string::npos || at == 0) {
    throw UsageError(std::string(what) + " must look like A" + sep + "B, got '" + text + "'");
  }
  return {text.substr(0, at), text.substr(at + 1)};
}

int64_t parse_integer(const std::string& text, std::string_view what) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw UsageError(std::string(what) + " must be a whole number, got '" + text + "'");
  }
  return v;
}

double parse_number(const std::string& text, std::string_view what) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    throw UsageError(std::string(what) + " must be a number, got '" + text + "'");
  }
}

// Quotes one word for a POSIX shell.
std::string shell_quote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-./=:,+@%") == std::string::npos) {
    return word;
  }
  std::string out = "'";
  for (char c : word)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

sbx::Host make_host(const Global& g) {
  sbx::Host::Options options;
  std::optional<std::string> config = g.config;
  if (!config) {
    if (const char* env = std::getenv("SBX_CONFIG"); env && *env) config = env;
  }
  if (config) options.config = sbx::Config::load(*config);
  options.plugin_dirs = g.plugin_dirs;
  return sbx::Host(std::move(options));
}

std::string version_text(const sbx_version& v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

int cmd_plugins(Args& args, Global& g) {
  bool json = false;
  while (!args.empty()) {
    if (args.flag("--json")) {
      json = true;
    } else if (args.flag("--help") || args.flag("-h")) {
      std::cout << kPluginsHelp;
      return 0;
    } else if (!global_option(args, g)) {
      throw UsageError("unknown option for plugins: " + args.peek());
    }
  }
  sbx::Host host = make_host(g);
  const auto plugins = host.plugins();
  if (json) {
    boost::json::array out;
    for (const auto& p : plugins) {
      boost::json::object o{{"path", p.path.string()}};
      if (p.ok()) {
        o["name"] = p.name;
        o["version"] = p.version;
        o["abi_version"] = version_text(p.abi_version);
        boost::json::array ids;
        for (const auto& k : p.providers) {
          boost::json::value schema(boost::json::string(k.config_schema));
          try {
            schema = boost::json::parse(k.config_schema);
          } catch (const std::exception&) {  // not JSON: shown as the plugin gave it
          }
          ids.push_back(boost::json::object{
              {"id", k.id}, {"description", k.description}, {"config_schema", schema}});
        }
        o["providers"] = std::move(ids);
      } else {
        o["error"] = p.error;
      }
      out.push_back(std::move(o));
    }
    std::cout << boost::json::serialize(out) << "\n";
    return 0;
  }
  if (plugins.empty()) {
    std::cout << "no plugins found in:";
    for (const auto& d : host.plugin_dirs())
      std::cout << " " << d.string();
    std::cout << "\n";
  }
  for (const auto& p : plugins) {
    std::cout << p.path.string() << "\n";
    if (!p.ok()) {
      std::cout << "  error: " << p.error << "\n";
      continue;
    }
    std::cout << "  plugin:    " << p.name << " " << p.version << " (ABI "
              << version_text(p.abi_version) << ")\n";
    for (const auto& k : p.providers) {
      std::cout << "  provider:  " << k.id << " - " << k.description << "\n";
    }
  }
  return 0;
}

int cmd_providers(Args& args, Global& g) {
  bool json = false;
  while (!args.empty()) {
    if (args.flag("--json")) {
      json = true;
    } else if (args.flag("--help") || args.flag("-h")) {
      std::cout << kProvidersHelp;
      return 0;
    } else if (!global_option(args, g)) {
      throw UsageError("unknown option for providers: " + args.peek());
    }
  }
  sbx::Host host = make_host(g);
  const auto providers = host.providers();
  if (json) {
    boost::json::array out;
    for (const auto& p : providers) {
      out.push_back(boost::json::object{
          {"name", p.name}, {"plugin", p.plugin}, {"configured", p.configured}});
    }
    std::cout << boost::json::serialize(out) << "\n";
    return 0;
  }
  for (const auto& p : providers) {
    std::cout << p.name << "\t" << p.plugin << "\t"
              << (p.configured ? "configured" : "default config") << "\n";
  }
  return 0;
}

// list and reap share their options and output.
int cmd_list_or_reap(Args& args, Global& g, bool reap) {
  std::optional<std::string> provider_name;
  sbx::StringMap selector;
  bool json = false, all = false;
  while (!args.empty()) {
    if (args.flag("--json")) {
      json = true;
    } else if (reap && args.flag("--all")) {
      all = true;
    } else if (args.flag("--help") || args.flag("-h")) {
      std::cout << (reap ? kReapHelp : kListHelp);
      return 0;
    } else if (auto v = args.value("--provider")) {
      provider_name = *v;
    } else if (auto v = args.value("--label")) {
      const size_t eq = v->find('=');
      if (v->empty() || eq == 0) throw UsageError("--label must look like K=V or K");
      selector[v->substr(0, eq)] = eq == std::string::npos ? "" : v->substr(eq + 1);
    } else if (!global_option(args, g)) {
      throw UsageError(std::string("unknown option for ") + (reap ? "reap: " : "list: ") +
                       args.peek());
    }
  }
  if (reap && selector.empty() && !all) {
    throw UsageError("reap needs --label K=V (or --all to remove every sandbox of the provider)");
  }
  sbx::Host host = make_host(g);
  sbx::Provider provider = provider_name ? host.provider(*provider_name) : host.default_provider();
  const auto sandboxes = reap ? provider.reap(selector) : provider.list(selector);
  if (json) {
    boost::json::array out;
    for (const auto& s : sandboxes) {
      boost::json::object labels;
      for (const auto& [k, v] : s.labels)
        labels[k] = v;
      out.push_back(boost::json::object{{"id", s.id},
                                        {"status", std::string(sbx::to_string(s.status))},
                                        {"created_unix_ms", s.created_unix_ms},
                                        {"labels", std::move(labels)}});
    }
    std::cout << boost::json::serialize(out) << "\n";
    return 0;
  }
  for (const auto& s : sandboxes) {
    const auto run = s.labels.find("sbx.run");
    std::cout << (reap ? "removed " : "") << s.id << "\t" << sbx::to_string(s.status) << "\t"
              << (run == s.labels.end() ? "-" : run->second) << "\n";
  }
  if (reap) std::cerr << "sbx: removed " << sandboxes.size() << " sandbox(es)\n";
  return 0;
}

// Writes all of `bytes` to a file descriptor (stdout/stderr of this process). Returns 0, or the
// errno of the write that failed (EPIPE when the reader has gone: SIGPIPE is ignored, see main).
int write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

// Thrown by a step when the stop timeout passed (or a second signal came) before the provider
// finished what the stop asked of it.
struct GaveUp {};

// Stops a run: SIGINT, SIGTERM or SIGHUP (exit 130), output nobody reads any more (exit 141, as a
// shell reports a pipeline member killed by SIGPIPE), or output that cannot be written (exit 74).
// Signals are blocked in every thread and taken by sigwait here, so no handler races with the
// rest of the program. The step in progress is cancelled; a step that starts after the stop is
// cancelled as soon as it registers. From the first stop on, the steps that remain (the
// cancellation, closing the sandbox) have --stop-timeout between them; a second signal ends the
// wait at once.
class Interrupts {
 public:
  explicit Interrupts(std::chrono::milliseconds stop_timeout) : stop_timeout_(stop_timeout) {
    sigemptyset(&set_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1})  // SIGUSR1 stops the watcher
      sigaddset(&set_, sig);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set_, &sig) != 0 || sig == SIGUSR1) return;
        if (stopped() != 0) {
          give_up();
        } else {
          stop(kExitInterrupted);
        }
      }
    });
  }
  ~Interrupts() {
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }
  Interrupts(const Interrupts&) = delete;
  Interrupts& operator=(const Interrupts&) = delete;

  void stop(int exit_code) {
    {
      std::lock_guard lock(mutex_);
      if (exit_code_ == 0) {
        exit_code_ = exit_code;
        give_up_at_ = std::chrono::steady_clock::now() + stop_timeout_;
      }
    }
    std::function<void()> cancel;
    {
      std::lock_guard lock(mutex_);
      cancel = cancel_;
    }
    if (cancel) cancel();
  }
  void give_up() {
    std::lock_guard lock(mutex_);
    given_up_ = true;
  }
  // The exit code of the stop, or 0 while running.
  int stopped() const {
    std::lock_guard lock(mutex_);
    return exit_code_;
  }

  // Runs one step of the session; a stop cancels it (and one that came before cancels it at
  // once). Throws GaveUp when the stop timeout passes first.
  template <class T>
  T step(sbx::Operation<T> op) {
    {
      std::lock_guard lock(mutex_);
      cancel_ = [op] { op.cancel(); };
    }
    if (stopped()) op.cancel();
    struct Clear {
      Interrupts& self;
      ~Clear() {
        std::lock_guard lock(self.mutex_);
        self.cancel_ = nullptr;
      }
    } clear{*this};
    return wait(std::move(op));
  }

  // Waits for a step that a stop must not cancel (closing the sandbox), within the stop timeout
  // once there was a stop. Throws GaveUp when that passes first.
  template <class T>
  T wait(sbx::Operation<T> op) {
    // The operation's own wait wakes at its completion; the slices bound how late a give-up is
    // noticed. (No continuation on the operation: it could run after this object is gone.)
    while (!op.wait_for(std::chrono::milliseconds(50))) {
      std::lock_guard lock(mutex_);
      if (given_up_ || (give_up_at_ && std::chrono::steady_clock::now() >= *give_up_at_)) {
        throw GaveUp{};
      }
    }
    return op.get();
  }

 private:
  std::chrono::milliseconds stop_timeout_;
  sigset_t set_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::function<void()> cancel_;
  int exit_code_ = 0;
  bool given_up_ = false;
  std::optional<std::chrono::steady_clock::time_point> give_up_at_;
};

constexpr int kExitBrokenPipe = 128 + SIGPIPE;

// Leaves at once, without waiting for the provider any more: its threads may still be working
// on what was abandoned, so no destructor runs. Says what may be left and how to remove it.
[[noreturn]] void leave_now(int exit_code, const sbx::Host& host, const std::string& provider,
                            const std::string& sandbox_id) {
  const auto run = host.labels().find("sbx.run");
  std::cerr << "sbx: stopped waiting for provider '" << provider << "'; "
            << (sandbox_id.empty() ? std::string("a sandbox it was creating")
                                   : "sandbox " + sandbox_id)
            << " may still exist. Remove it with: sbx reap --provider " << provider
            << " --label sbx.run=" << (run == host.labels().end() ? "?" : run->second) << "\n";
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

// Reads a return code a shell can carry; anything else (a provider's bug) is 125 with a message.
int exit_status_of(int32_t return_code) {
  if (return_code >= 0 && return_code <= 255) return return_code;
  std::cerr << "sbx: the provider reported return code " << return_code
            << ", which no exit status can carry\n";
  return kExitFailure;
}

int cmd_run(Args& args, Global& g) {
  std::optional<std::string> provider_name;
  sbx::SandboxSpec spec;
  sbx::ExecOptions exec;
  std::vector<std::pair<std::string, std::string>> uploads, downloads;
  std::vector<std::string> command;
  double stop_timeout_s = kDefaultStopTimeout;
  while (!args.empty()) {
    if (args.flag("--")) {
      command = args.rest();
    } else if (args.flag("--help") || args.flag("-h")) {
      std::cout << kRunHelp;
      return 0;
    } else if (auto v = args.value("--provider")) {
      provider_name = *v;
    } else if (auto v = args.value("--image")) {
      spec.image = *v;
    } else if (auto v = args.value("--env")) {
      auto [k, val] = split_pair(*v, '=', "--env");
      spec.env[k] = val;
    } else if (auto v = args.value("--metadata")) {
      auto [k, val] = split_pair(*v, '=', "--metadata");
      spec.metadata[k] = val;
    } else if (auto v = args.value("--workdir")) {
      spec.workdir = *v;
    } else if (auto v = args.value("--timeout")) {
      exec.timeout_s = parse_number(*v, "--timeout");
    } else if (auto v = args.value("--ttl")) {
      spec.ttl_s = parse_number(*v, "--ttl");
    } else if (auto v = args.value("--user")) {
      exec.user = *v;
    } else if (auto v = args.value("--cpu")) {
      spec.resources.cpu = parse_number(*v, "--cpu");
    } else if (auto v = args.value("--memory")) {
      spec.resources.memory_mib = parse_integer(*v, "--memory");
    } else if (auto v = args.value("--upload")) {
      uploads.push_back(split_pair(*v, ':', "--upload"));
    } else if (auto v = args.value("--download")) {
      downloads.push_back(split_pair(*v, ':', "--download"));
    } else if (auto v = args.value("--provider-options")) {
      try {  // the config files' rules: duplicate keys are an error
        spec.provider_options = sbx::sdk::json::parse_object(*v, "--provider-options");
      } catch (const std::exception& e) {
        throw UsageError(std::string(e.what()) + " (--provider-options must be a JSON object)");
      }
    } else if (auto v = args.value("--stop-timeout")) {
      stop_timeout_s = parse_number(*v, "--stop-timeout");
      if (!(stop_timeout_s > 0)) throw UsageError("--stop-timeout must be > 0");
    } else if (!global_option(args, g)) {
      throw UsageError("unknown option for run: " + args.peek() + " (put the command after --)");
    }
  }
  if (command.empty()) throw UsageError("run needs a command after --");
  std::string shell_command = command.size() == 1 ? command[0] : "";
  if (command.size() > 1) {
    for (const auto& word : command) {
      shell_command += (shell_command.empty() ? "" : " ") + shell_quote(word);
    }
  }
  // Everything that can be checked here is, before a sandbox exists.
  try {
    spec.validate();
    exec.validate();
  } catch (const sbx::InvalidArgumentError& e) {
    throw UsageError(e.what());
  }
  for (const auto& [local, remote] : uploads) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(local, ec) || ::access(local.c_str(), R_OK) != 0) {
      throw UsageError("--upload: " + local + " is not a readable file");
    }
  }

  Interrupts interrupts(sbx::Deadlines::ms(stop_timeout_s));
  sbx::Host host = make_host(g);
  sbx::Provider provider = provider_name ? host.provider(*provider_name) : host.default_provider();

  sbx::Sandbox sandbox;  // closed by RAII on every way out, also a sandbox created despite a stop
  int exit_code = 0;
  try {
    try {
      sandbox = interrupts.step(provider.create_async(spec));
      if (interrupts.stopped()) {
        interrupts.wait(sandbox.close_async());
        return interrupts.stopped();
      }

      for (const auto& [local, remote] : uploads)
        interrupts.step(sandbox.upload_async(local, remote));

      int output_errno = 0;  // set once, by the output callback (one call at a time)
      exec.on_output = [&](sbx::OutputStream stream, std::string_view bytes) {
        if (output_errno != 0) return;
        output_errno =
            write_all(stream == sbx::OutputStream::err ? STDERR_FILENO : STDOUT_FILENO, bytes);
        if (output_errno == EPIPE) {
          interrupts.stop(kExitBrokenPipe);  // nobody reads the output: stop the command
        } else if (output_errno != 0) {
          std::cerr << "sbx: writing the command's "
                    << (stream == sbx::OutputStream::err ? "stderr" : "stdout")
                    << " failed: " << std::strerror(output_errno) << "; stopping the command\n";
          interrupts.stop(kExitLocalIo);
        }
      };
      const sbx::ExecResult result = interrupts.step(sandbox.exec_async(shell_command, exec));
      exit_code = exit_status_of(result.return_code);
      if (result.error_type) {
        std::cerr << "sbx: "
                  << (result.timed_out() ? "the command timed out"
                                         : "the sandbox could not run the command")
                  << " (error_type=" << *result.error_type << ")\n";
      }
      if (interrupts.stopped()) {
        interrupts.wait(sandbox.close_async());
        return interrupts.stopped();
      }

      for (const auto& [remote, local] : downloads) {
        try {
          interrupts.step(sandbox.download_async(remote, local));
        } catch (const sbx::CancelledError&) {
          throw;
        } catch (const sbx::Error& e) {
          std::cerr << "sbx: download of " << remote << " failed: " << e.what() << "\n";
          if (exit_code == 0) exit_code = e.local_errno() != 0 ? kExitLocalIo : kExitFailure;
        }
      }
      interrupts.wait(sandbox.close_async());
      return exit_code;
    } catch (const sbx::CancelledError&) {
      if (!interrupts.stopped()) throw;
      if (interrupts.stopped() == kExitInterrupted) {
        std::cerr << "sbx: interrupted; closing the sandbox\n";
      }
      if (sandbox.valid()) interrupts.wait(sandbox.close_async());
      return interrupts.stopped();
    }
  } catch (const GaveUp&) {
    leave_now(interrupts.stopped(), host, provider.name(), sandbox.valid() ? sandbox.id() : "");
  }
}

void setup_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("sbx");
  spdlog::set_default_logger(logger);
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    throw UsageError("unknown log level '" + level + "'");
  }
  spdlog::set_level(parsed);
}

int run(std::vector<std::string> argv) {
  Args args(std::move(argv));
  Global g;
  while (!args.empty() && args.peek().starts_with("-")) {
    if (args.flag("--help") || args.flag("-h")) {
      std::cout << kMainHelp;
      return 0;
    }
    if (args.flag("--version")) {
      std::cout << "sbx " << SBX_VERSION << " (provider ABI " << SBX_ABI_VERSION_MAJOR << "."
                << SBX_ABI_VERSION_MINOR << ")\n";
      return 0;
    }
    if (!global_option(args, g)) throw UsageError("unknown option: " + args.peek());
  }
  if (args.empty()) {
    std::cerr << kMainHelp;
    return kExitUsage;
  }
  const std::string command = args.next();
  // Global options may also follow the subcommand; each command accepts them.
  std::vector<std::string> rest = args.rest();
  for (size_t i = 0; i < rest.size() && rest[i] != "--"; ++i) {
    if (rest[i] == "--log-level" && i + 1 < rest.size()) g.log_level = rest[i + 1];
    if (rest[i].starts_with("--log-level=")) g.log_level = rest[i].substr(12);
  }
  setup_logging(g.log_level);
  Args sub(rest);
  if (command == "plugins") return cmd_plugins(sub, g);
  if (command == "providers") return cmd_providers(sub, g);
  if (command == "run") return cmd_run(sub, g);
  if (command == "list") return cmd_list_or_reap(sub, g, false);
  if (command == "reap") return cmd_list_or_reap(sub, g, true);
  throw UsageError("unknown command '" + command + "' (try sbx --help)");
}

}  // namespace

int main(int argc, char** argv) {
  // A closed stdout is an EPIPE from write(), handled where output is written (sbx run stops the
  // command and closes the sandbox); the default SIGPIPE would kill sbx with the sandbox alive.
  ::signal(SIGPIPE, SIG_IGN);
  try {
    const int code = run(std::vector<std::string>(argv + 1, argv + argc));
    // What the subcommands printed with std::cout (lists, JSON) must have reached stdout.
    errno = 0;
    if (!std::cout.flush() || std::fflush(stdout) != 0) {
      const int err = errno;
      std::cerr << "sbx: writing to stdout failed"
                << (err != 0 ? std::string(": ") + std::strerror(err) : std::string()) << "\n";
      return code == 0 ? kExitLocalIo : code;
    }
    return code;
  } catch (const UsageError& e) {
    std::cerr << "sbx: " << e.what() << "\n";
    return kExitUsage;
  } catch (const sbx::ConfigError& e) {  // a config file or a provider's config it refused
    std::cerr << "sbx: error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const sbx::Error& e) {
    std::cerr << "sbx: error: " << e.what() << "\n";
    return e.local_errno() != 0 ? kExitLocalIo : kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << "sbx: error: " << e.what() << "\n";
    return kExitFailure;
  }
}
