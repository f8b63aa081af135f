// A complete sbx plugin in a few dozen lines: sandboxes are temporary directories on the host and
// commands run there with /bin/sh (no isolation; an example, not a sandbox). The SDK's blocking
// adapter runs each method on its own thread pool; exceptions become errors for the host.
// Left out to stay short: stderr is merged into stdout, and exec's timeout, cwd, env and user are
// ignored. tests/plugins/test_processes is a full implementation of the same idea.
#include <sbx/sdk/plugin.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace sbx::sdk;

// `path` inside the sandbox directory; ".." is refused so that no path leaves it.
fs::path inside(const Sandbox& box, const std::string& path) {
  const fs::path relative = fs::path(path).relative_path();
  for (const auto& part : relative)
    if (part == "..") throw Error::invalid_argument("path leaves the sandbox: " + path);
  return fs::path(box.id()) / relative;
}

class HelloProvider : public BlockingProvider {
 public:
  static constexpr const char* kId = "hello";
  static constexpr const char* kDescription = "Example: a temp directory per sandbox";
  static constexpr const char* kConfigSchema =
      R"({"type": "object", "additionalProperties": false})";

  HelloProvider(const ProviderContext& context, const boost::json::object& config)
      : log_(context.log) {
    json::ObjectReader(config).finish();  // no settings: any key is an error naming its path
  }

  std::unique_ptr<Sandbox> create(const Spec&, const CancelToken&) override {
    std::string dir = (fs::temp_directory_path() / "hello-XXXXXX").string();
    if (!mkdtemp(dir.data())) throw Error::create_failed("mkdtemp failed");
    log_.info("created ", dir);
    return std::make_unique<Sandbox>(dir);  // the sandbox id is its directory
  }
  ExitStatus exec(Sandbox& box, const ExecRequest& req, OutputSink& out,
                  const CancelToken&) override {
    const std::string cmd = "cd '" + box.id() + "' && (" + req.command + ") 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    if (!pipe) return ExitStatus::sandbox_failure();
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;)
      out.write(StdStream::out, {buf, n});
    const int status = pclose(pipe);
    return ExitStatus::exited(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  void upload(Sandbox& box, const UploadRequest& req, ByteSource& in, const CancelToken&) override {
    const fs::path target = inside(box, req.remote_path);
    fs::create_directories(target.parent_path());
    std::ofstream file(target, std::ios::binary);
    char buf[4096];
    for (size_t n; (n = in.read(buf, sizeof buf)) > 0;)
      file.write(buf, static_cast<long>(n));
    if (!file.flush()) throw Error::internal("writing " + req.remote_path + " failed");
  }
  void download(Sandbox& box, const std::string& path, ByteSink& sink,
                const CancelToken&) override {
    std::ifstream file(inside(box, path), std::ios::binary);
    if (!file) throw Error::not_found("no such file: " + path);
    char buf[4096];
    while (file.read(buf, sizeof buf) || file.gcount() > 0)
      sink.write({buf, size_t(file.gcount())});
  }
  SandboxStatus status(Sandbox& box, const CancelToken&) override {
    return fs::exists(box.id()) ? SandboxStatus::running : SandboxStatus::stopped;
  }
  void close(Sandbox& box, const CancelToken&) override { fs::remove_all(box.id()); }

 private:
  Logger log_;
};

SBX_PLUGIN("hello", "1.0.0", "An example plugin", factory<HelloProvider>())
