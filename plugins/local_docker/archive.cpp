#include "archive.hpp"

#include "exec.hpp"

#include <sbx/sdk/paths.hpp>
#include <sbx/sdk/tar.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

namespace sbx::local_docker {
namespace {

namespace tar = sdk::tar;

constexpr size_t kChunk = 64 * 1024;

// An upload streams into a temporary sibling of its target and is renamed over it only once the
// daemon has the whole file: Docker extracts as the bytes arrive and deletes the old file first, so
// writing the target directly would leave a truncated file after any failure.
constexpr std::string_view kPartialMarker = ".sbx-partial-";
// Of the target's name, this much goes into the temporary name, which must stay within NAME_MAX
// (255): "." + 200 + marker + 16 hex digits.
constexpr size_t kNameKept = 200;
// Bounds on the two execs that finish an upload. The rename is one rename(2); the cleanup is best
// effort and must not hold up the error it follows.
constexpr auto kCommitTimeout = std::chrono::seconds(60);
constexpr auto kCleanupTimeout = std::chrono::seconds(10);
// The commit script's exit code when the target is a directory.
constexpr int32_t kTargetIsDirectory = 99;

// $1 is the complete temporary file, $2 the target (passed as arguments, never spliced into the
// script). mv onto a directory would move the file INTO it, so a directory is refused; a link to
// one is removed first, as the archive API always replaced links rather than following them.
// Whatever fails, the temporary file goes with it. Only sh, test, rm and mv: busybox has them.
// "99" is kTargetIsDirectory.
constexpr std::string_view kCommitScript =
    "if [ -d \"$2\" ]; then\n"
    "  if [ ! -L \"$2\" ]; then rm -f -- \"$1\"; exit 99; fi\n"
    "  rm -f -- \"$2\" || { rc=$?; rm -f -- \"$1\"; exit $rc; }\n"
    "fi\n"
    "mv -f -- \"$1\" \"$2\" || { rc=$?; rm -f -- \"$1\"; exit $rc; }\n";

int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Extracting at `at` ("/" for startup files) lets the daemon create the missing directories below
// it. noOverwriteDirNonDir: a file must never replace a directory (Docker would otherwise delete
// the directory tree).
std::string archive_target(const std::string& container, const std::string& at = "/") {
  return "/containers/" + container + "/archive?path=" + http::url_encode(at) +
         "&noOverwriteDirNonDir=true";
}

void check_upload_response(const http::Response& response, const std::string& container,
                           const std::string& what) {
  if (response.status >= 400) {
    throw api_error(response.status, response.body, what + " in sandbox " + container);
  }
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Whether `path` exists in the container: HEAD .../archive is a stat, no body either way.
bool exists_in(DockerApi& api, const std::string& container, const std::string& path,
               const sdk::CancelToken& cancel) {
  http::Request request;
  request.method = "HEAD";
  request.target = "/containers/" + container + "/archive?path=" + http::url_encode(path);
  const http::Response response = api.send(std::move(request), cancel);
  // 500: the stat failed for another reason, e.g. a file on the way ("/file/dir"), which a HEAD
  // answer has no body to tell. Looking further up finds that file, and the upload's error says
  // what it is; anything else the daemon refused the same way is reported by the upload itself.
  if (response.status == 404 || response.status == 500) return false;
  if (response.status >= 400) {
    throw api_error(response.status, response.body,
                    "looking up " + path + " in sandbox " + container);
  }
  return true;
}

// The nearest existing directory at or above `dir`: the archive is extracted there, and the daemon
// creates what is missing below it. Asking first, rather than trying and falling back on a 404,
// because the source is a stream that cannot be read twice. Extracting at "/" (which would also
// create the parents) is refused outright with a read-only root file system, even when the file
// goes into a writable volume; extracting inside the volume is not.
std::string extraction_point(DockerApi& api, const std::string& container, std::string dir,
                             const sdk::CancelToken& cancel) {
  while (dir != "/" && !exists_in(api, container, dir, cancel))
    dir = parent_of(dir);
  return dir;
}

// The daemon's refusals of an extraction that it makes before writing anything. They come as 500s
// that no retry can fix, told apart by their message.
enum class Refusal { none, read_only, not_a_directory };

Refusal refusal_of(const http::Response& response) {
  if (response.status != 500) return Refusal::none;
  const std::string message = docker_message(response.body);
  // "container rootfs is marked read-only", "mounted volume is marked read-only"
  if (message.find("read-only") != std::string::npos) return Refusal::read_only;
  if (message.find("extraction point is not a directory") != std::string::npos) {
    return Refusal::not_a_directory;
  }
  return Refusal::none;
}

// Why Docker refused an upload extracted at `at`: a read-only file system there is
// FAILED_PRECONDITION and a parent that is a file INVALID_ARGUMENT, both naming the path.
sdk::Error upload_error(const http::Response& response, const std::string& container,
                        const std::string& path, const std::string& at) {
  const std::string what = "cannot upload " + path + " into sandbox " + container + ": ";
  const sdk::ErrorDetails details{.retryable = false,
                                  .http_status = static_cast<int32_t>(response.status)};
  switch (refusal_of(response)) {
    case Refusal::read_only:
      return sdk::Error(SBX_STATUS_FAILED_PRECONDITION,
                        what + at + " is not writable (" + docker_message(response.body) +
                            "); with a read-only root file system only writable volumes take files",
                        details);
    case Refusal::not_a_directory:
      return sdk::Error(SBX_STATUS_INVALID_ARGUMENT, what + at + " is not a directory", details);
    case Refusal::none:
      break;
  }
  return api_error(response.status, response.body,
                   "uploading " + path + " into sandbox " + container);
}

// Removes the temporary file of a failed upload. Best effort: bounded, not cancellable (the
// upload's own token may be what failed it), and it never replaces the upload's error, so failures
// are only logged. Docker holds the container's lock while it extracts, so this exec starts only
// once the daemon has stopped writing the file, also when the stream was cut mid-way.
void remove_partial(DockerApi& api, const std::string& container, const std::string& temp,
                    const sdk::Logger& log) noexcept {
  try {
    ExecParams params;
    params.argv = {"sh", "-c", "rm -f -- \"$1\"", "sbx-upload-cleanup", temp};
    params.user = "0";  // the daemon extracted the file as root
    params.timeout = kCleanupTimeout;
    CollectingSink out;
    const sdk::ExitStatus status = run_exec(api, container, params, out, log, sdk::CancelToken());
    if (status.return_code != 0 || status.error_type) {
      log.warn("could not remove the partial upload ", temp, " in sandbox ", container, " (exit ",
               status.return_code, "): ", shorten(out.stderr_text));
    }
  } catch (const std::exception& e) {
    try {
      log.warn("could not remove the partial upload ", temp, " in sandbox ", container, ": ",
               e.what());
    } catch (...) {  // out of memory for the message
    }
  }
}

// Renames the complete temporary file over the target with one exec (see kCommitScript). Not
// cancellable: the data is all there and the rename takes a moment; cancelling now could only
// leave the caller unsure which version is in place.
void commit(DockerApi& api, const std::string& container, const std::string& temp,
            const std::string& path, const sdk::Logger& log) {
  ExecParams params;
  params.argv = {"sh", "-c", std::string(kCommitScript), "sbx-upload", temp, path};
  params.user = "0";
  params.timeout = kCommitTimeout;
  CollectingSink out;
  sdk::ExitStatus status;
  const std::string what = "uploading " + path + " into sandbox " + container;
  try {
    status = run_exec(api, container, params, out, log, sdk::CancelToken());
  } catch (const sdk::Error& e) {  // e.g. the container stopped: FAILED_PRECONDITION
    remove_partial(api, container, temp, log);
    throw sdk::Error(e.status(), what + ": moving the file into place failed: " + e.what(),
                     e.details());
  } catch (...) {
    remove_partial(api, container, temp, log);
    throw;
  }
  if (status.return_code == 0 && !status.error_type) return;
  if (status.error_type == SBX_EXEC_ERROR_SANDBOX) {
    // No sh to run the rename, so none for a cleanup either.
    throw sdk::Error::failed_precondition(what + ": moving the file into place needs sh in the " +
                                          "sandbox; the uploaded data was left at " + temp + " (" +
                                          shorten(out.stderr_text) + ")");
  }
  if (status.error_type) {  // timed out: killed, possibly before it could clean up
    remove_partial(api, container, temp, log);
    throw sdk::Error::internal(what + ": moving the file into place did not finish within " +
                               std::to_string(kCommitTimeout.count()) + " s");
  }
  if (status.return_code == kTargetIsDirectory) {
    throw sdk::Error::invalid_argument("cannot upload " + path + " into sandbox " + container +
                                       ": it is a directory, and an upload never replaces one");
  }
  throw sdk::Error::internal(what + ": moving the file into place failed (exit " +
                             std::to_string(status.return_code) + "): " + shorten(out.stderr_text));
}

// The tar stream of one file, produced on demand as libcurl asks for request body bytes.
class SingleFileArchive {
 public:
  SingleFileArchive(const std::string& path, uint32_t mode, sdk::ByteSource& source)
      : source_(source),
        left_(static_cast<uint64_t>(source.size())),
        writer_([this](std::string_view bytes) { pending_.append(bytes); }) {
    writer_.begin_file(path, left_, mode, now_unix());
  }

  size_t fill(char* buffer, size_t capacity) {
    while (offset_ == pending_.size() && !finished_)
      produce();
    const size_t n = std::min(capacity, pending_.size() - offset_);
    std::memcpy(buffer, pending_.data() + offset_, n);
    offset_ += n;
    return n;
  }

 private:
  void produce() {
    pending_.clear();
    offset_ = 0;
    if (left_ == 0) {
      writer_.end_file();
      writer_.finish();
      finished_ = true;
      return;
    }
    chunk_.resize(static_cast<size_t>(std::min<uint64_t>(kChunk, left_)));
    const size_t n = source_.read(chunk_.data(), chunk_.size());
    if (n == 0) {
      throw sdk::Error::internal("the upload's source ended " + std::to_string(left_) +
                                 " bytes before its announced size");
    }
    writer_.write(std::string_view(chunk_.data(), n));
    left_ -= n;
  }

  sdk::ByteSource& source_;
  uint64_t left_;
  std::string pending_;
  size_t offset_ = 0;
  std::vector<char> chunk_;
  bool finished_ = false;
  tar::Writer writer_;
};

// Checks each archive entry against the one file asked for and passes its bytes to the sink.
class SingleFileExtractor final : public tar::Reader::Handler {
 public:
  SingleFileExtractor(std::string path, std::string name, sdk::ByteSink& sink)
      : path_(std::move(path)), name_(std::move(name)), sink_(sink) {}

  void on_entry(const tar::Entry& entry) override {
    if (++entries_ > 1) refuse("the archive holds more than one entry (" + entry.path + ")");
    switch (entry.type) {
      case tar::EntryType::regular:
        break;
      case tar::EntryType::directory:
        refuse("it is a directory; only regular files can be downloaded");
      case tar::EntryType::symlink:
        refuse("it is a symbolic link (to '" + entry.link_target +
               "'); download the target instead");
      case tar::EntryType::hardlink:
        refuse("the archive stores it as a hard link");
      case tar::EntryType::other:
        refuse("it is not a regular file");
    }
    // Docker names the entry after the file itself; anything else (another name, a path with
    // directories, "..", an absolute path) is not what was asked for.
    if (entry.path != name_) {
      refuse("the archive entry '" + entry.path + "' is not the requested file '" + name_ + "'");
    }
    sink_.expect_size(entry.size);  // the host may stream it on (a Content-Length)
  }
  void on_data(std::string_view bytes) override { sink_.write(bytes); }
  void on_entry_end() override { complete_ = true; }

  bool complete() const { return complete_; }

 private:
  [[noreturn]] void refuse(const std::string& why) const {
    throw sdk::Error::invalid_argument("cannot download " + path_ + ": " + why);
  }

  std::string path_;
  std::string name_;
  sdk::ByteSink& sink_;
  int entries_ = 0;
  bool complete_ = false;
};

}  // namespace

std::string container_path(std::string_view path, const std::optional<std::string>& workdir) {
  std::string resolved = sdk::resolve_sandbox_path(path, workdir.value_or("/"));
  if (resolved == "/") {
    throw sdk::Error::invalid_argument("the sandbox path '" + std::string(path) +
                                       "' names the root directory, not a file");
  }
  return resolved;
}

void upload_file(DockerApi& api, const std::string& container, const std::string& path,
                 uint32_t mode, sdk::ByteSource& source, const sdk::Logger& log,
                 const sdk::CancelToken& cancel) {
  if (source.size() < 0) throw sdk::Error::invalid_argument("the upload's size is negative");
  const std::string parent = parent_of(path);
  const std::string name = path.substr(path.rfind('/') + 1);
  // Same directory, so the same file system and an atomic rename; hidden from a plain `ls`.
  const std::string temp = (parent == "/" ? "" : parent) + "/." + name.substr(0, kNameKept) +
                           std::string(kPartialMarker) + random_hex(8);
  const std::string at = extraction_point(api, container, parent, cancel);
  // The entry is the temporary file relative to where it is extracted.
  const std::string entry = temp.substr(at == "/" ? 1 : at.size() + 1);

  auto archive = std::make_shared<SingleFileArchive>(entry, mode, source);
  http::Request request;
  request.method = "PUT";
  request.target = archive_target(container, at);
  request.headers.emplace_back("Content-Type", "application/x-tar");
  request.body_size = static_cast<int64_t>(
      tar::Writer::single_file_archive_size(entry, static_cast<uint64_t>(source.size())));
  request.body_source = [archive](char* buffer, size_t capacity) {
    return archive->fill(buffer, capacity);
  };
  // No whole-request deadline: a large file takes as long as it takes; cancellation stops it.
  request.timeout = kNoTimeout;
  // Cut streams (source error, cancellation, lost connection) and errors the daemon reports after
  // it began writing (a full disk) can leave part of the temporary file behind.
  bool maybe_written = true;
  try {
    const http::Response response = api.send(std::move(request), cancel);
    if (response.status >= 400) {
      // 4xx and the known refusals come before the daemon writes anything; other 5xx may come
      // from the extraction itself (a full disk).
      maybe_written = response.status >= 500 && refusal_of(response) == Refusal::none;
      throw upload_error(response, container, path, at);
    }
    // Last chance to stop before the target changes.
    sdk::throw_if_cancelled(cancel);
  } catch (...) {
    if (maybe_written) remove_partial(api, container, temp, log);
    throw;
  }
  commit(api, container, temp, path, log);
}

void upload_files(DockerApi& api, const std::string& container,
                  const std::vector<std::pair<std::string, std::string>>& files,
                  const sdk::CancelToken& cancel) {
  std::string body;
  tar::Writer writer([&body](std::string_view bytes) { body.append(bytes); });
  const int64_t mtime = now_unix();
  for (const auto& [path, contents] : files) {
    writer.begin_file(path, contents.size(), 0644, mtime);
    writer.write(contents);
    writer.end_file();
  }
  writer.finish();
  http::Request request;
  request.method = "PUT";
  request.target = archive_target(container);
  request.headers.emplace_back("Content-Type", "application/x-tar");
  request.body = std::move(body);
  check_upload_response(api.send(std::move(request), cancel), container,
                        "writing the startup files");
}

void download_file(DockerApi& api, const std::string& container, const std::string& path,
                   sdk::ByteSink& sink, const sdk::CancelToken& cancel) {
  const std::string name = path.substr(path.rfind('/') + 1);
  SingleFileExtractor extractor(path, name, sink);
  tar::Reader reader(extractor);
  BodyRouter body([&reader](std::string_view bytes) { reader.feed(bytes); });
  http::Request request;
  request.target = "/containers/" + container + "/archive?path=" + http::url_encode(path);
  body.attach(request);
  request.timeout = kNoTimeout;  // as for uploads: cancellation bounds it
  const http::Response response = api.send(std::move(request), cancel);
  if (response.status != 200) {
    throw api_error(response.status, body.error_body(),
                    "downloading " + path + " from sandbox " + container);
  }
  reader.finish();
  if (!extractor.complete()) {
    throw sdk::Error::internal("downloading " + path + " from sandbox " + container +
                               ": the archive did not contain the file");
  }
}

}  // namespace sbx::local_docker
