// Turning provider classes into a plugin: one factory per provider class and one SBX_PLUGIN line.
//
//   class EchoProvider : public sbx::sdk::BlockingProvider {
//    public:
//     static constexpr const char* kId = "echo";
//     static constexpr const char* kDescription = "Runs nothing, echoes commands";
//     static constexpr const char* kConfigSchema = R"({"type": "object"})";
//     EchoProvider(const sbx::sdk::ProviderContext& context, const boost::json::object& config);
//     ... the BlockingProvider methods ...
//   };
//   SBX_PLUGIN("echo", "1.0.0", "An example plugin", sbx::sdk::factory<EchoProvider>())
//
// A provider class derives from Provider (asynchronous) or BlockingProvider (run on an SDK pool),
// has the three static descriptor strings, and a constructor taking (const ProviderContext&,
// const boost::json::object& config) that validates the config and throws sdk::Error (usually
// Error::invalid_argument naming the JSON path; see json.hpp) when it is bad.
#pragma once

#include <sbx/abi/entry.h>
#include <sbx/sdk/blocking.hpp>
#include <sbx/sdk/json.hpp>
#include <sbx/sdk/provider.hpp>

#include <boost/json/object.hpp>

#include <memory>
#include <string_view>
#include <type_traits>

namespace sbx::sdk {
namespace detail {

// Wraps a provider object in the C ABI's sbx_provider (trampolines.cpp). Takes ownership.
// `host_knows_paused`: the host's ABI is 1.1 or later (a 1.0 host hears RUNNING for PAUSED).
sbx_provider* make_c_provider(std::unique_ptr<Provider> provider, Logger log,
                              bool host_knows_paused = true);

// Runs `make` and reports a failure through `errors`; the shared part of every factory.
sbx_status create_provider(const sbx_host* host, sbx_str config_json, sbx_provider** out,
                           const sbx_error_sink* errors,
                           std::unique_ptr<Provider> (*make)(const ProviderContext&,
                                                             const boost::json::object&));

// The plugin-wide init and deinit every SDK plugin uses (trampolines.cpp).
sbx_status SBX_ABI plugin_init(const sbx_host* host, const sbx_error_sink* errors);
void SBX_ABI plugin_deinit();

// The descriptor is a compile-time constant: it sits in read-only data, and loading a plugin runs
// no code of the plugin before init.
constexpr sbx_plugin make_plugin(const char* name, const char* version, const char* description,
                                 const sbx_provider_factory* const* factories, size_t count) {
  return sbx_plugin{sizeof(sbx_plugin), SBX_ABI_VERSION_INIT, name,  version,  description,
                    &plugin_init,       &plugin_deinit,       count, factories};
}

template <class T>
std::unique_ptr<Provider> make_provider(const ProviderContext& context,
                                        const boost::json::object& config) {
  if constexpr (std::is_base_of_v<BlockingProvider, T>) {
    return make_blocking_adapter(std::make_unique<T>(context, config), context.log);
  } else {
    static_assert(std::is_base_of_v<Provider, T>,
                  "a provider class derives from sbx::sdk::Provider or BlockingProvider");
    return std::make_unique<T>(context, config);
  }
}

template <class T>
sbx_status SBX_ABI factory_create(const sbx_provider_factory*, const sbx_host* host,
                                  sbx_str config_json, sbx_provider** out,
                                  const sbx_error_sink* errors) {
  return create_provider(host, config_json, out, errors, &make_provider<T>);
}

}  // namespace detail

template <class T>
inline constexpr sbx_provider_factory factory_descriptor{sizeof(sbx_provider_factory), T::kId,
                                                         T::kDescription, T::kConfigSchema,
                                                         &detail::factory_create<T>};

// The factory of provider class T (a constant; one per T).
template <class T>
constexpr const sbx_provider_factory* factory() {
  return &factory_descriptor<T>;
}

// The host given to the plugin's init (plugin-wide logging); null before init and after deinit.
const sbx_host* plugin_host() noexcept;

}  // namespace sbx::sdk

// Defines the plugin's one exported symbol, sbx_plugin_entry. Use once per plugin.
#define SBX_PLUGIN(NAME, VERSION, DESCRIPTION, ...)                                          \
  extern "C" SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {                   \
    static constexpr const sbx_provider_factory* sbx_factories_[] = {__VA_ARGS__};           \
    static constexpr sbx_plugin sbx_plugin_ =                                                \
        ::sbx::sdk::detail::make_plugin(NAME, VERSION, DESCRIPTION, sbx_factories_,          \
                                        sizeof(sbx_factories_) / sizeof(sbx_factories_[0])); \
    return &sbx_plugin_;                                                                     \
  }
