// What several `sbx` commands share (shared.hpp).

#include "shared.hpp"

#include <sbx/base/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace sbx::cli {

sbx::Host make_host(const Global& global) {
  sbx::Host::Options options;
  std::optional<std::string> config = global.config;
  if (!config) {
    if (const char* env = std::getenv("SBX_CONFIG"); env && *env) config = env;
  }
  if (config) options.config = sbx::Config::load(*config);
  options.plugin_dirs = global.plugin_dirs;
  return sbx::Host(std::move(options));
}

sbx::Provider ProviderChoice::pick(sbx::Host& host) const {
  return name ? host.provider(*name) : host.default_provider();
}

std::vector<Option<ProviderChoice>> provider_options() {
  return {value<ProviderChoice>("--provider", "NAME",
                                "Provider block name, or a plugin's provider id (default config);\n"
                                "default: the config's default_provider, else its only block,\n"
                                "else local_docker when the config has none",
                                [](ProviderChoice& p, const Arg& a) { p.name = a.text; })};
}

std::vector<Option<SandboxChoice>> sandbox_options() {
  using S = SandboxChoice;
  return {
      value<S>("--image", "IMAGE", "Sandbox image",
               [](S& s, const Arg& a) { s.spec.image = a.text; }),
      repeatable<S>("--env", "K=V", "Environment variable of the sandbox",
                    [](S& s, const Arg& a) {
                      auto [k, v] = a.pair('=');
                      s.spec.env[k] = v;
                    }),
      value<S>("--workdir", "DIR", "Working directory of the sandbox (and its commands)",
               [](S& s, const Arg& a) { s.spec.workdir = a.text; }),
      value<S>("--ttl", "S", "Sandbox lifetime in seconds",
               [](S& s, const Arg& a) { s.spec.ttl_s = a.number(); }),
      value<S>("--cpu", "N", "CPUs (may be fractional)",
               [](S& s, const Arg& a) { s.spec.resources.cpu = a.number(); }),
      value<S>("--memory", "MIB", "Memory limit in MiB",
               [](S& s, const Arg& a) { s.spec.resources.memory_mib = a.whole_number(); }),
      repeatable<S>("--metadata", "K=V", "Sandbox metadata",
                    [](S& s, const Arg& a) {
                      auto [k, v] = a.pair('=');
                      s.spec.metadata[k] = v;
                    }),
      value<S>("--provider-options", "JSON", "Provider-specific options (a JSON object)",
               [](S& s, const Arg& a) {
                 try {  // the config files' rules: duplicate keys are an error
                   s.spec.provider_options = sbx::base::json::parse_object(a.text, a.name);
                 } catch (const std::exception& e) {
                   throw UsageError(std::string(e.what()) + " (" + std::string(a.name) +
                                    " must be a JSON object)");
                 }
               }),
      repeatable<S>("--upload", "LOCAL:REMOTE", "Copy a local file into the sandbox",
                    [](S& s, const Arg& a) { s.uploads.push_back(a.pair(':')); }),
  };
}

void SandboxChoice::check() const {
  try {
    spec.validate();
  } catch (const sbx::InvalidArgumentError& e) {
    throw UsageError(e.what());
  }
  for (const auto& [local, remote] : uploads)
    require_readable_file(local, "--upload");
}

std::vector<Option<sbx::ExecOptions>> command_options() {
  using E = sbx::ExecOptions;
  return {
      value<E>("--timeout", "S", "Command timeout in seconds (default: the provider's)",
               [](E& e, const Arg& a) { e.timeout_s = a.number(); }),
      value<E>("--user", "USER", "Run the command as USER (name or uid)",
               [](E& e, const Arg& a) { e.user = a.text; }),
  };
}

std::vector<Option<StopChoice>> stop_options() {
  return {
      value<StopChoice>("--stop-timeout", "S",
                        "After a stop (Ctrl-C), how long to wait for the provider (default: 10);\n"
                        "a second Ctrl-C stops waiting at once",
                        [](StopChoice& s, const Arg& a) {
                          s.stop_timeout_s = a.number();
                          if (!(s.stop_timeout_s > 0))
                            throw UsageError(std::string(a.name) + " must be > 0");
                        })};
}

void require_readable_file(const std::string& local, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(local, ec) || ::access(local.c_str(), R_OK) != 0) {
    throw UsageError(what + ": " + local + " is not a readable file");
  }
}

sbx::Operation<sbx::ExecResult> start_exec(sbx::Sandbox& sandbox,
                                           const std::vector<std::string>& words,
                                           sbx::ExecOptions options) {
  if (words.size() == 1) return sandbox.exec_async(words[0], std::move(options));
  return sandbox.exec_argv_async(words, std::move(options));
}

}  // namespace sbx::cli
