// sbx plugins, sbx providers: what can be used.

#include "commands.hpp"
#include "shared.hpp"

#include <boost/json.hpp>

#include <iostream>
#include <vector>

namespace sbx::cli {

namespace {

// The fields of both commands.
struct ListingFields {
  bool json = false;
};

std::string version_text(const sbx_version& v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

int plugins(ListingFields& f, const Global& g) {
  sbx::Host host = make_host(g);
  const auto plugins = host.plugins();  // in search order, each id's use decided by the host
  const auto dirs = host.plugin_dirs();
  using Use = sbx::PluginInfo::ProviderKind::Use;
  if (f.json) {
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
          boost::json::object kind{
              {"id", k.id}, {"description", k.description}, {"config_schema", schema}};
          boost::json::array others;
          for (const auto& other : k.others)
            others.push_back(boost::json::string(other.string()));
          kind["used"] = k.use == Use::used;
          if (k.use == Use::used && !others.empty()) kind["shadows"] = others;
          if (k.use == Use::shadowed) kind["shadowed_by"] = others.front();
          if (k.use == Use::ambiguous) kind["ambiguous_with"] = others;
          ids.push_back(std::move(kind));
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
    for (const auto& d : dirs)
      std::cout << " " << d.string();
    std::cout << "\n";
  }
  bool overlaps = false;
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
      switch (k.use) {
        case Use::used:
          for (const auto& other : k.others)
            std::cout << "  shadows:   " << k.id << " of " << other.string() << "\n";
          break;
        case Use::shadowed:
          std::cout << "  shadowed:  " << k.id << ", by " << k.others.front().string()
                    << " (not used)\n";
          break;
        case Use::ambiguous:
          for (const auto& other : k.others)
            std::cout << "  ambiguous: " << k.id << ", also in " << other.string()
                      << " (same directory: the id cannot be used)\n";
          break;
      }
      overlaps = overlaps || !k.others.empty();
    }
  }
  if (overlaps) {
    std::cout << "(an earlier directory shadows a provider id offered again in a later one; "
                 "searched in this order:";
    for (const auto& d : dirs)
      std::cout << " " << d.string();
    std::cout << ")\n";
  }
  return 0;
}

int providers(ListingFields& f, const Global& g) {
  sbx::Host host = make_host(g);
  const auto providers = host.providers();
  if (f.json) {
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

}  // namespace

Command plugins_command() {
  return make_command<ListingFields>({
      .name = "plugins",
      .summary = "List plugin files and the providers they offer",
      .usage = "[--json]",
      .description =
          "Lists every plugin file found in the plugin directories: its name, version, ABI version "
          "and the\nprovider ids it offers, or why it cannot be used. Each file is read by "
          "sbx-plugin-probe in a\nprocess of its own. Files are listed in search order "
          "(--plugin-dir, the config's plugin_path,\n$SBX_PLUGIN_PATH, sbx's own "
          "directory): when several offer one provider id, the first one's\ndirectory shadows "
          "the others' (\"shadows\", \"shadowed\"; in JSON \"used\", \"shadows\",\n"
          "\"shadowed_by\"), and two in one directory make the id unusable (\"ambiguous\", "
          "\"ambiguous_with\").\n",
      .options = {flag("--json", "Print a JSON array instead of text", &ListingFields::json)},
      .handler = plugins,
  });
}

Command providers_command() {
  return make_command<ListingFields>({
      .name = "providers",
      .summary = "List configured providers (and plugin providers usable by id)",
      .usage = "[--json]",
      .description =
          "Lists the provider blocks of the configuration, then the provider ids offered by "
          "plugins that no\nblock shadows (usable by id with their default config).\n",
      .options = {flag("--json", "Print a JSON array instead of text", &ListingFields::json)},
      .handler = providers,
  });
}

}  // namespace sbx::cli
