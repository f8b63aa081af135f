// Lists the plugins of the installed sbx through sbx::core, as a host program of its own would
// (tests/install/check_install.sh runs it). Exit 1 when a plugin file is unusable.
#include <sbx/sbx.hpp>

#include <iostream>

int main() {
  sbx::Host host({.plugin_dirs = {SBX_PLUGIN_DIR},
                  .use_default_plugin_dirs = false,
                  .probe_program = SBX_PLUGIN_PROBE,
                  .plugin_cache = "off"});
  int status = 0;
  for (const auto& plugin : host.plugins()) {
    if (!plugin.ok()) {
      std::cout << "error: " << plugin.error << "\n";
      status = 1;
      continue;
    }
    for (const auto& provider : plugin.providers)
      std::cout << "provider " << provider.id << " in " << plugin.path.string() << "\n";
  }
  return status;
}
