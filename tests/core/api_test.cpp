// The sbx:: host API over the test_processes plugin: async completion, inline completion,
// cancellation, errors and exceptions from the plugin, RAII, and the seed's validation messages.

#include <doctest/doctest.h>

#include <sbx/sbx.hpp>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "../common/test_helpers.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A host whose provider "p" is test_processes with `config` (a JSON object), sandboxes under a
// private root directory so tests can see what is left behind.
struct Fixture {
  fs::path root;
  sbx::Host host;

  explicit Fixture(const std::string& config = "{}")
      : root(make_root()), host(options(config, root)) {}
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  sbx::Provider provider() { return host.provider("p"); }
  size_t sandboxes_on_disk() const {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(root), fs::directory_iterator()));
  }

 private:
  static fs::path make_root() {
    std::string pattern = (fs::temp_directory_path() / "sbx-api-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()));
    return pattern;
  }
  static sbx::Host::Options options(const std::string& config, const fs::path& root) {
    boost::json::object c = boost::json::parse(config).as_object();
    c["root"] = root.string();
    sbx::Host::Options o;
    o.config = sbx::Config::parse(R"({"providers": {"p": {"plugin": "test_processes", "config": )" +
                                  boost::json::serialize(c) + "}}}");
    o.plugin_dirs = {SBX_TEST_PLUGIN_DIR};
    o.use_default_plugin_dirs = false;
    return o;
  }
};

}  // namespace

TEST_CASE("create errors mirror the seed's: CreateError and CreateVerificationError") {
  Fixture failing(R"j({"fail_create": "no capacity (injected)"})j");
  CHECK_THROWS_WITH_AS(failing.provider().create({}), "no capacity (injected)", sbx::CreateError);

  Fixture probe(R"({"fail_probe": true})");
  try {
    probe.provider().create({});
    FAIL("expected CreateVerificationError");
  } catch (const sbx::CreateVerificationError& e) {
    const sbx::CreateError& as_create_error = e;  // a verification error is a create error
    CHECK(std::string(as_create_error.what()).find("readiness probe") != std::string::npos);
    CHECK(e.retryable());
  }
  CHECK(probe.sandboxes_on_disk() == 0);  // a failed create leaves nothing behind
}

TEST_CASE("an exception thrown inside the plugin arrives as an error, not a crash") {
  Fixture f(R"({"throw_in": "exec"})");
  sbx::Sandbox box = f.provider().create({});
  CHECK_THROWS_WITH_AS(box.exec("echo hi"), "test_processes: injected failure in exec",
                       sbx::InternalError);
  CHECK(box.status() == sbx::SandboxStatus::running);  // the sandbox is fine
  box.close();

  // Every failure of create is a CreateError (NeMo Gym's rule); the reason stays in status().
  Fixture c(R"({"throw_in": "create"})");
  const auto e = sbx::testing::error_of<sbx::CreateError>([&] { c.provider().create({}); });
  CHECK(e.status() == SBX_STATUS_INTERNAL);
  CHECK(std::string(e.what()) == "test_processes: injected failure in create");
}

TEST_CASE("operations may complete inside the start call") {
  Fixture f(R"({"complete_inline": true})");
  sbx::Sandbox box = f.provider().create({});
  auto status = box.status_async();
  CHECK(status.ready());  // completed before status_async returned
  CHECK(status.get() == sbx::SandboxStatus::running);
  auto closing = box.close_async();
  CHECK(closing.ready());
  closing.get();
  CHECK(f.sandboxes_on_disk() == 0);
}

TEST_CASE("completion arrives on a plugin thread; continuations run there") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({});
  std::promise<std::thread::id> continuation_thread;
  auto op = box.exec_async("sleep 0.2; echo async");
  op.then([&](sbx::Operation<sbx::ExecResult>& done) {
    CHECK(done.ready());
    continuation_thread.set_value(std::this_thread::get_id());
  });
  auto ran_on = continuation_thread.get_future();
  REQUIRE(ran_on.wait_for(10s) == std::future_status::ready);
  CHECK(ran_on.get() != std::this_thread::get_id());
  CHECK(op.get().stdout_text == "async\n");
  // then() on a finished operation runs at once, on the calling thread.
  bool immediate = false;
  op.then([&](sbx::Operation<sbx::ExecResult>&) { immediate = true; });
  CHECK(immediate);
}

TEST_CASE("cancelling a create stops it and leaves nothing behind") {
  Fixture f(R"({"create_delay_ms": 20000})");
  auto op = f.provider().create_async({});
  std::this_thread::sleep_for(100ms);
  const auto start = std::chrono::steady_clock::now();
  op.cancel();
  op.cancel();  // idempotent
  CHECK_THROWS_AS(op.get(), sbx::CancelledError);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(f.sandboxes_on_disk() == 0);
}

TEST_CASE("a cancelled exec kills the command's processes, children included") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({.workdir = "/w"});
  auto op = box.exec_async("(sleep 1; touch survived) & sleep 30");
  std::this_thread::sleep_for(300ms);
  op.cancel();
  CHECK_THROWS_AS(op.get(), sbx::CancelledError);
  std::this_thread::sleep_for(1500ms);  // the background child would have touched the file by now
  CHECK(box.exec("ls").stdout_text.find("survived") == std::string::npos);
}

TEST_CASE("a Sandbox going out of scope closes it") {
  Fixture f;
  {
    sbx::Sandbox box = f.provider().create({});
    CHECK(f.sandboxes_on_disk() == 1);
  }
  CHECK(f.sandboxes_on_disk() == 0);
  sbx::Sandbox kept = f.provider().create({});
  kept.detach();  // detached: not closed
  CHECK(f.sandboxes_on_disk() == 1);
}

TEST_CASE("a sandbox outlives the Host and Provider objects it came from") {
  std::optional<sbx::Sandbox> box;
  {
    sbx::Host host(
        sbx::Host::Options{.plugin_dirs = {SBX_TEST_PLUGIN_DIR}, .use_default_plugin_dirs = false});
    box = host.provider("test_processes").create({});
  }  // the host, its provider cache and the Provider handle are gone; the plugin stays loaded
  CHECK(box->exec("echo still").stdout_text == "still\n");
  box->close();
}

TEST_CASE("a failed download leaves no file, not even a partial one") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({.workdir = "/w"});
  box.exec("mkdir adir");
  const fs::path out = f.root.parent_path() / ("sbx-api-out-" + box.id());
  fs::create_directories(out);
  CHECK_THROWS_AS(box.download("/w/adir", out / "x"), sbx::InvalidArgumentError);
  CHECK_THROWS_AS(box.download("/w/missing", out / "y"), sbx::NotFoundError);
  CHECK(fs::is_empty(out));
  fs::remove_all(out);
}

TEST_CASE("a full disk during a download is reported as such, with nothing left behind") {
  // A 64 KiB file system to fill: mounting one needs root, which the test scripts have.
  REQUIRE_MESSAGE(::geteuid() == 0, "this test mounts a small tmpfs and needs root");
  Fixture f;
  sbx::Sandbox box = f.provider().create({});
  box.upload_bytes(std::string(1024 * 1024, 'x'), "/big");
  sbx::testing::TempDir small("sbx-full");
  REQUIRE(::mount("tmpfs", small.path.c_str(), "tmpfs", 0, "size=64k") == 0);
  struct Unmount {
    const fs::path& path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{small.path};
  const auto e = sbx::testing::error_of<sbx::ResourceExhaustedError>(
      [&] { box.download("/big", small.path / "deep" / "big"); });
  CHECK(std::string(e.what()).find("No space left on device") != std::string::npos);
  CHECK(e.local_errno() == ENOSPC);
  CHECK(fs::is_empty(small.path));  // no temporary file, and not the directory it made
}

namespace {

mode_t type_of(const fs::path& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & S_IFMT;
}

bool has_text(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A FIFO in `dir` with a reader thread that collects what arrives. The test holds a write end of
// its own (`keep`) until finish(): the reader sees the end of the data only then, so it never
// waits for a writer that does not come, and never stops before one wrote.
struct FifoReader {
  fs::path path;
  int read_fd = -1;
  int keep = -1;
  size_t read_limit;  // the reader closes its end after this many bytes
  std::string received;
  std::thread thread;

  FifoReader(const fs::path& dir, size_t limit = SIZE_MAX) : path(dir / "fifo"), read_limit(limit) {
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    read_fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // no writer needed
    REQUIRE(read_fd >= 0);
    keep = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);  // a reader exists: does not wait
    REQUIRE(keep >= 0);
    REQUIRE(::fcntl(read_fd, F_SETFL, 0) == 0);  // blocking reads from here on
    thread = std::thread([this] {
      char buffer[4096];
      while (received.size() < read_limit) {
        const ssize_t n =
            ::read(read_fd, buffer, std::min(sizeof buffer, read_limit - received.size()));
        if (n <= 0) break;
        received.append(buffer, static_cast<size_t>(n));
      }
      ::close(read_fd);
    });
  }
  // Lets the reader see the end, and waits for it: what it received.
  const std::string& finish() {
    if (keep >= 0) ::close(std::exchange(keep, -1));
    if (thread.joinable()) thread.join();
    return received;
  }
  ~FifoReader() { finish(); }
};

}  // namespace

TEST_CASE("a download to a symbolic link replaces the file it leads to; the link stays") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({});
  box.upload_bytes("new contents", "/f");
  sbx::testing::TempDir dir("sbx-download-link");

  SUBCASE("a link to a regular file: that file is replaced") {
    sbx::testing::write_file(dir.path / "real", "old");
    fs::create_symlink("real", dir.path / "link");
    box.download("/f", dir.path / "link");
    CHECK(type_of(dir.path / "link") == S_IFLNK);
    CHECK(fs::read_symlink(dir.path / "link") == "real");
    CHECK(sbx::testing::read_file(dir.path / "real") == "new contents");
  }
  SUBCASE("a chain of links to a missing file in an existing directory: that file is made") {
    fs::create_directory(dir.path / "sub");
    fs::create_symlink(dir.path / "sub" / "made", dir.path / "second");
    fs::create_symlink("second", dir.path / "link");
    box.download("/f", dir.path / "link");
    CHECK(type_of(dir.path / "link") == S_IFLNK);
    CHECK(type_of(dir.path / "second") == S_IFLNK);
    CHECK(sbx::testing::read_file(dir.path / "sub" / "made") == "new contents");
  }
  SUBCASE("a dangling link whose target's directory does not exist is an error naming it") {
    fs::create_symlink("nodir/x", dir.path / "link");
    const auto e = sbx::testing::error_of<sbx::InvalidArgumentError>(
        [&] { box.download("/f", dir.path / "link"); });
    CHECK_MESSAGE(has_text(e.what(), (dir.path / "link").string()), e.what());
    CHECK_MESSAGE(has_text(e.what(), "whose directory does not exist"), e.what());
    CHECK(type_of(dir.path / "link") == S_IFLNK);
    CHECK_FALSE(fs::exists(dir.path / "nodir"));
  }
  // Nothing else is left beside the files: no temporary file.
  for (const auto& entry : fs::directory_iterator(dir.path))
    CHECK_MESSAGE(!has_text(entry.path().filename().string(), "sbx-partial"), entry.path());
}

TEST_CASE("a download to a FIFO is written into it: no temporary file, no rename") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({});
  std::string contents(1024 * 1024 + 7, '\0');  // larger than a pipe's buffer: writes block
  for (size_t i = 0; i < contents.size(); ++i)
    contents[i] = static_cast<char>('a' + i % 26);
  box.upload_bytes(contents, "/big");
  sbx::testing::TempDir dir("sbx-download-fifo");

  SUBCASE("a reader gets every byte") {
    FifoReader reader(dir.path);
    box.download("/big", reader.path);
    CHECK(reader.finish() == contents);
    CHECK(type_of(reader.path) == S_IFIFO);
  }
  SUBCASE("a reader that goes away fails the download (EPIPE), and the host lives on") {
    FifoReader reader(dir.path, 10);
    const auto e = sbx::testing::error_of<sbx::Error>([&] { box.download("/big", reader.path); });
    CHECK(e.local_errno() == EPIPE);
    CHECK_MESSAGE(has_text(e.what(), reader.path.string()), e.what());
    CHECK(reader.finish() == contents.substr(0, 10));
    CHECK(type_of(reader.path) == S_IFIFO);
    CHECK(box.exec("echo alive").stdout_text == "alive\n");
  }
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE(
    "a download into a FIFO whose reader stalls is abandoned at the idle deadline; the "
    "plugin's thread is not left blocked") {
  sbx::testing::TempDir dir("sbx-download-stall");
  sbx::Host::Options options;
  options.config = sbx::Config::parse(
      R"({"providers": {"p": {"plugin": "test_processes", "config": {"root": ")" +
      dir.path.string() + R"("}}}})");
  options.plugin_dirs = {SBX_TEST_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  options.deadlines.transfer_idle_s = 0.5;
  options.deadlines.cancel_grace_s = 0.3;
  sbx::Host host(std::move(options));
  sbx::Sandbox box = host.provider("p").create({});
  box.upload_bytes(std::string(1024 * 1024, 'x'), "/big");
  const fs::path fifo = dir.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // never reads
  REQUIRE(reader >= 0);
  const auto e = sbx::testing::error_of<sbx::TimeoutError>([&] { box.download("/big", fifo); });
  CHECK_MESSAGE(has_text(e.what(), "the host abandoned it"), e.what());
  ::close(reader);
  // The write that waited for room was woken: the plugin works on (its download threads too).
  CHECK(box.exec("echo alive").stdout_text == "alive\n");
  CHECK(box.download_bytes("/big").size() == 1024 * 1024);
  CHECK(type_of(fifo) == S_IFIFO);
}

TEST_CASE("download_to_async streams a file: its size first, its bytes in order, nothing kept") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({});
  std::string contents(8 * 1024 * 1024 + 3, '\0');
  for (size_t i = 0; i < contents.size(); ++i)
    contents[i] = static_cast<char>('a' + i % 26);
  box.upload_bytes(contents, "/big");

  SUBCASE("size, then every byte") {
    std::optional<uint64_t> size;
    std::string got;
    bool size_first = true;
    box.download_to_async("/big", {.on_size = [&](uint64_t n) { size = n; },
                                   .on_data =
                                       [&](std::string_view bytes) {
                                         size_first = size_first && size.has_value();
                                         got += bytes;
                                         return true;
                                       }})
        .get();
    CHECK(size == contents.size());
    CHECK(size_first);
    CHECK(got == contents);
  }
  SUBCASE("held, it stops within the slack; released, it ends") {
    std::mutex mutex;
    uint64_t got = 0;
    auto op = box.download_to_async("/big", {.on_data = [&](std::string_view bytes) {
                                      std::lock_guard lock(mutex);
                                      got += bytes.size();
                                      return true;
                                    }});
    REQUIRE(op.hold_output(true));
    // Whatever was read before the hold may still come (at most SBX_FLOW_SLACK): then nothing.
    std::this_thread::sleep_for(300ms);
    {
      std::lock_guard lock(mutex);
      CHECK(got <= 1024 * 1024 + 65536);
    }
    CHECK_FALSE(op.ready());
    REQUIRE(op.hold_output(false));
    op.get();
    CHECK(got == contents.size());
  }
  SUBCASE("a sink that says stop cancels it") {
    auto op = box.download_to_async("/big", {.on_data = [](std::string_view) { return false; }});
    CHECK_THROWS_AS(op.get(), sbx::CancelledError);
  }
  CHECK_THROWS_AS(box.download_to_async("/big", {}), sbx::InvalidArgumentError);
  CHECK_THROWS_AS(
      box.download_to_async("/missing", {.on_data = [](std::string_view) { return true; }}).get(),
      sbx::NotFoundError);
}

TEST_CASE("a download to a character device is written into it; its failure is reported") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({});
  box.upload_bytes(std::string(200000, 'x'), "/f");
  box.download("/f", "/dev/null");
  CHECK(type_of("/dev/null") == S_IFCHR);
  const auto e =
      sbx::testing::error_of<sbx::ResourceExhaustedError>([&] { box.download("/f", "/dev/full"); });
  CHECK(e.local_errno() == ENOSPC);
  CHECK_MESSAGE(has_text(e.what(), "/dev/full"), e.what());
  CHECK(type_of("/dev/full") == S_IFCHR);
}

TEST_CASE(
    "a directory, a socket or a block device as a download target is refused before the "
    "download starts") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({});
  sbx::testing::TempDir dir("sbx-download-refused");
  const auto refused = [&](const fs::path& target, const std::string& what) {
    // The remote file does not exist: a download that started would be NotFoundError.
    const auto e = sbx::testing::error_of<sbx::InvalidArgumentError>(
        [&] { box.download("/missing", target); });
    CHECK_MESSAGE(has_text(e.what(), "cannot download to " + target.string() + ": " + what),
                  e.what());
    CHECK(e.local_errno() != 0);
  };

  fs::create_directory(dir.path / "adir");
  refused(dir.path / "adir", "it is a directory");
  CHECK(fs::is_empty(dir.path / "adir"));

  const fs::path socket_path = dir.path / "sock";
  const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(sock >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  REQUIRE(socket_path.string().size() < sizeof address.sun_path);
  std::strcpy(address.sun_path, socket_path.c_str());
  REQUIRE(::bind(sock, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  refused(socket_path, "it is a socket");
  CHECK(type_of(socket_path) == S_IFSOCK);
  ::close(sock);

  // A block device node of its own (never opened): making one needs root, as the test scripts are.
  REQUIRE_MESSAGE(::geteuid() == 0, "this test makes a block device node and needs root");
  const fs::path block = dir.path / "block";
  REQUIRE(::mknod(block.c_str(), S_IFBLK | 0600, makedev(7, 0)) == 0);
  refused(block, "it is a block device");
  CHECK(type_of(block) == S_IFBLK);
  // Through a link too.
  fs::create_symlink(block, dir.path / "to-block");
  refused(dir.path / "to-block", "it is a block device");
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 4);
}

TEST_CASE("an upload source that changes size during the upload fails it with the reason") {
  Fixture f(R"({"upload_delay_ms": 300})");  // the plugin starts reading 300 ms after the start
  sbx::Sandbox box = f.provider().create({});
  sbx::testing::TempDir dir("sbx-resize");
  const fs::path file = dir.path / "f";

  sbx::testing::write_file(file, std::string(200000, 'a'));
  auto shrinks = box.upload_async(file, "/f");  // the size is taken now...
  REQUIRE(::truncate(file.c_str(), 10) == 0);   // ...and the file shrinks before it is read
  auto e = sbx::testing::error_of<sbx::FailedPreconditionError>([&] { shrinks.get(); });
  CHECK(std::string(e.what()).find("changed during the upload: it ended after 10 of the 200000 "
                                   "bytes") != std::string::npos);

  sbx::testing::write_file(file, "short");
  auto grows = box.upload_async(file, "/f");
  sbx::testing::write_file(file, "much longer now");
  e = sbx::testing::error_of<sbx::FailedPreconditionError>([&] { grows.get(); });
  CHECK(std::string(e.what()).find("it grew past the 5 bytes") != std::string::npos);
  CHECK(box.exec("ls").stdout_text.empty());  // nothing was written in the sandbox
}

TEST_CASE("pause and resume (sbx.pause/1): paused refuses work at once, resumed works again") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({.workdir = "/w"});
  auto sleeper = box.exec_async("sleep 0.3; echo woke");
  std::this_thread::sleep_for(100ms);  // it runs
  box.pause();
  CHECK(box.status() == sbx::SandboxStatus::paused);
  CHECK_THROWS_WITH_AS(box.exec("true"), doctest::Contains("is paused; resume it first"),
                       sbx::FailedPreconditionError);
  std::this_thread::sleep_for(600ms);
  CHECK_FALSE(sleeper.ready());  // its processes are stopped, not running on
  box.resume();
  CHECK(sleeper.get().stdout_text == "woke\n");
  CHECK(box.status() == sbx::SandboxStatus::running);
}

TEST_CASE("serialize and connect (sbx.connect/1): a second host reaches the same sandbox") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({.workdir = "/w", .env = {{"K", "v"}}, .ports = {8000}});
  box.upload_bytes("hello", "/w/f");
  const std::string descriptor = box.serialize();
  // Another host, with its own provider instance (of the same root).
  sbx::Host::Options options;
  options.config = sbx::Config::parse(
      R"({"providers": {"p": {"plugin": "test_processes", "config": {"root": ")" + f.root.string() +
      R"("}}}})");
  options.plugin_dirs = {SBX_TEST_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  sbx::Host second(std::move(options));
  sbx::Sandbox again = second.provider("p").connect(descriptor);
  CHECK(again.id() == box.id());
  CHECK(again.exec("cat f; echo $K").stdout_text == "hellov\n");  // workdir and env came along
  CHECK_THROWS_WITH_AS(again.endpoint(9000), doctest::Contains("declared ports: [8000]"),
                       sbx::InvalidArgumentError);  // the declared ports came along too
  again.close();
  CHECK_THROWS_AS(box.exec("true"), sbx::NotFoundError);  // gone, behind this handle's back
  CHECK(box.status() == sbx::SandboxStatus::stopped);
  box.close();
  CHECK_THROWS_AS(f.provider().connect(descriptor), sbx::NotFoundError);
  CHECK_THROWS_WITH_AS(f.provider().connect("{\"sandbox_id\": 1}"),
                       "the descriptor has no \"sandbox_id\"", sbx::InvalidArgumentError);
  CHECK_THROWS_AS(f.provider().connect("not json"), sbx::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(
      f.provider().connect(R"({"provider": "local_docker", "sandbox_id": "x"})"),
      doctest::Contains("is of provider \"local_docker\", not of 'test_processes'"),
      sbx::InvalidArgumentError);
}

TEST_CASE("an empty Sandbox says it has not been started") {
  sbx::Sandbox empty;
  CHECK_THROWS_WITH_AS(empty.exec("true"), "Sandbox has not been started",
                       sbx::FailedPreconditionError);
  CHECK_THROWS_WITH_AS(empty.id(), "Sandbox has not been started", sbx::FailedPreconditionError);
  CHECK_THROWS_AS(empty.upload_bytes("x", "/x"), sbx::FailedPreconditionError);
  CHECK_THROWS_AS(empty.pause(), sbx::FailedPreconditionError);
  CHECK_THROWS_AS(empty.serialize(), sbx::FailedPreconditionError);
  CHECK(empty.status() == sbx::SandboxStatus::unknown);
  CHECK_NOTHROW(empty.close());
  Fixture f;
  sbx::Sandbox box = f.provider().create({});
  sbx::Sandbox moved = std::move(box);
  CHECK_THROWS_WITH_AS(box.exec("true"), "Sandbox has not been started",
                       sbx::FailedPreconditionError);
  moved.detach();
  CHECK_THROWS_WITH_AS(moved.exec("true"), "Sandbox has not been started",
                       sbx::FailedPreconditionError);
}

TEST_CASE("every failure of create is a CreateError with its reason") {
  Fixture failing(R"json({"fail_create": "no capacity (injected)"})json");
  auto e = sbx::testing::error_of<sbx::CreateError>([&] { failing.provider().create({}); });
  CHECK(e.status() == SBX_STATUS_CREATE_FAILED);
  Fixture probe(R"({"fail_probe": true})");
  CHECK_THROWS_AS(probe.provider().create({}), sbx::CreateVerificationError);
  // A spec the host refuses is not a create failure, and neither is a cancelled create.
  Fixture f(R"({"create_delay_ms": 5000})");
  CHECK_THROWS_AS(f.provider().create({.ttl_s = -1}), sbx::InvalidArgumentError);
  auto op = f.provider().create_async({});
  op.cancel();
  CHECK_THROWS_AS(op.get(), sbx::CancelledError);
}

TEST_CASE(
    "an error's reason (ABI 1.2): read only from a writer that has it, and only if matchable") {
  sbx_error e{};
  e.struct_size = sizeof e;
  e.status = SBX_STATUS_CREATE_FAILED;
  e.message = {"pull failed", 11};
  e.reason = {SBX_REASON_IMAGE_PULL_FAILED, std::strlen(SBX_REASON_IMAGE_PULL_FAILED)};
  CHECK(sbx::to_error(e).reason() == "image_pull_failed");
  // It survives the rethrow as the status's subclass.
  const auto thrown = sbx::testing::error_of<sbx::CreateError>([&] { sbx::throw_error(e); });
  CHECK(thrown.reason() == "image_pull_failed");
  // A 1.1 writer's struct ends before `reason`: whatever lies beyond is not read.
  e.struct_size = offsetof(sbx_error, reason);
  CHECK(sbx::to_error(e).reason().empty());
  e.struct_size = sizeof e;
  for (const std::string& bad : {std::string("has space"), std::string("new\nline"),
                                 std::string(129, 'a'), std::string("caf\xc3\xa9")}) {
    e.reason = {bad.data(), bad.size()};
    CHECK(sbx::to_error(e).reason().empty());
  }
  const std::string backend = "DOCKER::SANDBOX_NOT_FOUND";
  e.reason = {backend.data(), backend.size()};
  CHECK(sbx::to_error(e).reason() == backend);
}

TEST_CASE("bad local inputs are clear errors") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({});
  CHECK_THROWS_AS(box.upload("/nonexistent/file", "/x"), sbx::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(box.exec("true", {.timeout_s = -1}), "exec timeout_s must be > 0, got -1",
                       sbx::InvalidArgumentError);
}

TEST_CASE("endpoint checks the port, then the declaration, then the capability") {
  Fixture f;
  sbx::Sandbox box = f.provider().create({.ports = {8000}});
  CHECK_THROWS_WITH_AS(box.endpoint(70000),
                       "Sandbox endpoint port must be between 1 and 65535, got 70000",
                       sbx::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(box.endpoint(9000),
                       "Sandbox port 9000 was not declared in SandboxSpec.ports; declared ports: "
                       "[8000]",
                       sbx::InvalidArgumentError);
  CHECK_THROWS_AS(box.endpoint(8000), sbx::UnimplementedError);
  CHECK_FALSE(f.provider().supports("sbx.endpoint/1"));
}

TEST_CASE("spec validation uses the seed's messages") {
  sbx::SandboxSpec spec;
  spec.ports = {65536};
  CHECK_THROWS_WITH_AS(spec.validate(), "Sandbox TCP port must be between 1 and 65535, got 65536",
                       sbx::InvalidArgumentError);
  spec.ports = {22, 22};
  CHECK_THROWS_WITH_AS(spec.validate(), "Duplicate sandbox TCP port: 22",
                       sbx::InvalidArgumentError);
  spec.ports = {};
  spec.ready_timeout_s = -5;
  CHECK_THROWS_WITH_AS(spec.validate(), "Sandbox ready_timeout_s must be > 0, got -5",
                       sbx::InvalidArgumentError);
  spec.ready_timeout_s = {};
  spec.resources.memory_mib = -1;
  CHECK_THROWS_AS(spec.validate(), sbx::InvalidArgumentError);
}

TEST_CASE("SandboxSpec and Resources from JSON follow from_mapping") {
  const auto spec = sbx::SandboxSpec::from_json(boost::json::parse(R"({
    "image": "img", "ttl_s": 60, "ports": [8000, "9222"],
    "resources": {"cpu": "0.5", "memory_mib": "4096", "disk_gib": 8},
    "env": {"A": "1"}, "files": {"/x": "y"}})"));
  CHECK(*spec.image == "img");
  CHECK(spec.ports == std::vector<int64_t>{8000, 9222});
  CHECK(*spec.resources.cpu == doctest::Approx(0.5));
  CHECK(*spec.resources.memory_mib == 4096);
  CHECK(*spec.resources.disk_gib == 8);
  CHECK_THROWS_WITH_AS(sbx::Resources::from_json(boost::json::parse(R"({"cpus": 1, "gpu": 1})")),
                       "Unknown sandbox resource keys: ['cpus']. Expected keys: ['cpu', "
                       "'disk_gib', 'gpu', 'gpu_type', 'memory_mib']",
                       sbx::InvalidArgumentError);
  CHECK_THROWS_AS(sbx::Resources::from_json(boost::json::parse(R"({"memory_mib": "4096.5"})")),
                  sbx::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(sbx::SandboxSpec::from_json(boost::json::parse(R"({"ports": [8000.5]})")),
                       "Invalid sandbox TCP port: 8000.5", sbx::InvalidArgumentError);
  CHECK_THROWS_AS(sbx::SandboxSpec::from_json(boost::json::parse(R"({"imgae": "x"})")),
                  sbx::InvalidArgumentError);
}

TEST_CASE("plugin log lines are routed into the host's spdlog loggers") {
  // The host's loggers are children of "sbx" and share its sinks; attach one that records lines.
  // It lives as long as the process: the provider's logger holds it too and is destroyed later, on
  // the host's janitor thread.
  static const auto& records = *new std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt>(
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64));
  sbx::Host host(sbx::Host::Options{
      .config =
          sbx::Config::parse(R"({"providers": {"log_routing": {"plugin": "test_processes"}}})"),
      .plugin_dirs = {SBX_TEST_PLUGIN_DIR},
      .use_default_plugin_dirs = false});
  auto base = spdlog::get("sbx");
  if (!base) {
    host.plugins();  // loading plugins creates the host's logger
    base = spdlog::get("sbx");
  }
  REQUIRE(base);
  base->sinks().push_back(records);
  base->set_level(spdlog::level::debug);
  sbx::Sandbox box = host.provider("log_routing").create({});
  box.close();
  base->sinks().pop_back();
  base->set_level(spdlog::level::info);
  bool found = false;
  for (const auto& line : records->last_formatted()) {
    if (line.find("[provider.log_routing]") != std::string::npos &&
        line.find("created sandbox " + box.id()) != std::string::npos) {
      found = true;
    }
  }
  CHECK(found);
}
