// sbx list, sbx reap: a provider's sandboxes by label (sbx.list-reap/1). They own no sandbox, so
// a signal simply ends them.

#include "commands.hpp"
#include "shared.hpp"

#include <boost/json.hpp>

#include <iostream>

namespace sbx::cli {

namespace {

// The fields of both commands (--all is reap's only).
struct ListFields {
  ProviderChoice provider;
  sbx::StringMap selector;
  bool json = false;
  bool all = false;
};

std::vector<Option<ListFields>> list_options(bool reap) {
  std::vector<Option<ListFields>> options = options_of(&ListFields::provider, provider_options());
  options.push_back(repeatable<ListFields>(
      "--label", "K=V",
      reap ? "Label selector; e.g. --label sbx.run=3f2a9c0d1e4b" : "Label selector",
      [](ListFields& f, const Arg& a) {
        const size_t eq = a.text.find('=');
        if (a.text.empty() || eq == 0) throw UsageError("--label must look like K=V or K");
        f.selector[a.text.substr(0, eq)] = eq == std::string::npos ? "" : a.text.substr(eq + 1);
      }));
  if (reap) {
    options.push_back(flag("--all", "Remove every sandbox of the provider", &ListFields::all));
  }
  options.push_back(flag("--json", "Print a JSON array instead of text", &ListFields::json));
  return options;
}

int list_or_reap(ListFields& f, const Global& g, bool reap) {
  sbx::Host host = make_host(g);
  sbx::Provider provider = f.provider.pick(host);
  const auto sandboxes = reap ? provider.reap(f.selector) : provider.list(f.selector);
  if (f.json) {
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

}  // namespace

Command list_command() {
  return make_command<ListFields>({
      .name = "list",
      .summary = "List a provider's sandboxes by label",
      .usage = "--provider NAME [--label K=V]... [--json]",
      .description =
          "Lists the sandboxes of a provider whose labels match every --label (K=V: that value; "
          "K: any value).\nEvery sandbox sbx creates carries sbx.run, sbx.host and sbx.provider "
          "labels plus its metadata.\n",
      .options = list_options(false),
      .handler = [](ListFields& f, const Global& g) { return list_or_reap(f, g, false); },
  });
}

Command reap_command() {
  return make_command<ListFields>({
      .name = "reap",
      .summary = "Remove a provider's sandboxes by label (e.g. leaks of a crashed run)",
      .usage = "--provider NAME (--label K=V... | --all) [--json]",
      .description = "Force-removes the sandboxes of a provider whose labels match every --label, "
                     "and prints them.\nWithout a selector it refuses to run unless --all is "
                     "given.\n",
      .options = list_options(true),
      .check =
          [](ListFields& f) {
            if (f.selector.empty() && !f.all) {
              throw UsageError(
                  "reap needs --label K=V (or --all to remove every sandbox of the provider)");
            }
          },
      .handler = [](ListFields& f, const Global& g) { return list_or_reap(f, g, true); },
  });
}

}  // namespace sbx::cli
