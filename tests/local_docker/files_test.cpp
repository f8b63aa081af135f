// local_docker file transfer: uploads and downloads through the archive API, refusals that leave
// no local file, uploads that are all or nothing (a failed or cancelled one leaves the previous
// file and no temporary file), uploads with a read-only root file system, and a 1 GiB round trip
// with bounded memory (run alone, as local_docker_big_file_test).

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <sbx/abi.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ldtest::provider;

namespace {

using sbx::testing::read_file;
using sbx::testing::write_file;
struct TempDir : sbx::testing::TempDir {
  TempDir() : sbx::testing::TempDir("sbx-ld-files") {}
};

// Peak resident set size of this process (the plugin runs in it), in KiB.
long peak_rss_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  FAIL("no VmHWM in /proc/self/status");
  return 0;
}

sbx::SandboxSpec spec_with_workdir() {
  auto spec = ldtest::spec();
  spec.workdir = "/work";
  return spec;
}

using ldtest::contains;

// An upload's temporary file: the archive path's ".NAME.sbx-partial-RANDOM", the agent's
// ".sbx-upload-RANDOM".
constexpr const char* kTempNames = "sbx-partial|sbx-upload";
bool is_temp_name(const std::string& name) {
  return contains(name, "sbx-partial") || contains(name, "sbx-upload");
}
// Finds every upload temporary file in the sandbox.
constexpr const char* kFindTempFiles =
    "find / \\( -path /proc -o -path /sys \\) -prune -o \\( -name '*.sbx-partial-*' -o "
    "-name '.sbx-upload-*' \\) -print";

// The temporary files of uploads in `dir`, one per line (none: "").
std::string partial_files(sbx::Sandbox& box, const std::string& dir) {
  return box.exec("ls -a '" + dir + "' | grep -E '" + std::string(kTempNames) + "'").stdout_text;
}

// ---- The plugin through its C ABI ----------------------------------------------------------
// The host API uploads local files and memory, which cannot be made to fail on demand; a host
// stream through the C ABI can, at a chosen byte, and can hold still until a cancellation is in.
// The plugin is loaded from a private copy of its file: a separate instance with its own init, as
// the host of the other cases may have loaded (and initialised) the original in this process
// already.

void SBX_ABI raw_log(const sbx_host*, int32_t, sbx_str message) {
  std::fprintf(stderr, "[raw local_docker] %.*s\n", static_cast<int>(message.len), message.data);
}
bool SBX_ABI raw_log_enabled(const sbx_host*, int32_t level) {
  return level >= SBX_LOG_WARN;
}
int64_t SBX_ABI raw_now_ns(const sbx_host*) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
const void* SBX_ABI raw_no_extension(const sbx_host*, const char*) {
  return nullptr;
}
const sbx_host kRawHost{
    sizeof(sbx_host), SBX_ABI_VERSION_INIT, {"test", 4}, {"0", 1},        nullptr,
    raw_log,          raw_log_enabled,      raw_now_ns,  raw_no_extension};

sbx_str view(std::string_view text) {
  return {text.data(), text.size()};
}

// What an operation completed with.
struct Outcome {
  sbx_status status = SBX_STATUS_OK;
  std::string message;
  std::string stdout_text;         // exec
  sbx_sandbox* sandbox = nullptr;  // create
};

// Receives one completion; the test waits for it.
struct Completion {
  std::promise<Outcome> promise;
  std::future<Outcome> future = promise.get_future();

  static Outcome outcome(const sbx_error* error) {
    Outcome o;
    if (error) {
      o.status = error->status;
      o.message.assign(error->message.data, error->message.len);
    }
    return o;
  }
  static void SBX_ABI done(void* user_data, const sbx_error* error) {
    static_cast<Completion*>(user_data)->promise.set_value(outcome(error));
  }
  static void SBX_ABI created(void* user_data, sbx_sandbox* sandbox, const sbx_error* error) {
    Outcome o = outcome(error);
    o.sandbox = sandbox;
    static_cast<Completion*>(user_data)->promise.set_value(std::move(o));
  }
  static void SBX_ABI executed(void* user_data, const sbx_exec_result* result,
                               const sbx_error* error) {
    Outcome o = outcome(error);
    if (result) {
      o.stdout_text.assign(reinterpret_cast<const char*>(result->stdout_bytes.data),
                           result->stdout_bytes.len);
    }
    static_cast<Completion*>(user_data)->promise.set_value(std::move(o));
  }

  Outcome wait() {
    REQUIRE(future.wait_for(180s) == std::future_status::ready);
    return future.get();
  }
};

void release(sbx_operation* op) {
  if (op) op->release(op);
}

class RawDocker {
 public:
  RawDocker() {
    const fs::path original =
        fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "plugins/local_docker.so";
    const fs::path copy = dir_.path / "local_docker_copy.so";
    fs::copy_file(original, copy);
    library_ = ::dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(library_ != nullptr, ::dlerror());
    const auto entry =
        reinterpret_cast<sbx_plugin_entry_fn>(::dlsym(library_, SBX_PLUGIN_ENTRY_SYMBOL));
    const bool found = entry != nullptr;  // doctest cannot print a function pointer
    REQUIRE_MESSAGE(found, "no " SBX_PLUGIN_ENTRY_SYMBOL " in ", copy.string());
    plugin_ = entry();
    REQUIRE(plugin_->init(&kRawHost, nullptr) == SBX_STATUS_OK);
    const sbx_provider_factory* factory = plugin_->factories[0];
    REQUIRE(factory->create(factory, &kRawHost, view("{}"), &provider_, nullptr) == SBX_STATUS_OK);
  }
  ~RawDocker() {
    provider_->destroy(provider_);
    plugin_->deinit();
    ::dlclose(library_);
  }
  RawDocker(const RawDocker&) = delete;
  RawDocker& operator=(const RawDocker&) = delete;

  // A busybox sandbox (workdir /work, the suite label) with these startup files.
  sbx_sandbox* create(const std::vector<std::pair<std::string, std::string>>& files) {
    std::vector<sbx_file> items;
    for (const auto& [path, contents] : files) {
      items.push_back(
          {view(path), {reinterpret_cast<const uint8_t*>(contents.data()), contents.size()}});
    }
    const sbx_kv labels[] = {{view(ldtest::kSuiteLabel), view(ldtest::kSuiteValue)}};
    sbx_spec spec{};
    spec.struct_size = sizeof(spec);
    spec.image = view(ldtest::kBusybox);
    spec.ttl_ms = {true, 900'000};
    spec.workdir = view("/work");
    spec.files = {items.data(), items.size()};
    spec.labels = {labels, 1};
    Completion done;
    const sbx_create_callbacks callbacks{sizeof(callbacks), &done, &Completion::created};
    release(provider_->create(provider_, &spec, &callbacks));
    const Outcome o = done.wait();
    REQUIRE_MESSAGE(o.sandbox != nullptr, o.message);
    return o.sandbox;
  }

  std::string exec(sbx_sandbox* sandbox, const std::string& command) {
    const sbx_exec_request request{sizeof(request), view(command), {}, {}, {}, {}, {}};
    Completion done;
    const sbx_exec_callbacks callbacks{sizeof(callbacks), &done, nullptr, &Completion::executed};
    release(provider_->exec(provider_, sandbox, &request, &callbacks));
    const Outcome o = done.wait();
    REQUIRE_MESSAGE(o.status == SBX_STATUS_OK, o.message);
    return o.stdout_text;
  }

  // Starts an upload; `done` receives its completion. The caller releases the handle.
  sbx_operation* upload(sbx_sandbox* sandbox, const std::string& path,
                        const sbx_input_stream& source, Completion& done) {
    const sbx_upload_request request{sizeof(request), view(path), &source, 0};
    const sbx_done_callbacks callbacks{sizeof(callbacks), &done, &Completion::done};
    return provider_->upload(provider_, sandbox, &request, &callbacks);
  }

  void close(sbx_sandbox* sandbox) {
    Completion done;
    const sbx_done_callbacks callbacks{sizeof(callbacks), &done, &Completion::done};
    release(provider_->close(provider_, sandbox, &callbacks));
    const Outcome o = done.wait();
    CHECK_MESSAGE(o.status == SBX_STATUS_OK, o.message);
    provider_->release_sandbox(provider_, sandbox);
  }

 private:
  TempDir dir_;
  void* library_ = nullptr;
  const sbx_plugin* plugin_ = nullptr;
  sbx_provider* provider_ = nullptr;
};

// Closes and releases a raw sandbox however the case ends.
struct RawSandbox {
  RawDocker& docker;
  sbx_sandbox* handle;
  ~RawSandbox() { docker.close(handle); }
};

// An upload source that announces `size` bytes and yields `good` of them. Then it fails (-1), or,
// with `hold`, signals `stalled` and waits until the test opens `gate` (after cancelling), and goes
// on as if nothing happened: only the cancellation can end that upload early.
struct TestSource {
  int64_t size;
  int64_t good;
  bool hold = false;
  int64_t given = 0;
  std::promise<void> stalled;
  std::promise<void> gate;
  std::shared_future<void> gate_open = gate.get_future().share();
  sbx_input_stream stream{sizeof(sbx_input_stream), this, size, &TestSource::read};

  TestSource(int64_t size_, int64_t good_, bool hold_ = false)
      : size(size_), good(good_), hold(hold_) {}

  static int64_t SBX_ABI read(void* ctx, uint8_t* buffer, size_t capacity) {
    auto& s = *static_cast<TestSource*>(ctx);
    if (s.given == s.good) {
      if (!s.hold) return -1;
      s.stalled.set_value();
      if (s.gate_open.wait_for(60s) != std::future_status::ready) return -1;
      s.good = s.size;
    }
    const auto n = static_cast<size_t>(std::min<int64_t>(
        static_cast<int64_t>(capacity), (s.given < s.good ? s.good : s.size) - s.given));
    std::memset(buffer, 'n', n);
    s.given += static_cast<int64_t>(n);
    return static_cast<int64_t>(n);
  }
};

}  // namespace

TEST_CASE("upload and download round trip: binary, empty, nested, relative, mode") {
  sbx::Sandbox box = provider().create(spec_with_workdir());
  TempDir tmp;
  std::string binary;
  for (int i = 0; i < 70000; ++i)
    binary.push_back(static_cast<char>((i * 7919) % 256));
  write_file(tmp.path / "bin.dat", binary);
  write_file(tmp.path / "empty.dat", "");

  box.upload(tmp.path / "bin.dat", "/new/dir/bin.dat");
  box.upload(tmp.path / "empty.dat", "empty.dat");  // relative: under the workdir
  CHECK(box.exec("wc -c < /new/dir/bin.dat").stdout_text == "70000\n");
  CHECK(box.exec("wc -c < /work/empty.dat").stdout_text == "0\n");
  CHECK(box.exec("stat -c '%a %u' /new/dir/bin.dat").stdout_text == "644 0\n");

  box.download("/new/dir/bin.dat", tmp.path / "out" / "bin.dat");
  box.download("empty.dat", tmp.path / "out" / "empty.dat");
  CHECK(read_file(tmp.path / "out" / "bin.dat") == binary);
  CHECK(fs::file_size(tmp.path / "out" / "empty.dat") == 0);

  // What a command wrote comes back byte for byte; an upload replaces an existing file.
  box.exec("printf 'made\\r\\n\\000inside' > made.bin");
  CHECK(box.download_bytes("made.bin") == std::string("made\r\n\0inside", 13));
  box.upload_bytes("second version", "made.bin");
  CHECK(box.download_bytes("/work/made.bin") == "second version");
  // A path with spaces and dots resolves lexically.
  box.upload_bytes("spaced", "/work/a dir/./sub/../file name.txt");
  CHECK(box.exec("cat '/work/a dir/file name.txt'").stdout_text == "spaced");
  box.close();
}

TEST_CASE("downloads refuse a directory, a symlink and a missing file, leaving no local file") {
  sbx::Sandbox box = provider().create(spec_with_workdir());
  TempDir tmp;
  REQUIRE(box.exec("mkdir -p /work/adir && echo secret > /work/target && "
                   "ln -s /work/target /work/link && ln -s /etc /work/dirlink")
              .return_code == 0);
  struct Case {
    const char* path;
    const char* why;
  };
  for (const Case c : {Case{"/work/adir", "directory"}, Case{"/work/link", "symbolic link"},
                       Case{"/work/dirlink", "symbolic link"}}) {
    CAPTURE(c.path);
    try {
      box.download(c.path, tmp.path / "x");
      FAIL("download must fail");
    } catch (const sbx::InvalidArgumentError& e) {
      CHECK(std::string(e.what()).find(c.why) != std::string::npos);
    }
  }
  CHECK_THROWS_AS(box.download("/work/missing.txt", tmp.path / "x"), sbx::NotFoundError);
  CHECK_THROWS_AS(box.download_bytes("/no/such/dir/file"), sbx::NotFoundError);
  CHECK(fs::is_empty(tmp.path));  // no file, no partial temp file
  // A regular file next to them still downloads.
  CHECK(box.download_bytes("/work/target") == "secret\n");
  box.close();
}

TEST_CASE("an upload never replaces a directory") {
  sbx::Sandbox box = provider().create(spec_with_workdir());
  REQUIRE(box.exec("mkdir -p /work/keep && echo inside > /work/keep/file").return_code == 0);
  const auto error = sbx::testing::error_of<sbx::InvalidArgumentError>(
      [&] { box.upload_bytes("x", "/work/keep"); });
  CHECK(contains(error.what(), "/work/keep"));
  CHECK(contains(error.what(), "directory"));
  CHECK(box.exec("ls -A /work/keep").stdout_text == "file\n");  // nothing moved into it
  CHECK(box.exec("cat /work/keep/file").stdout_text == "inside\n");
  CHECK(partial_files(box, "/work") == "");
  CHECK_THROWS_AS(box.upload_bytes("x", "/"), sbx::InvalidArgumentError);
  box.close();
}

TEST_CASE("an upload replaces an existing file in one step and leaves no temporary file") {
  sbx::Sandbox box = provider().create(spec_with_workdir());
  REQUIRE(box.exec("printf old > /work/f.txt && chmod 600 /work/f.txt && "
                   "mkdir /work/d && ln -s /work/d /work/dirlink && ln -s /work/f.txt /work/flink")
              .return_code == 0);
  const std::string inode_before = box.exec("stat -c %i /work/f.txt").stdout_text;
  box.upload_bytes("new contents", "/work/f.txt");
  CHECK(box.download_bytes("/work/f.txt") == "new contents");
  CHECK(box.exec("stat -c %a /work/f.txt").stdout_text == "644\n");
  // A new file renamed over the old one, not the old one rewritten: a reader that has the old file
  // open never sees it change or shrink.
  CHECK(box.exec("stat -c %i /work/f.txt").stdout_text != inode_before);
  // Links are replaced, not followed, as the archive API always did: also a link to a directory,
  // which a plain mv would have moved the file into.
  box.upload_bytes("was a link to a directory", "/work/dirlink");
  box.upload_bytes("was a link to a file", "/work/flink");
  CHECK(box.exec("[ -f /work/dirlink ] && [ ! -L /work/dirlink ] && [ -d /work/d ] && "
                 "[ -z \"$(ls -A /work/d)\" ] && [ ! -L /work/flink ]")
            .return_code == 0);
  CHECK(box.download_bytes("/work/flink") == "was a link to a file");
  CHECK(box.download_bytes("/work/f.txt") == "new contents");
  // A file directly under "/" and one whose name has spaces, quotes and a leading dash.
  box.upload_bytes("at the root", "/top.txt");
  box.upload_bytes("odd", "/work/-odd 'name' \"$x\".txt");
  CHECK(box.exec("cat /top.txt").stdout_text == "at the root");
  CHECK(box.exec("cat '/work/-odd '\\''name'\\'' \"$x\".txt'").stdout_text == "odd");
  CHECK(partial_files(box, "/work") == "");
  CHECK(partial_files(box, "/") == "");
  box.close();
}

TEST_CASE("a failed or cancelled upload leaves the previous file and no temporary file") {
  RawDocker raw;
  RawSandbox box{raw, raw.create({{"/work/keep.txt", "previous contents\n"}})};
  constexpr int64_t kSize = 64 << 20;
  const auto check_untouched = [&] {
    CHECK(raw.exec(box.handle, "head -c 100 /work/keep.txt") == "previous contents\n");
    CHECK(raw.exec(box.handle, "ls -a /work /work/new 2>/dev/null | grep -E '" +
                                   std::string(kTempNames) + "'") == "");
    CHECK(raw.exec(box.handle, "[ -e /work/new/fresh.txt ] || echo absent") == "absent\n");
  };

  SUBCASE("the source fails midway") {
    for (const char* target : {"/work/keep.txt", "/work/new/fresh.txt"}) {
      CAPTURE(target);
      TestSource source(kSize, 3 << 20);
      Completion done;
      release(raw.upload(box.handle, target, source.stream, done));
      const Outcome o = done.wait();
      CHECK(o.status == SBX_STATUS_INTERNAL);
      CHECK(contains(o.message, "source"));
      CHECK(source.given == 3 << 20);  // the daemon had part of the file: the failure was midway
    }
    check_untouched();
  }
  SUBCASE("the upload is cancelled midway") {
    TestSource source(kSize, 3 << 20, true);
    Completion done;
    sbx_operation* op = raw.upload(box.handle, "/work/keep.txt", source.stream, done);
    REQUIRE(op != nullptr);
    REQUIRE(source.stalled.get_future().wait_for(60s) == std::future_status::ready);
    op->cancel(op);
    source.gate.set_value();
    const Outcome o = done.wait();
    release(op);
    CHECK(o.status == SBX_STATUS_CANCELLED);
    CHECK(source.given < kSize);
    check_untouched();
  }
  // The same sandbox still takes a complete upload.
  TestSource whole(1000, 1000);
  Completion done;
  release(raw.upload(box.handle, "/work/keep.txt", whole.stream, done));
  CHECK(done.wait().status == SBX_STATUS_OK);
  CHECK(raw.exec(box.handle, "wc -c < /work/keep.txt") == "1000\n");
}

TEST_CASE("read-only root file system: uploads go into writable volumes only, leaving nothing") {
  sbx::Host::Options options;
  options.config = sbx::Config::parse(
      R"({"providers": {"ro": {"plugin": "local_docker", "config": {"create": {"read_only": true,
          "allowed_host_paths": [")" +
          std::filesystem::temp_directory_path().string() + R"("]}}}}})",
      "test");
  options.labels[ldtest::kSuiteLabel] = ldtest::kSuiteValue;
  sbx::Host host(std::move(options));
  TempDir volume;
  auto spec = spec_with_workdir();
  spec.provider_options["volumes"] =
      boost::json::array{volume.path.string() + ":/data", volume.path.string() + ":/ro:ro"};
  sbx::Sandbox box = host.provider("ro").create(spec);

  box.upload_bytes("into the volume", "/data/in.txt");
  box.upload_bytes("nested", "/data/a/b/nested.txt");  // parents created inside the volume
  box.upload_bytes("again", "/data/in.txt");           // and replacing works there too
  CHECK(box.exec("cat /data/in.txt").stdout_text == "again");
  CHECK(read_file(volume.path / "a/b/nested.txt") == "nested");

  struct Case {
    const char* path;
    const char* dir;
  };
  for (const Case c :
       {Case{"/etc/x.txt", "/etc"}, Case{"/work/new/x.txt", "/work"}, Case{"/ro/x.txt", "/ro"}}) {
    CAPTURE(c.path);
    const auto error = sbx::testing::error_of<sbx::FailedPreconditionError>(
        [&] { box.upload_bytes("refused", c.path); });
    CHECK(contains(error.what(), c.path));
    CHECK(contains(error.what(), "read-only"));
    CHECK_FALSE(error.retryable());
    CHECK(box.exec(std::string("[ -e ") + c.path + " ] || echo absent").stdout_text == "absent\n");
    CHECK(partial_files(box, c.dir) == "");
  }
  CHECK(partial_files(box, "/data") == "");
  for (const auto& entry : fs::recursive_directory_iterator(volume.path)) {
    CHECK_FALSE(is_temp_name(entry.path().filename().string()));
  }
  box.close();
}

TEST_CASE("paths that are not valid UTF-8 are refused before anything is written") {
  sbx::Sandbox box = provider().create(spec_with_workdir());
  // A stray byte, a truncated sequence, an overlong '/', a surrogate, past U+10FFFF.
  for (const std::string bad : {"/tmp/u\xff.txt", "rel/\xc3(.txt", "/tmp/\xc0\xaf.txt",
                                "/tmp/\xed\xa0\x80.txt", "/tmp/\xf4\x90\x80\x80.txt"}) {
    CAPTURE(bad.size());
    const auto error = sbx::testing::error_of<sbx::InvalidArgumentError>(
        [&] { box.upload_bytes("never written", bad); });
    CHECK(contains(error.what(), "not valid UTF-8"));  // by the plugin, or the SDK before it
    CHECK_THROWS_AS(box.download_bytes(bad), sbx::InvalidArgumentError);
  }
  // Valid UTF-8 beyond ASCII goes through, both ways.
  const std::string name =
      "/tmp/gr\xc3\xbc\xc3\x9f"
      "e-\xf0\x9f\x98\x80.txt";
  box.upload_bytes("unicode", name);
  CHECK(box.exec("cat /tmp/gr*e-*.txt").stdout_text == "unicode");
  CHECK(box.download_bytes(name) == "unicode");
  CHECK(box.exec(kFindTempFiles).stdout_text == "");
  box.close();
}

TEST_CASE("no failed upload leaves a temporary file anywhere") {
  TempDir volume;
  auto spec = spec_with_workdir();
  spec.provider_options["volumes"] = boost::json::array{volume.path.string() + ":/ro:ro"};
  spec.files = {{"/work/file.txt", "a file"}};
  sbx::Sandbox box = provider("docker_volumes").create(spec);
  std::vector<std::pair<const char*, std::function<void()>>> failures = {
      {"not UTF-8", [&] { box.upload_bytes("x", "/work/bad\xff.txt"); }},
      {"a directory", [&] { box.upload_bytes("x", "/work"); }},
      {"a file on the way", [&] { box.upload_bytes("x", "/work/file.txt/below.txt"); }},
      {"a read-only volume", [&] { box.upload_bytes("x", "/ro/x.txt"); }},
      {"a read-only file system", [&] { box.upload_bytes("x", "/proc/x.txt"); }},
      {"a missing local file", [&] { box.upload("/nonexistent/sbx-test/file", "/work/y.txt"); }},
  };
  for (const auto& [what, fail] : failures) {
    CAPTURE(what);
    CHECK_THROWS_AS(fail(), sbx::Error);
  }
  CHECK(box.exec(kFindTempFiles).stdout_text == "");
  CHECK(box.exec("cat /work/file.txt").stdout_text == "a file");
  for (const auto& entry : fs::recursive_directory_iterator(volume.path)) {
    CHECK_FALSE(is_temp_name(entry.path().filename().string()));
  }
  box.close();
}

TEST_CASE("1 GiB streamed upload and download with bounded memory") {
  constexpr int64_t kSize = int64_t{1} << 30;
  sbx::Sandbox box = provider().create(spec_with_workdir());
  TempDir tmp;
  // A sparse file: 1 GiB to stream, no GiB of local disk to write first.
  {
    const int fd = ::open((tmp.path / "big.bin").c_str(), O_CREAT | O_WRONLY, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, kSize) == 0);
    REQUIRE(::pwrite(fd, "head", 4, 0) == 4);
    REQUIRE(::pwrite(fd, "tail", 4, kSize - 4) == 4);
    ::close(fd);
  }
  const long rss_before = peak_rss_kib();
  box.upload(tmp.path / "big.bin", "big.bin");
  CHECK(box.exec("wc -c < /work/big.bin").stdout_text == std::to_string(kSize) + "\n");
  CHECK(box.exec("head -c 4 big.bin; tail -c 4 big.bin").stdout_text == "headtail");

  box.download("/work/big.bin", tmp.path / "back.bin");
  const long rss_after = peak_rss_kib();
  MESSAGE("peak RSS grew by ", rss_after - rss_before, " KiB for 2 GiB moved");
  CHECK(rss_after - rss_before < 64 * 1024);

  REQUIRE(fs::file_size(tmp.path / "back.bin") == static_cast<uint64_t>(kSize));
  std::ifstream in(tmp.path / "back.bin", std::ios::binary);
  std::string chunk(1 << 20, '\0');
  int64_t offset = 0;
  bool zeros = true;
  while (in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0) {
    const auto n = static_cast<size_t>(in.gcount());
    for (size_t i = 0; i < n; ++i) {
      const int64_t at = offset + static_cast<int64_t>(i);
      if (at < 4 || at >= kSize - 4) continue;
      if (chunk[i] != 0) zeros = false;
    }
    if (offset == 0) CHECK(chunk.substr(0, 4) == "head");
    if (offset + static_cast<int64_t>(n) == kSize) CHECK(chunk.substr(n - 4, 4) == "tail");
    offset += static_cast<int64_t>(n);
  }
  CHECK(offset == kSize);
  CHECK(zeros);
  box.close();
}
