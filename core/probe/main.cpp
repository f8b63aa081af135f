// sbx-plugin-probe FILE: reads a plugin file's descriptor in a process of its own and prints it as
// one line of JSON: {"descriptor": {...}} or {"error": "why the file is not a usable plugin"}.
//
// The host runs this instead of loading every file it finds into its own process: loading a file
// runs its code (static constructors, the entry point), and a truncated or hostile file can crash
// or hang whoever loads it. A crash or a hang here is reported by the host as "this file is
// broken" (core/src/discovery.cpp). Nothing of the plugin but its loading and sbx_plugin_entry
// runs: init is never called.
#include "../src/descriptor.hpp"

#include <boost/dll/shared_library.hpp>
#include <boost/json/serialize.hpp>

#include <dlfcn.h>

#include <cstdio>
#include <exception>
#include <string>

namespace {

int print(const boost::json::object& out) {
  const std::string line = boost::json::serialize(out) + "\n";
  return std::fwrite(line.data(), 1, line.size(), stdout) == line.size() && std::fflush(stdout) == 0
             ? 0
             : 1;
}

boost::json::object probe(const char* path) {
  boost::dll::shared_library library;
  boost::dll::fs::error_code ec;
  library.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec) {
    // Boost.DLL keeps only a generic code; the loader's own message is still in dlerror().
    const char* why = ::dlerror();
    return {{"error", "cannot load the library: " + std::string(why ? why : ec.message())}};
  }
  if (!library.has(SBX_PLUGIN_ENTRY_SYMBOL)) {
    return {{"error", "not an sbx plugin: it does not export " SBX_PLUGIN_ENTRY_SYMBOL}};
  }
  const auto& entry = library.get<const sbx_plugin*()>(SBX_PLUGIN_ENTRY_SYMBOL);
  try {
    return {{"descriptor", sbx::detail::read_descriptor(entry()).to_json()}};
  } catch (const sbx::detail::DescriptorError& e) {
    return {{"error", e.what()}};
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sbx-plugin-probe FILE\n");
    return 2;
  }
  try {
    return print(probe(argv[1]));
  } catch (const std::exception& e) {
    return print({{"error", std::string("probing failed: ") + e.what()}});
  }
}
