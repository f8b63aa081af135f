// The provider conformance suite: host-API cases every provider must pass. It runs against any
// provider named by environment variables, so third parties can run it against their plugin:
//
//   SBX_CONFORMANCE_PROVIDER   provider name (a config block or a provider id)        [required]
//   SBX_CONFORMANCE_CONFIG     host config file (JSON) defining that provider           [optional]
//   SBX_CONFORMANCE_PLUGIN_DIR extra plugin directory                                  [optional]
//   SBX_CONFORMANCE_IMAGE      image for the sandboxes                                   [optional]
//
// Paths inside sandboxes are absolute and under the spec's workdir (/work), and commands use only
// POSIX sh and utilities every image has (busybox is enough).

#include <doctest/doctest.h>

#include "../common/test_helpers.hpp"

#include <sbx/sbx.hpp>

#include <boost/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

sbx::Host& host() {
  static sbx::Host instance = [] {
    sbx::Host::Options options;
    if (const char* config = env("SBX_CONFORMANCE_CONFIG")) {
      options.config = sbx::Config::load(config);
    }
    if (const char* dir = env("SBX_CONFORMANCE_PLUGIN_DIR")) options.plugin_dirs.push_back(dir);
    return sbx::Host(std::move(options));
  }();
  return instance;
}

sbx::Provider provider() {
  const char* name = env("SBX_CONFORMANCE_PROVIDER");
  REQUIRE_MESSAGE(name, "set SBX_CONFORMANCE_PROVIDER to the provider under test");
  return host().provider(name);
}

sbx::SandboxSpec base_spec() {
  sbx::SandboxSpec spec;
  if (const char* image = env("SBX_CONFORMANCE_IMAGE")) spec.image = image;
  spec.workdir = "/work";
  spec.ttl_s = 600;  // a crashed test run must not leave sandboxes forever
  spec.metadata["sbx.test"] = "conformance";
  return spec;
}

using sbx::testing::read_file;
using sbx::testing::write_file;
struct TempDir : sbx::testing::TempDir {
  TempDir() : sbx::testing::TempDir("sbx-conformance") {}
};

std::string all_bytes() {
  std::string s;
  for (int i = 0; i < 256; ++i)
    s.push_back(static_cast<char>(i));
  return s;
}

// One sandbox shared by the cases that do not need their own.
sbx::Sandbox& shared_sandbox() {
  static sbx::Sandbox box = provider().create(base_spec());
  return box;
}

}  // namespace

TEST_SUITE("conformance") {
  TEST_CASE("create returns a ready sandbox") {
    sbx::Sandbox box = provider().create(base_spec());
    CHECK_FALSE(box.id().empty());
    CHECK(box.status() == sbx::SandboxStatus::running);
    // Ready means commands run right away, no retry needed.
    const auto r = box.exec("echo ready");
    CHECK(r.return_code == 0);
    CHECK(r.stdout_text == "ready\n");
    box.close();
  }

  TEST_CASE("exec separates stdout and stderr and keeps bytes exact") {
    auto& box = shared_sandbox();
    const auto r = box.exec("printf 'out'; printf 'err' >&2; printf '\\001\\002\\377'");
    CHECK(r.return_code == 0);
    CHECK_FALSE(r.error_type.has_value());
    CHECK(r.stdout_text == std::string("out\x01\x02\xff", 6));
    CHECK(r.stderr_text == "err");
  }

  TEST_CASE("exec output of a megabyte arrives whole") {
    auto& box = shared_sandbox();
    const auto r = box.exec(
        "i=0; while [ $i -lt 16384 ]; do echo "
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde; i=$((i+1)); done");
    CHECK(r.return_code == 0);
    CHECK(r.stdout_text.size() == 16384u * 64u);
  }

  TEST_CASE("a non-zero exit code is a result, not an error") {
    auto& box = shared_sandbox();
    const auto r = box.exec("echo partial; exit 3");
    CHECK(r.return_code == 3);
    CHECK_FALSE(r.error_type.has_value());
    CHECK(r.stdout_text == "partial\n");
    CHECK(box.exec("false").return_code == 1);
  }

  TEST_CASE("cwd defaults to the workdir and can be set per exec") {
    auto& box = shared_sandbox();
    box.upload_bytes("in sub\n", "/work/sub/marker.txt");
    box.upload_bytes("in work\n", "/work/marker.txt");
    CHECK(box.exec("cat marker.txt").stdout_text == "in work\n");
    CHECK(box.exec("cat marker.txt", {.cwd = "/work/sub"}).stdout_text == "in sub\n");
  }

  TEST_CASE("env comes from the spec and the exec; the exec wins") {
    auto spec = base_spec();
    spec.env = {{"SPEC_ONLY", "s"}, {"BOTH", "from-spec"}};
    sbx::Sandbox box = provider().create(spec);
    const auto r = box.exec("echo \"$SPEC_ONLY $BOTH $EXEC_ONLY\"",
                            {.env = {{"BOTH", "from-exec"}, {"EXEC_ONLY", "e"}}});
    CHECK(r.stdout_text == "s from-exec e\n");
    CHECK(box.exec("echo \"$BOTH\"").stdout_text == "from-spec\n");
    box.close();
  }

  TEST_CASE("timeout rule: 125, error_type timeout, output so far") {
    auto& box = shared_sandbox();
    const auto start = std::chrono::steady_clock::now();
    const auto r = box.exec("echo before; sleep 30; echo after", {.timeout_s = 1.5});
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(r.return_code == 125);
    REQUIRE(r.error_type.has_value());
    CHECK(*r.error_type == "timeout");
    CHECK(r.stdout_text == "before\n");
    CHECK(took < 20s);  // stopped by the timeout, not by the command ending
    // The sandbox is still usable afterwards.
    CHECK(box.exec("echo still-here").stdout_text == "still-here\n");
  }

  TEST_CASE("output streams to the caller before the command ends") {
    auto& box = shared_sandbox();
    std::mutex m;
    std::string seen;
    std::optional<std::chrono::steady_clock::time_point> first_chunk;
    sbx::ExecOptions options;
    options.on_output = [&](sbx::OutputStream stream, std::string_view bytes) {
      std::lock_guard lock(m);
      if (!first_chunk) first_chunk = std::chrono::steady_clock::now();
      seen += (stream == sbx::OutputStream::err ? "E:" : "O:") + std::string(bytes);
    };
    const auto r = box.exec_async("echo one; sleep 1; echo two >&2", options).get();
    const auto done = std::chrono::steady_clock::now();
    CHECK(r.return_code == 0);
    CHECK(r.stdout_text.empty());  // streamed output is not accumulated
    std::lock_guard lock(m);
    CHECK(seen == "O:one\nE:two\n");
    REQUIRE(first_chunk.has_value());
    // "one" arrived about a second before the command ended, not with the result.
    CHECK(done - *first_chunk >= 500ms);
  }

  TEST_CASE("startup files are in place when create returns") {
    auto spec = base_spec();
    spec.files = {{"/work/hello.txt", "hello startup\n"}, {"/work/deep/er/x.txt", "x"}};
    sbx::Sandbox box = provider().create(spec);
    CHECK(box.exec("cat hello.txt").stdout_text == "hello startup\n");
    CHECK(box.exec("cat deep/er/x.txt").stdout_text == "x");
    box.close();
  }

  TEST_CASE("upload and download round trip binary and empty files") {
    auto& box = shared_sandbox();
    TempDir tmp;
    const std::string binary = all_bytes() + all_bytes();
    write_file(tmp.path / "bin.dat", binary);
    write_file(tmp.path / "empty.dat", "");
    box.upload(tmp.path / "bin.dat", "/work/new/dir/bin.dat");
    box.upload(tmp.path / "empty.dat", "/work/empty.dat");
    CHECK(box.exec("wc -c < new/dir/bin.dat").stdout_text.find("512") != std::string::npos);
    CHECK(box.exec("wc -c < empty.dat").stdout_text.find("0") != std::string::npos);
    box.download("/work/new/dir/bin.dat", tmp.path / "out" / "bin.dat");
    box.download("/work/empty.dat", tmp.path / "out" / "empty.dat");
    CHECK(read_file(tmp.path / "out" / "bin.dat") == binary);
    CHECK(fs::exists(tmp.path / "out" / "empty.dat"));
    CHECK(fs::file_size(tmp.path / "out" / "empty.dat") == 0);
    // A file the command wrote comes out as written.
    box.exec("printf 'made inside' > made.txt");
    CHECK(box.download_bytes("/work/made.txt") == "made inside");
  }

  TEST_CASE("downloading a missing file fails and leaves no local file") {
    auto& box = shared_sandbox();
    TempDir tmp;
    CHECK_THROWS_AS(box.download("/work/does-not-exist.txt", tmp.path / "x.txt"),
                    sbx::NotFoundError);
    CHECK_FALSE(fs::exists(tmp.path / "x.txt"));
    CHECK(fs::is_empty(tmp.path));  // no partial temp file either
  }

  TEST_CASE("status before and after close; close twice") {
    sbx::Sandbox box = provider().create(base_spec());
    CHECK(box.status() == sbx::SandboxStatus::running);
    box.close();
    CHECK(box.status() == sbx::SandboxStatus::stopped);
    CHECK_NOTHROW(box.close());
    CHECK(box.closed());
  }

  TEST_CASE("a closed sandbox refuses work with a clear error") {
    sbx::Sandbox box = provider().create(base_spec());
    const std::string id = box.id();
    box.close();
    try {
      box.exec("echo no");
      FAIL("exec on a closed sandbox must throw");
    } catch (const sbx::FailedPreconditionError& e) {
      CHECK(std::string(e.what()).find(id) != std::string::npos);
    }
    CHECK_THROWS_AS(box.upload_bytes("x", "/work/x"), sbx::FailedPreconditionError);
    CHECK_THROWS_AS(box.download_bytes("/work/x"), sbx::FailedPreconditionError);
  }

  TEST_CASE("cancelling an exec stops it") {
    auto& box = shared_sandbox();
    auto op = box.exec_async("sleep 30");
    std::this_thread::sleep_for(300ms);
    const auto start = std::chrono::steady_clock::now();
    op.cancel();
    CHECK_THROWS_AS(op.get(), sbx::CancelledError);
    CHECK(std::chrono::steady_clock::now() - start < 15s);
    CHECK(box.exec("echo alive").return_code == 0);
  }

  TEST_CASE("concurrent execs on one sandbox") {
    auto& box = shared_sandbox();
    std::vector<sbx::Operation<sbx::ExecResult>> ops;
    for (int i = 0; i < 16; ++i)
      ops.push_back(box.exec_async("echo " + std::to_string(i)));
    for (int i = 0; i < 16; ++i) {
      const auto r = ops[static_cast<size_t>(i)].get();
      CHECK(r.return_code == 0);
      CHECK(r.stdout_text == std::to_string(i) + "\n");
    }
  }

  TEST_CASE("invalid spec values are refused before the provider sees them") {
    auto spec = base_spec();
    spec.ports = {0};
    CHECK_THROWS_WITH_AS(provider().create(spec),
                         "Sandbox TCP port must be between 1 and 65535, got 0",
                         sbx::InvalidArgumentError);
    spec.ports = {8000, 8000};
    CHECK_THROWS_WITH_AS(provider().create(spec), "Duplicate sandbox TCP port: 8000",
                         sbx::InvalidArgumentError);
    spec.ports = {};
    spec.ttl_s = -1;
    CHECK_THROWS_AS(provider().create(spec), sbx::InvalidArgumentError);
  }

  // ---- ABI 1.1 extensions: each case runs when the provider offers the extension, and says so
  // otherwise (a provider without them is conformant).

  TEST_CASE("sbx.pause/1: paused refuses work at once; resumed works again") {
    if (!provider().supports("sbx.pause/1")) {
      MESSAGE("the provider does not offer sbx.pause/1; nothing to check");
      return;
    }
    sbx::Sandbox box = provider().create(base_spec());
    box.exec("echo before > state");
    box.pause();
    CHECK(box.status() == sbx::SandboxStatus::paused);
    CHECK_NOTHROW(box.pause());  // pausing a paused sandbox changes nothing
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(box.exec("echo no"), sbx::FailedPreconditionError);
    CHECK_THROWS_AS(box.upload_bytes("x", "/work/x"), sbx::FailedPreconditionError);
    CHECK_THROWS_AS(box.download_bytes("/work/state"), sbx::FailedPreconditionError);
    CHECK(std::chrono::steady_clock::now() - start < 10s);  // refused, not waited on
    box.resume();
    CHECK_NOTHROW(box.resume());  // resuming a running sandbox changes nothing
    CHECK(box.status() == sbx::SandboxStatus::running);
    CHECK(box.exec("cat state").stdout_text == "before\n");
    box.pause();
    box.close();  // a paused sandbox can be ended
    CHECK(box.status() == sbx::SandboxStatus::stopped);
  }

  TEST_CASE("sbx.connect/1: a descriptor reaches the sandbox from a second host") {
    if (!provider().supports("sbx.connect/1")) {
      MESSAGE("the provider does not offer sbx.connect/1; nothing to check");
      return;
    }
    auto spec = base_spec();
    spec.env["CONFORMANCE_ENV"] = "kept";
    sbx::Sandbox box = provider().create(spec);
    box.upload_bytes("made by the first host\n", "/work/note.txt");
    const std::string descriptor = box.serialize();
    const auto parsed = boost::json::parse(descriptor).as_object();
    CHECK(parsed.at("format") == "sbx.descriptor/1");
    CHECK(parsed.at("provider").as_string() == provider().provider_id().c_str());
    CHECK(parsed.at("sandbox_id").as_string() == box.id().c_str());

    // A second host (another process would do the same): a working handle, with the workdir.
    sbx::Host::Options options;
    if (const char* config = env("SBX_CONFORMANCE_CONFIG")) {
      options.config = sbx::Config::load(config);
    }
    if (const char* dir = env("SBX_CONFORMANCE_PLUGIN_DIR")) options.plugin_dirs.push_back(dir);
    sbx::Host second(std::move(options));
    sbx::Sandbox again = second.provider(env("SBX_CONFORMANCE_PROVIDER")).connect(descriptor);
    CHECK(again.id() == box.id());
    // A relative path: the connected handle runs in the sandbox's workdir.
    CHECK(again.exec("cat note.txt").stdout_text == "made by the first host\n");
    CHECK(again.exec("echo $CONFORMANCE_ENV").stdout_text == "kept\n");
    again.close();  // closed there: the first handle's work now fails as for a sandbox that is gone
    box.detach();

    // A descriptor of a sandbox that is gone, of another provider, or that is damaged.
    CHECK_THROWS_AS(provider().connect(descriptor), sbx::NotFoundError);
    boost::json::object other = parsed;
    other["provider"] = "some_other_provider";
    CHECK_THROWS_AS(provider().connect(boost::json::serialize(other)), sbx::InvalidArgumentError);
    CHECK_THROWS_AS(provider().connect(descriptor.substr(0, descriptor.size() / 2)),
                    sbx::InvalidArgumentError);
  }

  TEST_CASE("a sandbox that is gone: every call is NotFoundError, status is stopped") {
    if (!provider().supports("sbx.connect/1")) {
      MESSAGE("needs sbx.connect/1 for a second handle; nothing to check");
      return;
    }
    sbx::Sandbox box = provider().create(base_spec());
    sbx::Sandbox other = provider().connect(box.serialize());
    other.close();  // behind the first handle's back: the host's closed check does not apply
    CHECK_FALSE(box.closed());
    CHECK_THROWS_AS(box.exec("echo no"), sbx::NotFoundError);
    CHECK_THROWS_AS(box.upload_bytes("x", "/work/x"), sbx::NotFoundError);
    CHECK_THROWS_AS(box.download_bytes("/work/x"), sbx::NotFoundError);
    CHECK(box.status() == sbx::SandboxStatus::stopped);
    CHECK_NOTHROW(box.close());  // closing what is gone is success
  }

  TEST_CASE("shared sandbox closes cleanly") {
    auto& box = shared_sandbox();
    box.close();
    CHECK(box.status() == sbx::SandboxStatus::stopped);
  }
}
