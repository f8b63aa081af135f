// Plugin init: the plugin-wide init and deinit every SDK plugin uses, the host they keep, and the
// factory call that wraps a provider object in its C table.

#include "internal.hpp"

#include <sbx/sdk/json.hpp>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>

namespace sbx::sdk::detail {
namespace {

// init and deinit may come more than once (CLAP 1.2 asks the same of its plugins): balanced pairs
// are counted, the host stays set until the last deinit, and a deinit without an init does
// nothing.
std::atomic<const sbx_host*> g_plugin_host{nullptr};
std::mutex g_init_mutex;
int g_init_count = 0;

// The host struct as ABI 1.0 defined it ends with get_extension; a later minor appends to it.
bool usable(const sbx_host* host) {
  return host && SBX_HAS_FIELD(host, sbx_host, get_extension);
}

// The checks: a host whose services are NULL breaks the contract (host.h: every function is
// there). The SDK copes (no log, the steady clock, no extension), but says so.
void check_services(const sbx_host* host, const char* call) {
  if (host->log && host->now_ns && host->get_extension) return;
  checks::violation(host, std::string(call) + ": the sbx_host has NULL functions (" +
                              (host->log ? "" : "log ") + (host->now_ns ? "" : "now_ns ") +
                              (host->get_extension ? "" : "get_extension ") +
                              "); the SDK goes on without them");
}

std::string version_text(const sbx_version& v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

// Why init refuses `host`, naming both ABI versions when the host states its own. The version
// comes before the size check: every ABI version keeps struct_size and abi_version first.
std::string refusal(const sbx_host* host) {
  const std::string plugin = version_text(SBX_ABI_VERSION_INIT);
  if (!host) return "this plugin speaks sbx ABI " + plugin + " and init was given no host";
  if (host->struct_size < offsetof(sbx_host, abi_version) + sizeof(sbx_version)) {
    return "this plugin speaks sbx ABI " + plugin + " and the host's sbx_host is too small (" +
           std::to_string(host->struct_size) + " bytes) to state its ABI version";
  }
  const std::string theirs = version_text(host->abi_version);
  if (!sbx_version_is_compatible(host->abi_version)) {
    return "this plugin speaks sbx ABI " + plugin + " and the host " + theirs +
           ": the major versions differ; build the plugin against an sbx SDK of ABI major " +
           std::to_string(host->abi_version.major);
  }
  return "this plugin speaks sbx ABI " + plugin + " and the host " + theirs + ", but the host's " +
         "sbx_host has " + std::to_string(host->struct_size) + " bytes; ABI 1.0 defines " +
         std::to_string(offsetof(sbx_host, get_extension) + sizeof(host->get_extension));
}

}  // namespace

sbx_status SBX_ABI plugin_init(const sbx_host* host, const sbx_error_sink* errors) {
  if (!usable(host) || !sbx_version_is_compatible(host->abi_version)) {
    try {
      report(errors, Error::failed_precondition(refusal(host)));
    } catch (...) {  // out of memory for the message: the status says enough
    }
    return SBX_STATUS_FAILED_PRECONDITION;
  }
  try {
    check_services(host, "init");
  } catch (...) {  // out of memory for the report
  }
  std::lock_guard lock(g_init_mutex);
  if (g_init_count++ == 0) g_plugin_host.store(host);
  return SBX_STATUS_OK;
}

void SBX_ABI plugin_deinit() {
  std::lock_guard lock(g_init_mutex);
  if (g_init_count == 0) return;
  if (--g_init_count == 0) {
    g_plugin_host.store(nullptr);
    forget_handle_table();  // the library may be unloaded next: give back what the checks hold
  }
}

sbx_status create_provider(const sbx_host* host, sbx_str config_json, sbx_provider** out,
                           const sbx_error_sink* errors,
                           std::unique_ptr<Provider> (*make)(const ProviderContext&,
                                                             const boost::json::object&)) {
  try {
    if (!out) throw Error::invalid_argument("no output pointer for the provider");
    *out = nullptr;
    if (!usable(host)) {
      throw Error::invalid_argument("the provider needs a host");
    }
    check_services(host, "create_provider");
    const boost::json::object config = json::parse_object(view(config_json), "config");
    const ProviderContext context{host, Logger(host)};
    const bool host_knows_paused = host->abi_version.major > 1 || host->abi_version.minor >= 1;
    *out = make_c_provider(make(context, config), context.log, host_knows_paused);
    return SBX_STATUS_OK;
  } catch (...) {
    const Error error = current_exception_to_error();
    report(errors, error);
    return error.status();
  }
}

}  // namespace sbx::sdk::detail

namespace sbx::sdk {

const sbx_host* plugin_host() noexcept {
  return detail::g_plugin_host.load();
}

}  // namespace sbx::sdk
