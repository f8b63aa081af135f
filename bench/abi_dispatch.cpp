// What a call through the provider ABI costs, next to a direct C++ virtual call doing the same
// (nothing). Three ways of asking a sandbox for its status, each answered at once by the provider:
//   direct  a virtual call on a C++ object in this process
//   abi     provider->status(...) on the loaded noop plugin: the plugin SDK's operation object,
//           exactly-once completion, the C callback and the release of the handle
//   host    sbx::Sandbox::status(): the abi path plus the host API's operation state
// Prints the median nanoseconds per call over repeated batches, and the overhead over direct.
// Usage: abi_dispatch [--quick]

#include <sbx/abi.h>
#include <sbx/sbx.hpp>

#include <boost/dll/shared_library.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct StatusSource {
  virtual ~StatusSource() = default;
  virtual int32_t status() = 0;
};
struct Direct final : StatusSource {
  int32_t status() override { return SBX_SANDBOX_RUNNING; }
};

// Median nanoseconds per call of `fn` over `batches` batches of `calls` calls.
template <class F>
double median_ns(F&& fn, int batches, int calls) {
  std::vector<double> per_call;
  for (int b = 0; b < batches; ++b) {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i)
      fn();
    per_call.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                       calls);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

void SBX_ABI no_log(const sbx_host*, int32_t, sbx_str) {}
bool SBX_ABI log_off(const sbx_host*, int32_t) {
  return false;
}
int64_t SBX_ABI now_ns(const sbx_host*) {
  return Clock::now().time_since_epoch().count();
}
const void* SBX_ABI no_ext(const sbx_host*, const char*) {
  return nullptr;
}
const sbx_host kHost{sizeof(sbx_host),
                     SBX_ABI_VERSION_INIT,
                     {"bench", 5},
                     {"0", 1},
                     nullptr,
                     no_log,
                     log_off,
                     now_ns,
                     no_ext};

// The plugin loaded directly through the C ABI, with one sandbox.
struct RawPlugin {
  boost::dll::shared_library library;
  const sbx_plugin* plugin = nullptr;
  sbx_provider* provider = nullptr;
  sbx_sandbox* sandbox = nullptr;

  explicit RawPlugin(const std::string& path)
      : library(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local) {
    plugin = library.get<const sbx_plugin*()>(SBX_PLUGIN_ENTRY_SYMBOL)();
    if (plugin->init(&kHost, nullptr) != SBX_STATUS_OK) throw std::runtime_error("init failed");
    const sbx_provider_factory* f = plugin->factories[0];
    if (f->create(f, &kHost, {"{}", 2}, &provider, nullptr) != SBX_STATUS_OK) {
      throw std::runtime_error("provider failed");
    }
    sbx_spec spec{};
    spec.struct_size = sizeof(spec);
    const sbx_create_callbacks cb{
        sizeof(cb), &sandbox,
        [](void* ud, sbx_sandbox* s, const sbx_error*) { *static_cast<sbx_sandbox**>(ud) = s; }};
    if (sbx_operation* op = provider->create(provider, &spec, &cb)) op->release(op);
    if (!sandbox) throw std::runtime_error("create did not complete inline");
  }
  ~RawPlugin() {
    provider->release_sandbox(provider, sandbox);
    provider->destroy(provider);
    plugin->deinit();
  }

  int32_t status() {
    int32_t result = SBX_SANDBOX_UNKNOWN;
    const sbx_status_callbacks cb{
        sizeof(cb), &result,
        [](void* ud, int32_t status, const sbx_error*) { *static_cast<int32_t*>(ud) = status; }};
    if (sbx_operation* op = provider->status(provider, sandbox, &cb)) op->release(op);
    return result;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int batches = quick ? 5 : 31;
  const int calls = quick ? 20'000 : 200'000;
  const std::string plugin_path = std::string(SBX_BENCH_PLUGIN_DIR) + "/noop.so";

  Direct direct_impl;
  StatusSource* direct = &direct_impl;
  RawPlugin raw(plugin_path);

  sbx::Host host(
      sbx::Host::Options{.plugin_dirs = {SBX_BENCH_PLUGIN_DIR}, .use_default_plugin_dirs = false});
  sbx::Sandbox sandbox = host.provider("noop").create({});

  volatile int32_t sink = 0;
  if (raw.status() != SBX_SANDBOX_RUNNING || sandbox.status() != sbx::SandboxStatus::running) {
    std::fprintf(stderr, "the noop plugin did not answer RUNNING\n");
    return 1;
  }
  // Interleave the three so that machine noise hits them alike; repeat and keep the medians.
  std::vector<double> direct_ns, abi_ns, host_ns;
  for (int round = 0; round < 3; ++round) {
    direct_ns.push_back(median_ns([&] { sink = direct->status(); }, batches, calls));
    abi_ns.push_back(median_ns([&] { sink = raw.status(); }, batches, calls));
    host_ns.push_back(
        median_ns([&] { sink = static_cast<int32_t>(sandbox.status()); }, batches, calls));
  }
  (void)sink;
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double d = med(direct_ns), a = med(abi_ns), h = med(host_ns);
  std::printf("ABI dispatch benchmark: status() answered at once, median ns per call\n");
  std::printf("  (%d batches x %d calls, 3 interleaved rounds)\n", batches, calls);
  std::printf("  direct C++ virtual call      %8.1f ns\n", d);
  std::printf("  through the C ABI (plugin)   %8.1f ns   overhead %8.1f ns\n", a, a - d);
  std::printf("  host API sbx::Sandbox        %8.1f ns   overhead %8.1f ns\n", h, h - d);
  std::printf("  target: ABI overhead well under 1000 ns: %s\n", a - d < 1000 ? "PASS" : "FAIL");
  return 0;
}
