// Cases: startup files, upload and download (bytes, modes, odd names, what is not a file, paths
// that leave the sandbox, uploads that do not go through).

#include "suite.hpp"

#include <sbx/core/plugin_checks.hpp>

#include <sys/stat.h>

#include <chrono>
#include <fstream>

namespace sbx::conformance {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string all_bytes() {
  std::string s;
  for (int i = 0; i < 256; ++i)
    s.push_back(static_cast<char>(i));
  return s;
}

void write_local(const fs::path& path, const std::string& contents) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << contents;
  if (!out.flush()) throw std::runtime_error("cannot write " + path.string());
}

std::string read_local(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void startup_files(T& t) {
  auto spec = t.spec();
  spec.files = {{"/work/hello.txt", "hello startup\n"}, {"/work/deep/er/x.txt", "x"}};
  Sandbox box = t.create(spec);
  CHECK_EQ(box.exec("cat hello.txt").stdout_text, "hello startup\n",
           "the spec's startup file /work/hello.txt must be in place when create completes");
  CHECK_EQ(box.exec("cat deep/er/x.txt").stdout_text, "x",
           "a startup file in missing directories (/work/deep/er/x.txt) must be in place: "
           "create its parent directories");
}

void round_trip(T& t) {
  Sandbox box = t.create();
  const fs::path& tmp = t.tmp();
  const std::string binary = all_bytes() + all_bytes();
  write_local(tmp / "bin.dat", binary);
  write_local(tmp / "empty.dat", "");
  box.upload(tmp / "bin.dat", "/work/new/dir/bin.dat");
  box.upload(tmp / "empty.dat", "/work/empty.dat");
  CHECK_EQ(box.exec("wc -c < new/dir/bin.dat | tr -d ' '").stdout_text, "512\n",
           "an upload into missing directories must create them and write every byte (512)");
  CHECK_EQ(box.exec("wc -c < empty.dat | tr -d ' '").stdout_text, "0\n",
           "an empty upload must make an empty file");
  box.download("/work/new/dir/bin.dat", tmp / "out" / "bin.dat");
  box.download("/work/empty.dat", tmp / "out" / "empty.dat");
  CHECK(read_local(tmp / "out" / "bin.dat") == binary,
        "a download must give back the uploaded bytes exactly (all 256 byte values, twice)");
  CHECK((fs::exists(tmp / "out" / "empty.dat") && fs::file_size(tmp / "out" / "empty.dat") == 0),
        "downloading an empty file must make an empty local file");
  // A file the command wrote comes out as written; an upload replaces a file.
  box.exec("printf 'made inside' > made.txt");
  CHECK_EQ(box.download_bytes("/work/made.txt"), "made inside",
           "a download must give a file a command wrote as it wrote it");
  box.upload_bytes("replaced", "/work/made.txt");
  CHECK_EQ(box.download_bytes("/work/made.txt"), "replaced",
           "an upload over an existing file must replace its contents whole");
}

// A relative sandbox path is relative to the spec's workdir, for uploads and downloads as for
// exec's cwd (docs/sandbox-semantics.md).
void relative_paths(T& t) {
  Sandbox box = t.create();
  // (Commands name relative paths only: they run in the workdir, and host-process providers run
  // them on the host, where an absolute path is the host's.)
  box.upload_bytes("relative\n", "sub/rel.txt");
  CHECK_EQ(box.exec("cat sub/rel.txt").stdout_text, "relative\n",
           "an upload to the relative path sub/rel.txt must land under the workdir (/work)");
  CHECK_EQ(box.download_bytes("/work/sub/rel.txt"), "relative\n",
           "an upload to a relative path must be the file at workdir/path");
  box.exec("printf inside > sub/made.txt");
  CHECK_EQ(box.download_bytes("sub/made.txt"), "inside",
           "a download from the relative path sub/made.txt must read it under the workdir");
}

void modes(T& t) {
  Sandbox box = t.create();
  const fs::path& tmp = t.tmp();
  write_local(tmp / "run.sh", "#!/bin/sh\necho ran \"$1\"\n");
  ::chmod((tmp / "run.sh").c_str(), 0755);
  write_local(tmp / "secret.txt", "s");
  ::chmod((tmp / "secret.txt").c_str(), 0600);
  box.upload(tmp / "run.sh", "/work/bin/run.sh");
  box.upload(tmp / "secret.txt", "/work/secret.txt");
  box.upload_bytes("d", "/work/default.txt");
  const auto r = box.exec("./bin/run.sh arg");
  CHECK_EQ(r.return_code, 0,
           "an uploaded 0755 script must run: give the file sbx_upload_request.mode");
  CHECK_EQ(r.stdout_text, "ran arg\n", "an uploaded 0755 script must run and print its output");
  // The permission bits as `ls -l` shows them (busybox has no stat -c everywhere).
  CHECK_EQ(box.exec("ls -l bin/run.sh | cut -c1-10").stdout_text, "-rwxr-xr-x\n",
           "a file uploaded with mode 0755 must have exactly 0755 (not what a umask leaves)");
  CHECK_EQ(box.exec("ls -l secret.txt | cut -c1-10").stdout_text, "-rw-------\n",
           "a file uploaded with mode 0600 must have exactly 0600");
  CHECK_EQ(box.exec("ls -l default.txt | cut -c1-10").stdout_text, "-rw-r--r--\n",
           "an upload with mode 0 (upload_bytes) must get 0644");
}

void missing_download(T& t) {
  Sandbox box = t.create();
  const fs::path& tmp = t.tmp();
  CHECK_THROWS_AS(box.download("/work/does-not-exist.txt", tmp / "x.txt"), NotFoundError,
                  "downloading a file that does not exist must fail with NOT_FOUND");
  CHECK(!fs::exists(tmp / "x.txt"), "a failed download must leave no local file");
  CHECK(fs::is_empty(tmp), "a failed download must leave no temporary file either");
}

// A directory and a link are not files to download: an error naming the path, nothing local.
void not_a_file(T& t) {
  Sandbox box = t.create();
  const fs::path& tmp = t.tmp();
  REQUIRE(box.exec("mkdir -p dir/inner && echo in > dir/inner/f && echo target > target.txt && "
                   "ln -s target.txt link.txt && ln -s dir dirlink")
                  .return_code == 0,
          "the commands that make a directory and links (mkdir, ln -s) must succeed");
  for (const std::string path : {"/work/dir", "/work/link.txt", "/work/dirlink"}) {
    try {
      box.download(path, tmp / "got");
      t.fail("downloading " + path +
             " succeeded, but it is not a regular file: refuse a directory or a symbolic link "
             "with an error naming the path (e.g. INVALID_ARGUMENT)");
    } catch (const Error& e) {
      if (std::string(e.what()).find(path) == std::string::npos) {
        t.fail("the error for downloading " + path +
               " must name the path and say what it is; it said " + T::describe(e));
      }
    }
    CHECK(fs::is_empty(tmp),
          "a refused download of " + path + " must leave no local file, not even a temporary one");
  }
  CHECK_EQ(box.download_bytes("/work/target.txt"), "target\n",
           "a regular file must still download after refused ones");
}

// Spaces and non-ASCII (UTF-8) in names: upload, exec in such a cwd, download to such a path.
void odd_names(T& t) {
  Sandbox box = t.create();
  const fs::path& tmp = t.tmp();
  const std::string dir = "/work/dir with spaces/ünïcødé 目录";
  const std::string name = "fïlé — ñame.txt";
  write_local(tmp / "local in.txt", "odd\n");
  box.upload(tmp / "local in.txt", dir + "/" + name);
  box.upload_bytes("bytes\n", "/work/with space.txt");
  // (a shell glob, not ls: busybox ls shows non-ASCII bytes as '?')
  const auto r = box.exec("cat '" + name + "'; for f in *; do echo \"$f\"; done", {.cwd = dir});
  CHECK_EQ(r.return_code, 0,
           "an exec whose cwd has spaces and non-ASCII names must run there: pass paths as "
           "bytes, quoted, never split on spaces");
  CHECK_EQ(r.stdout_text, "odd\n" + name + "\n",
           "an upload to a path with spaces and non-ASCII (UTF-8) names must make that exact "
           "file");
  CHECK_EQ(box.exec("cat 'with space.txt'").stdout_text, "bytes\n",
           "an upload to /work/with space.txt must make that file");
  box.exec("printf made > 'made here ü.txt'", {.cwd = dir});
  const fs::path local = tmp / "out dir ü" / "gót it.txt";
  box.download(dir + "/made here ü.txt", local);
  CHECK_EQ(read_local(local), "made",
           "a download from a non-ASCII sandbox path to a local path with spaces must work");
  CHECK_EQ(box.download_bytes(dir + "/" + name), "odd\n",
           "a download from a path with spaces and non-ASCII names must read that file");
}

// A ".." that climbs above the sandbox's "/" is refused, not clamped at "/"; one that stays
// inside is resolved.
void dot_dot(T& t) {
  Sandbox box = t.create();
  const std::string fix =
      ": refuse a path whose '..' climbs above the sandbox's '/' with INVALID_ARGUMENT naming it, "
      "never clamp it at '/' (the SDK's resolve_sandbox_path, sbx/sdk/paths.hpp, does this)";
  for (const std::string path : {"/work/../../escape.txt", "../../escape.txt", "/../escape.txt"}) {
    try {
      box.upload_bytes("escaped\n", path);
      t.fail("an upload to " + path + " succeeded" + fix);
    } catch (const InvalidArgumentError& e) {
      CHECK(std::string(e.what()).find(path) != std::string::npos,
            "the refusal of " + path + " must name the path; it said " + T::describe(e));
    } catch (const Error& e) {
      t.fail("an upload to " + path + " failed with " + T::describe(e) + fix);
    }
    try {
      box.download_bytes(path);
      t.fail("a download from " + path + " succeeded" + fix);
    } catch (const InvalidArgumentError&) {
    } catch (const Error& e) {
      t.fail("a download from " + path + " failed with " + T::describe(e) + fix);
    }
  }
  CHECK_EQ(box.exec("test -e ../escape.txt; echo $?").stdout_text, "1\n",
           "a refused upload must write nothing: escape.txt appeared at the sandbox's '/'");
  // Inside, ".." is an ordinary step back.
  box.upload_bytes("inside\n", "/work/sub/../inside.txt");
  CHECK_EQ(box.exec("cat inside.txt").stdout_text, "inside\n",
           "an upload to /work/sub/../inside.txt must write /work/inside.txt: resolve '..' that "
           "stays inside the sandbox");
  CHECK_EQ(box.download_bytes("sub/../inside.txt"), "inside\n",
           "a download from sub/../inside.txt must read /work/inside.txt");
}

// After `what` to up/`name` failed: no file at the target at once, and none beside it (a
// temporary file) within 10 s: a backend may learn of the failure only as the connection closes.
void check_nothing_left(T& t, Sandbox& box, const std::string& name, const std::string& what) {
  CHECK_EQ(box.exec("test -e up/" + name + "; echo $?").stdout_text, "1\n",
           what +
               " must leave no file at its target: write a temporary file and rename it into "
               "place only once whole");
  std::string left;
  const bool cleaned = wait_until(
      [&] {
        left = box.exec("ls -A up").stdout_text;
        return left.empty();
      },
      10s);
  CHECK(cleaned, what +
                     " must leave no file beside its target either: remove the temporary "
                     "file when the upload fails (10 s later the directory held " +
                     T::show(left) + ")");
}

// An upload whose source fails part way, and one cancelled part way, leave no file: not the
// target, not a temporary file beside it.
void failed_upload(T& t) {
  Sandbox box = t.create();
  REQUIRE(box.exec("mkdir -p up").return_code == 0, "`mkdir -p up` must succeed");
  constexpr int64_t kSize = 4 << 20, kGiven = 1 << 20;
  {
    plugin_checks::FailingUpload upload(box, "/work/up/failed.bin", kSize, kGiven, false);
    CHECK_THROWS_AS(upload.operation().get(), Error,
                    "an upload whose source fails its read after 1 of 4 MiB (read returned -1) "
                    "must complete with an error");
  }
  check_nothing_left(t, box, "failed.bin", "a failed upload");
  {
    plugin_checks::FailingUpload upload(box, "/work/up/cancelled.bin", kSize, kGiven, true);
    if (!upload.held(30s)) {
      t.fail(
          "an upload of 4 MiB must read its source while it runs: it had not read 1 MiB and "
          "asked for more within 30 s" +
          std::string(upload.operation().ready() ? " (it had ended)" : ""));
      throw RequireFailed{};
    }
    upload.operation().cancel();
    upload.release();  // the source's read then fails, as a reader's read would once cancelled
    CHECK_THROWS_AS(upload.operation().get(), Error,
                    "an upload cancelled part way must complete with an error (CANCELLED)");
  }
  check_nothing_left(t, box, "cancelled.bin", "an upload cancelled part way");
  box.upload_bytes("whole\n", "/work/up/failed.bin");
  CHECK_EQ(box.download_bytes("/work/up/failed.bin"), "whole\n",
           "an upload after failed ones must work");
}

}  // namespace

void add_file_cases(std::vector<Case>& cases) {
  cases.push_back(
      {{"files.startup", "the spec's startup files are in place when create returns", ""},
       startup_files});
  cases.push_back({{"files.round-trip",
                    "upload and download keep binary and empty files exact; an upload replaces "
                    "a file",
                    ""},
                   round_trip});
  cases.push_back({{"files.modes",
                    "an uploaded file keeps its mode: 0755 runs, 0600 stays private, bytes get "
                    "0644",
                    ""},
                   modes});
  cases.push_back({{"files.relative",
                    "a relative upload or download path is relative to the spec's workdir", ""},
                   relative_paths});
  cases.push_back({{"files.missing",
                    "downloading a missing file is NotFoundError and leaves no local file", ""},
                   missing_download});
  cases.push_back({{"files.not-a-file",
                    "a directory or a link as a download source is an error naming it, and "
                    "leaves no local file",
                    ""},
                   not_a_file});
  cases.push_back({{"files.odd-names",
                    "paths with spaces and non-ASCII names: upload, exec in such a cwd, download "
                    "to such a local path",
                    ""},
                   odd_names});
  cases.push_back({{"files.dot-dot",
                    "a path whose '..' climbs above the sandbox's '/' is INVALID_ARGUMENT for "
                    "upload and download and writes nothing; a '..' inside is resolved",
                    ""},
                   dot_dot});
  cases.push_back({{"files.failed-upload",
                    "an upload whose source fails part way, or cancelled part way, is an error "
                    "and leaves no file, not even a temporary one",
                    ""},
                   failed_upload});
}

}  // namespace sbx::conformance
