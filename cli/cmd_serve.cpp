// sbx serve: an OpenSandbox-compatible server over one provider (serve, docs/serve.md).
// SIGINT/SIGTERM stop it gracefully: no new connection, running commands given --grace to finish,
// the sandboxes it created closed within --grace, exit 0. SIGHUP (or POST /admin/reload, or
// `sbx reload`) reloads the config and replaced plugin files (docs/hot-swap.md).

#include "commands.hpp"
#include "shared.hpp"
#include "stop.hpp"

#include <faults.hpp>
#include <server.hpp>
#include <settings.hpp>

#include <sbx/base/time.hpp>
#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace sbx::cli {

namespace {

// Flags left unset keep the config file's `serve` value, else the default (the flag wins).
struct ServeFields {
  ProviderChoice provider;
  std::optional<std::string> listen;
  std::optional<std::string> api_key_env;
  std::optional<double> grace_s;         // default 10
  std::optional<double> read_timeout_s;  // default 30
  std::optional<int64_t> threads;        // default 2
  std::optional<int64_t> max_sandboxes;  // default: the config file's, else no cap
  std::optional<std::string> state_dir;
  bool keep_on_stop = false;
  std::optional<int64_t> max_streams;  // default: the config file's, else no cap
  bool watch = false;
  bool move_sandboxes = false;
  // Per sandbox and per transfer (docs/serve.md "Limits"); unset: the server's defaults.
  std::optional<int64_t> max_commands;
  std::optional<int64_t> max_queued_commands;
  std::optional<int64_t> kept_commands;
  std::optional<int64_t> command_log_limit;
  std::optional<int64_t> stream_buffer;
  std::optional<int64_t> temp_limit;
  std::optional<unsigned> socket_mode;  // with --listen unix:PATH; default 0600
};

// A whole-number flag within [min, max].
std::optional<int64_t> bounded(const Arg& a, const char* name, int64_t min, int64_t max) {
  const int64_t v = a.whole_number();
  if (v < min || v > max) {
    throw UsageError(std::string(name) + " must be between " + std::to_string(min) + " and " +
                     std::to_string(max) + ", got " + std::to_string(v));
  }
  return v;
}

// What --watch watches: the config file, the plugin directories, and the plugin files the config
// in force names.
std::vector<std::filesystem::path> watched_paths(sbx::Host& host,
                                                 const std::optional<std::string>& config) {
  std::vector<std::filesystem::path> out;
  if (config) out.push_back(std::filesystem::absolute(*config));
  for (const auto& dir : host.plugin_dirs())
    out.push_back(dir);
  for (const auto& [name, block] : host.config().providers) {
    if (auto file = block.plugin_file()) out.push_back(std::filesystem::absolute(*file));
  }
  return out;
}

// The longest --grace or --read-timeout, as the config file's serve.grace_s and read_timeout_s.
constexpr double kMaxServeSeconds = 86400;

// A duration flag in seconds: a number from 0 (exclusive when `positive`) to kMaxServeSeconds,
// refused otherwise (NaN, infinity and 1e300 included) with the flag's name.
double seconds_flag(const Arg& a, const char* flag, bool positive) {
  const double s = a.number();
  const bool low_ok = positive ? s > 0 : s >= 0;
  if (!low_ok || !(s <= kMaxServeSeconds) || !sbx::base::seconds_to_ms_checked(s)) {
    throw UsageError(std::string(flag) + " must be " + (positive ? "> 0" : ">= 0") +
                     " and at most 86400 seconds, got '" + a.text + "'");
  }
  return s;
}

// "HOST:PORT" or "[V6]:PORT".
std::pair<std::string, uint16_t> split_listen(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw UsageError("--listen must look like HOST:PORT, got '" + text + "'");
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = text.substr(colon + 1);
  int64_t port = -1;
  try {
    std::size_t used = 0;
    port = std::stoll(port_text, &used);
    if (used != port_text.size()) port = -1;
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535) {
    throw UsageError("--listen needs a port between 0 and 65535, got '" + port_text + "'");
  }
  return {host, static_cast<uint16_t>(port)};
}

// What --listen names: HOST:PORT, or unix:PATH (a unix socket).
struct Listen {
  std::string host;
  uint16_t port = 0;
  std::optional<std::string> unix_path;
};

Listen parse_listen(const std::string& text) {
  if (text.rfind("unix:", 0) == 0) {
    const std::string path = text.substr(5);
    if (path.empty()) throw UsageError("--listen unix:PATH needs a path, got '" + text + "'");
    return Listen{"", 0, path};
  }
  auto [host, port] = split_listen(text);
  return Listen{std::move(host), port, std::nullopt};
}

// An octal file mode such as 0600 or 660, at most 0777.
unsigned parse_socket_mode(const std::string& text) {
  bool ok = !text.empty() && text.size() <= 4;
  unsigned mode = 0;
  for (const char c : text) {
    ok = ok && c >= '0' && c <= '7';
    mode = mode * 8 + static_cast<unsigned>(c - '0');
  }
  if (!ok || mode > 0777) {
    throw UsageError("--socket-mode must be an octal mode from 0 to 0777, got '" + text + "'");
  }
  return mode;
}

// The config file's `serve` section onto `options` (the flags are applied after it).
void apply_settings(const sbx::serve::Settings& s, sbx::serve::Options& options) {
  // read_settings bounds these (docs/config.md); the conversion is checked all the same.
  auto ms = [](double seconds) { return sbx::base::seconds_to_ms(seconds); };
  if (s.max_sandboxes) options.max_sandboxes = *s.max_sandboxes;
  if (s.max_streams) options.max_streams = *s.max_streams;
  if (s.header_limit) options.header_limit = *s.header_limit;
  if (s.body_limit) options.body_limit = *s.body_limit;
  if (s.read_timeout_s) options.read_timeout = ms(*s.read_timeout_s);
  if (s.grace_s) options.grace = ms(*s.grace_s);
  if (s.threads) options.threads = *s.threads;
  if (s.keepalive_ping_s) options.keepalive_ping = ms(*s.keepalive_ping_s);
  if (s.max_commands) options.max_commands = *s.max_commands;
  if (s.max_queued_commands) options.max_queued_commands = *s.max_queued_commands;
  if (s.kept_commands) options.kept_commands = *s.kept_commands;
  if (s.command_log_limit) options.command_log_limit = *s.command_log_limit;
  if (s.stream_buffer) options.stream_buffer = *s.stream_buffer;
  if (s.temp_limit) options.temp_limit = *s.temp_limit;
  if (s.faults) {
    auto faults = sbx::serve::Faults::parse(*s.faults, s.faults_path);  // ConfigError: exit 2
    if (!faults->empty()) options.faults = std::move(faults);
  }
}

// The flags that name a setting of the config's serve section onto `options`, over the file's.
// Their values were range-checked when read (serve_command): the conversions cannot fail.
void apply_flags(const ServeFields& f, sbx::serve::Options& options) {
  if (f.grace_s) options.grace = sbx::base::seconds_to_ms(*f.grace_s);
  if (f.threads) options.threads = static_cast<int>(*f.threads);
  if (f.read_timeout_s) options.read_timeout = sbx::base::seconds_to_ms(*f.read_timeout_s);
  if (f.max_sandboxes) options.max_sandboxes = static_cast<std::size_t>(*f.max_sandboxes);
  if (f.max_streams) options.max_streams = static_cast<std::size_t>(*f.max_streams);
  if (f.max_commands) options.max_commands = static_cast<std::size_t>(*f.max_commands);
  if (f.max_queued_commands) {
    options.max_queued_commands = static_cast<std::size_t>(*f.max_queued_commands);
  }
  if (f.kept_commands) options.kept_commands = static_cast<std::size_t>(*f.kept_commands);
  if (f.command_log_limit) {
    options.command_log_limit = static_cast<std::uint64_t>(*f.command_log_limit);
  }
  if (f.stream_buffer) options.stream_buffer = static_cast<std::size_t>(*f.stream_buffer);
  if (f.temp_limit) options.temp_limit = static_cast<std::uint64_t>(*f.temp_limit);
}

// A reload's serve section (docs/serve.md, "Reload"). `next` is the section the reloaded config
// brings (none: every setting at its default), `in_force` the one the server runs with. The
// section is read as a start reads it; a setting only a start applies (the listener, the
// threads, the request bounds, the temp space, the faults plan) that would change refuses the
// reload as a whole; a flag given to sbx serve keeps winning over the file. Returns the limits a
// running server takes (Options::Limits). Throws sbx::ReloadError.
sbx::serve::Options::Limits check_serve_reload(const std::optional<boost::json::object>& next,
                                               const std::string& source,
                                               const sbx::serve::Settings& in_force,
                                               sbx::serve::Settings& next_settings,
                                               const ServeFields& f) {
  const std::string refused = "reload refused, nothing changed: ";
  sbx::serve::Options before, after;
  try {
    next_settings = next ? sbx::serve::read_settings(*next, source) : sbx::serve::Settings{};
    apply_settings(in_force, before);
    apply_settings(next_settings, after);  // parses the faults plan: its errors refuse too
  } catch (const sbx::ConfigError& e) {
    throw sbx::ReloadError(refused + e.what());
  }
  apply_flags(f, before);
  apply_flags(f, after);
  auto changed = [&](const char* key, auto was, auto is) {
    if (was == is) return;
    std::ostringstream why;
    why << refused << source << ": $.serve." << key << " changed (" << was << " to " << is
        << "), and sbx serve applies it only when it starts; restart it to apply";
    throw sbx::ReloadError(why.str());
  };
  if (!f.listen) {
    changed("listen", in_force.listen.value_or("(none)"), next_settings.listen.value_or("(none)"));
  }
  changed("threads", before.threads, after.threads);
  changed("header_limit", before.header_limit, after.header_limit);
  changed("body_limit", before.body_limit, after.body_limit);
  changed("read_timeout_s", before.read_timeout.count() / 1000.0,
          after.read_timeout.count() / 1000.0);
  changed("grace_s", before.grace.count() / 1000.0, after.grace.count() / 1000.0);
  changed("keepalive_ping_s", before.keepalive_ping.count() / 1000.0,
          after.keepalive_ping.count() / 1000.0);
  changed("temp_limit", before.temp_limit, after.temp_limit);
  const auto plan = [](const sbx::serve::Settings& s) {
    return s.faults ? boost::json::serialize(*s.faults) : std::string("(none)");
  };
  changed("faults", plan(in_force), plan(next_settings));
  return after.limits();
}

int serve(ServeFields& f, const Global& g) {
  sbx::Host::Options host_options;
  std::optional<std::string> config = g.config;
  if (!config) {
    if (const char* env = std::getenv("SBX_CONFIG"); env && *env) config = env;
  }
  if (config) host_options.config = sbx::Config::load(*config);
  std::optional<sbx::serve::Settings> settings;
  if (host_options.config.serve) {
    settings = sbx::serve::read_settings(*host_options.config.serve, host_options.config.source);
  }

  sbx::serve::Options options;
  if (settings) apply_settings(*settings, options);
  const std::optional<std::string> listen = f.listen   ? f.listen
                                            : settings ? settings->listen
                                                       : std::nullopt;
  if (!listen) {
    throw UsageError(
        "serve needs --listen HOST:PORT (or \"listen\" in the config's serve section)");
  }
  const Listen where = parse_listen(*listen);
  options.host = where.host;
  options.port = where.port;
  if (where.unix_path) options.unix_socket = *where.unix_path;
  if (f.socket_mode) {
    if (!where.unix_path) throw UsageError("--socket-mode needs --listen unix:PATH");
    options.socket_mode = *f.socket_mode;
  }
  if (f.api_key_env) {
    const char* key = std::getenv(f.api_key_env->c_str());
    if (!key || !*key) {
      throw UsageError("--api-key-env: the environment variable " + *f.api_key_env +
                       " is not set or empty");
    }
    options.api_key = key;
  }
  if (!options.unix_socket && !options.api_key && !sbx::serve::is_loopback(options.host)) {
    throw UsageError("refusing to listen on " + options.host +
                     " without an API key (give --api-key-env VAR, or listen on 127.0.0.1)");
  }
  apply_flags(f, options);
  options.handle_signals = true;
  if (f.state_dir) options.state_dir = *f.state_dir;
  options.keep_on_stop = f.keep_on_stop;

  host_options.plugin_dirs = g.plugin_dirs;
  host_options.labels["sbx.serve"] =
      "true";  // every sandbox it creates: `sbx reap --label sbx.serve`
  sbx::Host host(std::move(host_options));
  sbx::Provider provider = f.provider.pick(host);

  // Hot swap (docs/hot-swap.md): new sandboxes come from the host's current generation of the
  // served block; a reload re-reads the config file (or, without one, the config in force) and
  // checks replaced plugin files.
  const std::string served = provider.name();
  std::optional<sbx::serve::Server> made;
  // The serve section in force (its limits may change at a reload; on the admin thread only).
  sbx::serve::Settings serve_in_force = settings.value_or(sbx::serve::Settings{});
  options.admin = sbx::serve::Options::Admin{
      .provider = [&host, served] { return host.provider(served); },
      .reload =
          [&host, &made, &serve_in_force, &f, config, served] {
            sbx::Config next = config ? sbx::Config::load(*config) : host.config();
            if (host.config().providers.count(served) && !next.providers.count(served)) {
              throw sbx::ReloadError("reload refused, nothing changed: provider '" + served +
                                     "' is the one this server serves; it cannot be removed");
            }
            sbx::serve::Settings next_serve;
            const auto limits =
                check_serve_reload(next.serve, next.source, serve_in_force, next_serve, f);
            sbx::ReloadReport report = host.reload(std::move(next));
            if (made) made->set_limits(limits);
            serve_in_force = std::move(next_serve);
            return report;
          },
      .stop_reloads = [&host] { host.stop_reloads(); },
      .generations = [&host] { return host.generations(); },
      .move = [&host](sbx::Sandbox& sandbox) { return host.move_to_current(sandbox); },
      .move_sandboxes = f.move_sandboxes,
      .watched = f.watch ? std::function([&host, config] { return watched_paths(host, config); })
                         : nullptr,
  };

  try {
    // The server keeps no Provider of its own once started (with Options::admin it asks the host
    // for the current generation), so that a replaced generation can drain and unload.
    made.emplace(std::exchange(provider, sbx::Provider()), options);
  } catch (const std::invalid_argument& e) {  // options that cannot work together
    throw UsageError(e.what());
  }
  sbx::serve::Server& server = *made;
  const std::string run_id = host.labels().at("sbx.run");
  const std::string address = options.unix_socket ? "unix:" + options.unix_socket->string()
                                                  : "http://" +
                                                        (options.host.find(':') != std::string::npos
                                                             ? "[" + options.host + "]"
                                                             : options.host) +
                                                        ":" + std::to_string(server.port());
  std::cout << "sbx serve: listening on " << address << " (provider " << served
            << ", sbx.run=" << run_id << ")" << std::endl;
  spdlog::info("sbx serve: listening on {}", address);
  if (!server.run()) {
    leave_now(kExitFailure, served,
              "sandboxes of sbx.run=" + run_id + " may still exist: sbx reap --provider " + served +
                  " --label sbx.run=" + run_id);
  }
  made.reset();  // the temp dir and the socket file go, the admin thread is joined
  std::cout << "sbx serve: stopped" << std::endl;
  if (const size_t stuck = host.abandoned_reload_steps(); stuck > 0) {
    // A reload abandoned by the stop still runs in plugin code on a thread of its own, and may
    // use the loggers and its library at any moment: a normal exit would run static destructors
    // (spdlog's registry, the host's generations) under it. Leave now, as leave_now does.
    spdlog::warn("sbx serve: {} reload step(s) still in plugin code; exiting without unloading",
                 stuck);
    spdlog::default_logger()->flush();
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    std::_Exit(0);
  }
  return 0;
}

}  // namespace

Command serve_command() {
  std::vector<Option<ServeFields>> options = options_of(&ServeFields::provider, provider_options());
  options.push_back(
      value<ServeFields>("--listen", "HOST:PORT",
                         "Address to listen on, e.g. 127.0.0.1:8080; port 0: any free port,\n"
                         "printed at start. Anything but loopback needs --api-key-env.\n"
                         "unix:PATH listens on a unix socket made with --socket-mode\n"
                         "(only its owner may connect by default). Else serve.listen",
                         [](ServeFields& f, const Arg& a) { f.listen = a.text; }));
  options.push_back(value<ServeFields>(
      "--socket-mode", "MODE",
      "With --listen unix:PATH, the socket file's mode in octal (default 0600:\n"
      "its owner only; 0660 lets its group in)",
      [](ServeFields& f, const Arg& a) { f.socket_mode = parse_socket_mode(a.text); }));
  options.push_back(
      value<ServeFields>("--api-key-env", "VAR",
                         "Require the API key held by environment variable VAR\n"
                         "in the OPEN-SANDBOX-API-KEY header",
                         [](ServeFields& f, const Arg& a) { f.api_key_env = a.text; }));
  options.push_back(value<ServeFields>(
      "--grace", "S",
      "On SIGINT/SIGTERM, wait up to S seconds for running commands,\n"
      "then as long for the sandboxes to close\n"
      "(default: serve.grace_s, else 10)",
      [](ServeFields& f, const Arg& a) { f.grace_s = seconds_flag(a, "--grace", false); }));
  options.push_back(
      value<ServeFields>("--read-timeout", "S",
                         "Close a connection whose next request has not fully arrived\n"
                         "within S seconds (default: serve.read_timeout_s, else 30)",
                         [](ServeFields& f, const Arg& a) {
                           f.read_timeout_s = seconds_flag(a, "--read-timeout", true);
                         }));
  options.push_back(value<ServeFields>("--threads", "N",
                                       "Server threads (default: serve.threads, else 2)",
                                       [](ServeFields& f, const Arg& a) {
                                         f.threads = a.whole_number();
                                         if (*f.threads < 1 || *f.threads > 64) {
                                           throw UsageError("--threads must be between 1 and 64");
                                         }
                                       }));
  options.push_back(
      value<ServeFields>("--max-sandboxes", "N",
                         "Hold at most N sandboxes at once; a create beyond answers 429\n"
                         "SANDBOX::TOO_MANY_SANDBOXES (default 0: no cap)",
                         [](ServeFields& f, const Arg& a) {
                           f.max_sandboxes = a.whole_number();
                           if (*f.max_sandboxes < 0)
                             throw UsageError("--max-sandboxes must be >= 0");
                         }));
  options.push_back(
      value<ServeFields>("--state-dir", "DIR",
                         "Keep one descriptor per sandbox in DIR, so that a restarted server\n"
                         "serves the sandboxes of the one before (needs sbx.connect/1)",
                         [](ServeFields& f, const Arg& a) { f.state_dir = a.text; }));
  options.push_back(
      flag<ServeFields>("--keep-on-stop",
                        "On SIGINT/SIGTERM leave the sandboxes running for the next server\n"
                        "instead of closing them (needs --state-dir)",
                        &ServeFields::keep_on_stop));
  options.push_back(
      value<ServeFields>("--max-streams", "N",
                         "At most N command event streams open at once; more are refused\n"
                         "with 503 (default: serve.max_streams, else 0: no cap)",
                         [](ServeFields& f, const Arg& a) {
                           f.max_streams = a.whole_number();
                           if (*f.max_streams < 0 || *f.max_streams > 1000000) {
                             throw UsageError("--max-streams must be between 0 and 1000000");
                           }
                         }));
  constexpr int64_t kTiB = int64_t{1} << 40;
  options.push_back(value<ServeFields>(
      "--max-commands", "N",
      "Per sandbox: at most N commands started at the provider at once (default 8;\n"
      "keep it below the provider's exec concurrency, local_docker's 32)",
      [](ServeFields& f, const Arg& a) {
        f.max_commands = bounded(a, "--max-commands", 1, 100000);
      }));
  options.push_back(value<ServeFields>(
      "--max-queued-commands", "N",
      "Per sandbox: at most N more commands waiting for a slot (default 24); beyond,\n"
      "POST /command answers 429 TOO_MANY_COMMANDS",
      [](ServeFields& f, const Arg& a) {
        f.max_queued_commands = bounded(a, "--max-queued-commands", 0, 1000000);
      }));
  options.push_back(value<ServeFields>(
      "--kept-commands", "N",
      "Per sandbox: the records (status, logs) of the last N finished commands are kept\n"
      "(default 50)",
      [](ServeFields& f, const Arg& a) {
        f.kept_commands = bounded(a, "--kept-commands", 0, 1000000);
      }));
  options.push_back(value<ServeFields>(
      "--command-log-limit", "BYTES",
      "Bytes of a background command's log; the rest of its output is dropped, with a\n"
      "marker line (default 8 MiB; 0: no cap)",
      [](ServeFields& f, const Arg& a) {
        f.command_log_limit = bounded(a, "--command-log-limit", 0, kTiB);
      }));
  options.push_back(value<ServeFields>(
      "--stream-buffer", "BYTES",
      "Bytes waiting for a stream's client; an event stream over it is cut (default 4 MiB)",
      [](ServeFields& f, const Arg& a) {
        f.stream_buffer = bounded(a, "--stream-buffer", 4096, 4 * (int64_t{1} << 30));
      }));
  options.push_back(value<ServeFields>(
      "--temp-limit", "BYTES",
      "Bytes of transfers staged in the server's temp dir at once; over it, 507\n"
      "INSUFFICIENT_STORAGE (default 4 GiB; 0: no cap)",
      [](ServeFields& f, const Arg& a) {
        f.temp_limit = bounded(a, "--temp-limit", 0, 1024 * kTiB);
      }));
  options.push_back(
      flag<ServeFields>("--watch",
                        "Reload when the config file, a plugin file it names or a .so in a\n"
                        "plugin directory changes (as SIGHUP; docs/hot-swap.md)",
                        &ServeFields::watch));
  options.push_back(flag<ServeFields>(
      "--move-sandboxes",
      "A reload moves the sandboxes held on a replaced generation to the new one\n"
      "(sbx.connect/1) instead of letting them drain; POST /admin/reload may say otherwise",
      &ServeFields::move_sandboxes));
  return make_command<ServeFields>({
      .name = "serve",
      .summary = "Serve the OpenSandbox lifecycle API over a provider",
      .usage = "--provider NAME [--listen HOST:PORT|unix:PATH] [--api-key-env VAR] [--grace S]",
      .description =
          "Runs an OpenSandbox-compatible server in front of one provider (docs/serve.md).\n"
          "It serves GET /health and the lifecycle API (create, get, list, delete, pause,\n"
          "resume, renew-expiration, endpoints), also under /v1, and execd (commands, files)\n"
          "at /sandboxes/{id}/proxy/44772/... on the gateway. Sandboxes it creates carry\n"
          "the label sbx.serve=true. SIGINT or SIGTERM stops it: running commands get --grace\n"
          "to finish, then it closes the sandboxes it holds (within --grace; with --keep-on-stop "
          "it leaves them for the next server\n"
          "started with the same --state-dir) and exits 0. Limits and fault injection come\n"
          "from the config file's \"serve\" section (docs/config.md); a flag wins over it.\n",
      .options = std::move(options),
      .check =
          [](ServeFields& f) {
            if (f.keep_on_stop && !f.state_dir) {
              throw UsageError(
                  "--keep-on-stop needs --state-dir (the next server finds the "
                  "sandboxes there)");
            }
            if (f.listen) parse_listen(*f.listen);  // else the config's serve.listen
          },
      .handler = serve,
  });
}

}  // namespace sbx::cli
