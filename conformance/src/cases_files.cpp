// Cases: startup files, upload and download (bytes, modes, odd names, what is not a file).

#include "suite.hpp"

#include <sys/stat.h>

#include <fstream>

namespace sbx::conformance {
namespace {

namespace fs = std::filesystem;

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
  CHECK_EQ(box.exec("cat hello.txt").stdout_text, "hello startup\n");
  CHECK_EQ(box.exec("cat deep/er/x.txt").stdout_text, "x");
}

void round_trip(T& t) {
  Sandbox box = t.create();
  const fs::path& tmp = t.tmp();
  const std::string binary = all_bytes() + all_bytes();
  write_local(tmp / "bin.dat", binary);
  write_local(tmp / "empty.dat", "");
  box.upload(tmp / "bin.dat", "/work/new/dir/bin.dat");
  box.upload(tmp / "empty.dat", "/work/empty.dat");
  CHECK_EQ(box.exec("wc -c < new/dir/bin.dat | tr -d ' '").stdout_text, "512\n");
  CHECK_EQ(box.exec("wc -c < empty.dat | tr -d ' '").stdout_text, "0\n");
  box.download("/work/new/dir/bin.dat", tmp / "out" / "bin.dat");
  box.download("/work/empty.dat", tmp / "out" / "empty.dat");
  CHECK(read_local(tmp / "out" / "bin.dat") == binary);
  CHECK(fs::exists(tmp / "out" / "empty.dat"));
  CHECK(fs::exists(tmp / "out" / "empty.dat") && fs::file_size(tmp / "out" / "empty.dat") == 0);
  // A file the command wrote comes out as written; an upload replaces a file.
  box.exec("printf 'made inside' > made.txt");
  CHECK_EQ(box.download_bytes("/work/made.txt"), "made inside");
  box.upload_bytes("replaced", "/work/made.txt");
  CHECK_EQ(box.download_bytes("/work/made.txt"), "replaced");
}

// A relative sandbox path is relative to the spec's workdir, for uploads and downloads as for
// exec's cwd (docs/sandbox-semantics.md).
void relative_paths(T& t) {
  Sandbox box = t.create();
  // (Commands name relative paths only: they run in the workdir, and host-process providers run
  // them on the host, where an absolute path is the host's.)
  box.upload_bytes("relative\n", "sub/rel.txt");
  CHECK_EQ(box.exec("cat sub/rel.txt").stdout_text, "relative\n");
  CHECK_EQ(box.download_bytes("/work/sub/rel.txt"), "relative\n");
  box.exec("printf inside > sub/made.txt");
  CHECK_EQ(box.download_bytes("sub/made.txt"), "inside");
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
  CHECK_EQ(r.return_code, 0);
  CHECK_EQ(r.stdout_text, "ran arg\n");
  // The permission bits as `ls -l` shows them (busybox has no stat -c everywhere).
  CHECK_EQ(box.exec("ls -l bin/run.sh | cut -c1-10").stdout_text, "-rwxr-xr-x\n");
  CHECK_EQ(box.exec("ls -l secret.txt | cut -c1-10").stdout_text, "-rw-------\n");
  CHECK_EQ(box.exec("ls -l default.txt | cut -c1-10").stdout_text, "-rw-r--r--\n");
}

void missing_download(T& t) {
  Sandbox box = t.create();
  const fs::path& tmp = t.tmp();
  CHECK_THROWS_AS(box.download("/work/does-not-exist.txt", tmp / "x.txt"), NotFoundError);
  CHECK(!fs::exists(tmp / "x.txt"));
  CHECK(fs::is_empty(tmp));  // no partial temp file either
}

// A directory and a link are not files to download: an error naming the path, nothing local.
void not_a_file(T& t) {
  Sandbox box = t.create();
  const fs::path& tmp = t.tmp();
  REQUIRE(box.exec("mkdir -p dir/inner && echo in > dir/inner/f && echo target > target.txt && "
                   "ln -s target.txt link.txt && ln -s dir dirlink")
              .return_code == 0);
  for (const std::string path : {"/work/dir", "/work/link.txt", "/work/dirlink"}) {
    try {
      box.download(path, tmp / "got");
      t.fail("downloading " + path + " succeeded; it is not a regular file",
             std::source_location::current());
    } catch (const Error& e) {
      if (std::string(e.what()).find(path) == std::string::npos) {
        t.fail("the error for " + path + " does not name it: " + T::describe(e),
               std::source_location::current());
      }
    }
    CHECK(fs::is_empty(tmp));  // nothing local, not even a temporary file
  }
  CHECK_EQ(box.download_bytes("/work/target.txt"), "target\n");  // the sandbox is fine
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
  CHECK_EQ(r.return_code, 0);
  CHECK_EQ(r.stdout_text, "odd\n" + name + "\n");
  CHECK_EQ(box.exec("cat 'with space.txt'").stdout_text, "bytes\n");
  box.exec("printf made > 'made here ü.txt'", {.cwd = dir});
  const fs::path local = tmp / "out dir ü" / "gót it.txt";
  box.download(dir + "/made here ü.txt", local);
  CHECK_EQ(read_local(local), "made");
  CHECK_EQ(box.download_bytes(dir + "/" + name), "odd\n");
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
}

}  // namespace sbx::conformance
