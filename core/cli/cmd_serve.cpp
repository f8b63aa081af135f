// sbx serve: an OpenSandbox-compatible server over one provider (core/serve, docs/serve.md).
// SIGINT/SIGTERM stop it gracefully: no new connection, running commands given --grace to finish,
// the sandboxes it created closed within --grace, exit 0.

#include "commands.hpp"
#include "shared.hpp"
#include "stop.hpp"

#include <server.hpp>

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <iostream>

namespace sbx::cli {

namespace {

struct ServeFields {
  ProviderChoice provider;
  std::string listen;
  std::optional<std::string> api_key_env;
  double grace_s = 10;
  double read_timeout_s = 30;
  int64_t threads = 2;
  std::optional<int64_t> max_streams;  // default: Options' (no cap)
};

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

int serve(ServeFields& f, const Global& g) {
  sbx::serve::Options options;
  std::tie(options.host, options.port) = split_listen(f.listen);
  if (f.api_key_env) {
    const char* key = std::getenv(f.api_key_env->c_str());
    if (!key || !*key) {
      throw UsageError("--api-key-env: the environment variable " + *f.api_key_env +
                       " is not set or empty");
    }
    options.api_key = key;
  }
  if (!options.api_key && !sbx::serve::is_loopback(options.host)) {
    throw UsageError("refusing to listen on " + options.host +
                     " without an API key (give --api-key-env VAR, or listen on 127.0.0.1)");
  }
  options.grace = std::chrono::milliseconds(static_cast<int64_t>(f.grace_s * 1000));
  options.threads = static_cast<int>(f.threads);
  options.read_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.read_timeout_s * 1000));
  options.handle_signals = true;
  if (f.max_streams) options.max_streams = static_cast<std::size_t>(*f.max_streams);

  sbx::Host::Options host_options;
  std::optional<std::string> config = g.config;
  if (!config) {
    if (const char* env = std::getenv("SBX_CONFIG"); env && *env) config = env;
  }
  if (config) host_options.config = sbx::Config::load(*config);
  host_options.plugin_dirs = g.plugin_dirs;
  host_options.labels["sbx.serve"] =
      "true";  // every sandbox it creates: `sbx reap --label sbx.serve`
  sbx::Host host(std::move(host_options));
  sbx::Provider provider = f.provider.pick(host);

  sbx::serve::Server server(provider, options);
  const std::string run_id = host.labels().at("sbx.run");
  std::cout << "sbx serve: listening on http://"
            << (options.host.find(':') != std::string::npos ? "[" + options.host + "]"
                                                            : options.host)
            << ":" << server.port() << " (provider " << provider.name() << ", sbx.run=" << run_id
            << ")" << std::endl;
  spdlog::info("sbx serve: listening on {}:{}", options.host, server.port());
  if (!server.run()) {
    leave_now(kExitFailure, provider.name(),
              "sandboxes of sbx.run=" + run_id + " may still exist: sbx reap --provider " +
                  provider.name() + " --label sbx.run=" + run_id);
  }
  std::cout << "sbx serve: stopped" << std::endl;
  return 0;
}

}  // namespace

Command serve_command() {
  std::vector<Option<ServeFields>> options = options_of(&ServeFields::provider, provider_options());
  options.push_back(
      value<ServeFields>("--listen", "HOST:PORT",
                         "Address to listen on, e.g. 127.0.0.1:8080; port 0: any free port,\n"
                         "printed at start. Anything but loopback needs --api-key-env",
                         [](ServeFields& f, const Arg& a) { f.listen = a.text; }));
  options.push_back(
      value<ServeFields>("--api-key-env", "VAR",
                         "Require the API key held by environment variable VAR\n"
                         "in the OPEN-SANDBOX-API-KEY header",
                         [](ServeFields& f, const Arg& a) { f.api_key_env = a.text; }));
  options.push_back(
      value<ServeFields>("--grace", "S",
                         "On SIGINT/SIGTERM, wait up to S seconds for running commands,\n"
                         "then as long for the sandboxes to close (default 10)",
                         [](ServeFields& f, const Arg& a) {
                           f.grace_s = a.number();
                           if (!(f.grace_s >= 0)) throw UsageError("--grace must be >= 0");
                         }));
  options.push_back(
      value<ServeFields>("--read-timeout", "S",
                         "Close a connection whose next request has not fully arrived\n"
                         "within S seconds (default 30)",
                         [](ServeFields& f, const Arg& a) {
                           f.read_timeout_s = a.number();
                           if (!(f.read_timeout_s > 0))
                             throw UsageError("--read-timeout must be > 0");
                         }));
  options.push_back(value<ServeFields>("--threads", "N", "Server threads (default 2)",
                                       [](ServeFields& f, const Arg& a) {
                                         f.threads = a.whole_number();
                                         if (f.threads < 1 || f.threads > 64) {
                                           throw UsageError("--threads must be between 1 and 64");
                                         }
                                       }));
  options.push_back(
      value<ServeFields>("--max-streams", "N",
                         "At most N command event streams open at once; more are refused\n"
                         "with 503 (default 0: no cap)",
                         [](ServeFields& f, const Arg& a) {
                           f.max_streams = a.whole_number();
                           if (*f.max_streams < 0 || *f.max_streams > 1000000) {
                             throw UsageError("--max-streams must be between 0 and 1000000");
                           }
                         }));
  return make_command<ServeFields>({
      .name = "serve",
      .summary = "Serve the OpenSandbox lifecycle API over a provider",
      .usage = "--provider NAME --listen HOST:PORT [--api-key-env VAR] [--grace S]",
      .description =
          "Runs an OpenSandbox-compatible server in front of one provider (docs/serve.md).\n"
          "This version serves GET /health and POST/GET/DELETE /sandboxes[/{id}], also under "
          "/v1,\nand execd (commands, files) at /sandboxes/{id}/proxy/44772/... on the gateway.\n"
          "Sandboxes it creates carry the label sbx.serve=true. SIGINT or SIGTERM stops "
          "it: running commands\nget --grace to finish, then it closes the sandboxes it created "
          "(within --grace) and exits 0.\n",
      .options = std::move(options),
      .check =
          [](ServeFields& f) {
            if (f.listen.empty()) throw UsageError("serve needs --listen HOST:PORT");
            split_listen(f.listen);
          },
      .handler = serve,
  });
}

}  // namespace sbx::cli
