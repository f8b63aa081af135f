// The loader under concurrency: many threads create and drop hosts over one plain-C plugin
// (tests/plugins/c/init_counter.c) whose init refuses to run while an earlier init has not had its
// deinit, and whose deinit aborts without a live init. Before the fix, a host could open the
// library again while the last user's destructor was still about to call deinit (130 overlapping
// inits in 4 threads x 3,000 rounds). Built for TSan too.

#include <doctest/doctest.h>

#include <sbx/sbx.hpp>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

TEST_CASE("init and deinit are strictly paired while hosts come and go on several threads") {
  const sbx::Config config = sbx::Config::parse(std::string(R"({"providers": {"c": {"plugin": ")") +
                                                SBX_C_PLUGIN_DIR + R"(/init_counter.so"}}})");
  constexpr int kThreads = 4;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  constexpr int kRounds = 300;
#else
  constexpr int kRounds = 1500;
#endif
  std::atomic<int> overlapping{0};
  std::atomic<int> loaded{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        sbx::Host::Options options;
        options.config = config;
        options.use_default_plugin_dirs = false;
        sbx::Host host(std::move(options));
        try {
          sbx::Provider p = host.provider("c");
          if (p.valid()) ++loaded;
        } catch (const sbx::PluginLoadError& e) {
          if (std::string(e.what()).find("init called again before deinit") != std::string::npos)
            ++overlapping;
          else
            throw;
        }
      }
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(overlapping.load() == 0);
  CHECK(loaded.load() == kThreads * kRounds);
}
