// local_docker file transfer: uploads and downloads through the archive API, refusals that leave
// no local file, and a 1 GiB round trip with bounded memory (run alone, as
// local_docker_big_file_test).

#include "../common/test_helpers.hpp"
#include "support.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
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
  CHECK_THROWS_AS(box.upload_bytes("x", "/work/keep"), sbx::Error);
  CHECK(box.exec("cat /work/keep/file").stdout_text == "inside\n");
  CHECK_THROWS_AS(box.upload_bytes("x", "/"), sbx::InvalidArgumentError);
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
  MESSAGE("peak RSS grew by ", (rss_after - rss_before) / 1024, " MiB for 2 GiB moved");
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
