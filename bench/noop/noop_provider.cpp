// A provider that does nothing and completes every call inside the start call, so that a
// benchmark through it measures only the cost of crossing the ABI.
#include <sbx/sdk/plugin.hpp>

namespace {

class NoopProvider final : public sbx::sdk::Provider {
 public:
  static constexpr const char* kId = "noop";
  static constexpr const char* kDescription = "Completes every call at once (benchmarks only)";
  static constexpr const char* kConfigSchema = R"({"type": "object"})";

  NoopProvider(const sbx::sdk::ProviderContext&, const boost::json::object&) {}

  void create(sbx::sdk::Spec,
              sbx::sdk::Completion<std::unique_ptr<sbx::sdk::Sandbox>> done) override {
    done.succeed(std::make_unique<sbx::sdk::Sandbox>("noop"));
  }
  void exec(sbx::sdk::Sandbox&, sbx::sdk::ExecRequest, sbx::sdk::ExecCompletion done) override {
    done.succeed(sbx::sdk::ExitStatus::exited(0));
  }
  void upload(sbx::sdk::Sandbox&, sbx::sdk::UploadRequest, sbx::sdk::ByteSource&,
              sbx::sdk::Completion<void> done) override {
    done.succeed();
  }
  void download(sbx::sdk::Sandbox&, std::string, sbx::sdk::ByteSink&,
                sbx::sdk::Completion<void> done) override {
    done.succeed();
  }
  void status(sbx::sdk::Sandbox&, sbx::sdk::Completion<sbx::sdk::SandboxStatus> done) override {
    done.succeed(sbx::sdk::SandboxStatus::running);
  }
  void close(sbx::sdk::Sandbox&, sbx::sdk::Completion<void> done) override { done.succeed(); }
};

}  // namespace

SBX_PLUGIN("noop", "0.1.0", "Benchmark plugin", sbx::sdk::factory<NoopProvider>())
