// Small helpers shared by the test programs: temporary directories, whole-file reads and writes,
// and catching the error a call must throw.
#pragma once

#include <doctest/doctest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>

namespace sbx::testing {

// True in the ASan+UBSan and TSan builds, where every instruction and allocation costs several
// times more.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// The slack a wall-clock bound allows for work the test does not measure (starting a process,
// creating a container): `seconds` in a plain build, twice that under a sanitizer. The part of a
// bound that is the behaviour under test (a timeout, a grace period) is never scaled.
inline constexpr double slack(double seconds) {
  return kSanitized ? 2 * seconds : seconds;
}

// A fresh directory under the system temp directory, removed with its contents at scope exit.
struct TempDir {
  std::filesystem::path path;

  explicit TempDir(const std::string& prefix = "sbx-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_file(const std::filesystem::path& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

// Replaces `target` the way a deploy should: the new contents written beside it (`target`.new),
// then renamed over it, so a reader never sees half a file.
inline void replace_file(const std::filesystem::path& target, const std::string& contents) {
  const std::filesystem::path next = target.string() + ".new";
  write_file(next, contents);
  std::filesystem::rename(next, target);
}
inline void replace_file_with_copy(const std::filesystem::path& target,
                                   const std::filesystem::path& from) {
  const std::filesystem::path next = target.string() + ".new";
  std::filesystem::copy_file(from, next, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::rename(next, target);
}

// Polls `done` every 50 ms until it holds or `limit` passed; whether it held.
template <class Done>
bool eventually(Done done, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// Runs `fn`, which must throw an `E`, and returns that error (fails the test otherwise).
template <class E, class Fn>
E error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& error) {
    return error;
  }
  FAIL("expected an exception");
  throw std::logic_error("unreachable");
}

// A FIFO in a test's directory that test_processes' "hang_in"/"hang_fifo" config waits on: the
// plugin never returns until release(), which happens at the latest when the object goes. The test
// holds the FIFO's only writer; release() puts a regular file in its place (a plugin that opens it
// later reads its end at once), then closes the writer (one reading already sees its end).
struct Hang {
  std::filesystem::path fifo;
  int writer = -1;
  explicit Hang(const std::filesystem::path& dir) : fifo(dir / "hang.fifo") {
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    writer = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);  // never blocks (Linux)
    REQUIRE(writer >= 0);
  }
  ~Hang() { release(); }
  Hang(const Hang&) = delete;
  Hang& operator=(const Hang&) = delete;
  // Whether a plugin has reached its hang (it writes <fifo>.hanging first).
  bool reached() const { return std::filesystem::exists(fifo.string() + ".hanging"); }
  void release() {
    if (writer < 0) return;
    replace_file(fifo, "");
    ::close(writer);
    writer = -1;
  }
};

}  // namespace sbx::testing
