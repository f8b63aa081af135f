// sbx plugins, sbx providers: what can be used.

#include "commands.hpp"
#include "shared.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <map>
#include <utility>
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

// Which file a provider id is used from when several offer it, as the host decides
// (core/src/host.cpp, first_in_search_order): the file in the earliest plugin directory; it
// shadows the others. Two in that directory are ambiguous: the host refuses the id.
struct Listed {
  const sbx::PluginInfo* info = nullptr;
  size_t rank = 0;  // its directory's place in the search order; past the end: in none
};

struct Choice {
  enum class Kind { used, shadowed, ambiguous } kind = Kind::used;
  std::vector<std::string> others;  // used: those it shadows; shadowed: the one used; ambiguous:
                                    // the others in the same directory
};

size_t rank_of(const std::filesystem::path& file, const std::vector<std::filesystem::path>& dirs) {
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::error_code ec;
    if (std::filesystem::equivalent(dirs[i], file.parent_path(), ec)) return i;
  }
  return dirs.size();
}

// Every (file, provider id) of a usable file -> its choice.
std::map<std::pair<std::string, std::string>, Choice> choices(const std::vector<Listed>& listed) {
  std::map<std::string, std::vector<const Listed*>> offering;  // id -> files in search order
  for (const auto& l : listed) {
    if (!l.info->ok()) continue;
    for (const auto& kind : l.info->providers) {
      auto& files = offering[kind.id];
      if (files.empty() || files.back() != &l) files.push_back(&l);  // an id twice in one file
    }
  }
  std::map<std::pair<std::string, std::string>, Choice> out;
  for (const auto& [id, files] : offering) {
    const size_t first = files.front()->rank;  // `listed` is sorted by rank
    std::vector<std::string> used, shadowed;
    for (const auto* l : files)
      (l->rank == first ? used : shadowed).push_back(l->info->path.string());
    for (const auto* l : files) {
      Choice& c = out[{l->info->path.string(), id}];
      const std::string self = l->info->path.string();
      if (l->rank != first) {
        c = {Choice::Kind::shadowed, {used.front()}};
      } else if (used.size() > 1) {
        c.kind = Choice::Kind::ambiguous;
        std::copy_if(used.begin(), used.end(), std::back_inserter(c.others),
                     [&](const std::string& p) { return p != self; });
      } else {
        c = {Choice::Kind::used, shadowed};
      }
    }
  }
  return out;
}

int plugins(ListingFields& f, const Global& g) {
  sbx::Host host = make_host(g);
  const auto plugins = host.plugins();
  const auto dirs = host.plugin_dirs();
  // In search order, so that the file used for an id comes before those it shadows.
  std::vector<Listed> listed;
  for (const auto& p : plugins)
    listed.push_back({&p, rank_of(p.path, dirs)});
  std::stable_sort(listed.begin(), listed.end(), [](const Listed& a, const Listed& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.info->path < b.info->path;
  });
  const auto chosen = choices(listed);
  const auto choice_of = [&](const sbx::PluginInfo& p, const std::string& id) -> const Choice& {
    return chosen.at({p.path.string(), id});
  };
  if (f.json) {
    boost::json::array out;
    for (const auto& l : listed) {
      const auto& p = *l.info;
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
          const Choice& c = choice_of(p, k.id);
          const boost::json::array others(c.others.begin(), c.others.end());
          kind["used"] = c.kind == Choice::Kind::used;
          if (c.kind == Choice::Kind::used && !c.others.empty()) kind["shadows"] = others;
          if (c.kind == Choice::Kind::shadowed) kind["shadowed_by"] = c.others.front();
          if (c.kind == Choice::Kind::ambiguous) kind["ambiguous_with"] = others;
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
  for (const auto& l : listed) {
    const auto& p = *l.info;
    std::cout << p.path.string() << "\n";
    if (!p.ok()) {
      std::cout << "  error: " << p.error << "\n";
      continue;
    }
    std::cout << "  plugin:    " << p.name << " " << p.version << " (ABI "
              << version_text(p.abi_version) << ")\n";
    for (const auto& k : p.providers) {
      std::cout << "  provider:  " << k.id << " - " << k.description << "\n";
      const Choice& c = choice_of(p, k.id);
      switch (c.kind) {
        case Choice::Kind::used:
          for (const auto& other : c.others)
            std::cout << "  shadows:   " << k.id << " of " << other << "\n";
          break;
        case Choice::Kind::shadowed:
          std::cout << "  shadowed:  " << k.id << ", by " << c.others.front() << " (not used)\n";
          break;
        case Choice::Kind::ambiguous:
          for (const auto& other : c.others)
            std::cout << "  ambiguous: " << k.id << ", also in " << other
                      << " (same directory: the id cannot be used)\n";
          break;
      }
      overlaps = overlaps || !c.others.empty();
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
