// The file routes' work on disk (agent/README.md): an upload parsed from its multipart body as it
// arrives and written beside its destination, a download opened and its head built, and the
// answer of GET /files/info. The loop in agent.cpp owns the connections and calls these on its one
// thread; nothing here is shared between threads, and every blocking call is a bounded disk call.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::agent::files {

/// An answer other than success: the status, execd's error code and message, and extra header
/// lines ("Name: value"). A value type.
struct Failure {
  int status = 400;
  std::string code;
  std::string message;
  std::vector<std::string> headers;
};

/// Where the routes look for paths and users; a value type copied from the agent's options.
struct Context {
  std::string etc_dir = "/etc";  ///< passwd and group, for an upload's owner and group names
  std::string workdir = "/";     ///< what a relative path is relative to
};

/// `path` as the agent opens it: an absolute path as given, a relative one under `workdir`. Pure.
std::string resolve(const Context& context, const std::string& path);

/// The boundary of a `multipart/form-data` Content-Type, or nullopt when it is not one (or has no
/// usable boundary). Pure.
std::optional<std::string> multipart_boundary(std::string_view content_type);

/// One POST /files/upload: pairs of a `metadata` part (JSON {path, owner?, group?, mode?}) and a
/// `file` part, parsed as the body arrives. Each file part is written as it comes into a temp file
/// beside its destination (same directory, `.sbx-upload-` and a random name, O_EXCL, 0600), then
/// fsync'ed, chown'ed and chmod'ed; finish() renames every temp file over its destination once
/// the whole body arrived and parsed. Memory stays bounded (a carried delimiter, one metadata part
/// of at most 64 KiB, headers of at most 16 KiB) whatever the size of the files.
/// Owns its temp files and the directories it made: on a failure, and when destroyed before
/// finish() succeeded (a client gone, a truncated body), the temp files are removed and the
/// directories it made are removed again when empty. Used on one thread; not copyable.
class Upload {
 public:
  Upload(std::string boundary, Context context);
  ~Upload();
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;

  /// The next bytes of the body. Writes file bytes to disk at once (blocking, bounded by the size
  /// of `bytes`). After a failure the bytes are read and dropped.
  void feed(std::string_view bytes);
  /// The body ended (all of Content-Length arrived): checks that it was a whole multipart body,
  /// then renames the files into place, in order. nullopt on success, else what to answer (the
  /// files not renamed yet are removed; those renamed before a failed rename stay).
  std::optional<Failure> finish();

 private:
  struct Pair {
    std::string path;  // as the client named it
    std::string dest;  // resolved
    std::string temp;  // the temp file, empty once renamed (or never made)
    int fd = -1;
    mode_t mode = 0644;
    uid_t uid = static_cast<uid_t>(-1);
    gid_t gid = static_cast<gid_t>(-1);
  };
  enum class Phase { preamble, after_delimiter, headers, body, done };
  enum class Part { other, metadata, file };

  void fail(int status, std::string code, std::string message);
  void discard();
  void parse();
  bool begin_part(std::string_view headers);
  bool part_bytes(std::string_view bytes);
  bool end_part();
  bool read_metadata();
  bool make_parents(const std::string& dir);

  const std::string delimiter_;  // "\r\n--" + boundary
  const Context context_;
  std::string buffer_;  // bytes not consumed yet
  Phase phase_ = Phase::preamble;
  Part part_ = Part::other;
  std::string metadata_;
  std::optional<Pair> pending_;  // metadata read, its file part not (yet) complete
  bool writing_ = false;         // pending_'s file part is being written
  std::vector<Pair> done_;       // complete temp files, waiting for finish()
  std::vector<std::string> made_dirs_;
  std::optional<Failure> failure_;
  bool finished_ = false;
};

/// An opened download: the file, which bytes to send, and the response head. Owns `fd` (the
/// caller closes it).
struct Download {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string head;
};

/// Opens `path` (a regular file; a directory, a symbolic link and anything else are refused) and
/// builds the head: 200 with Accept-Ranges and Last-Modified, or 206 for one satisfiable `range`
/// (a header that is not one byte range is ignored, as execd does). nullopt and `failure` set on
/// an error: 404 FILE_NOT_FOUND, 400 INVALID_FILE, 416 INVALID_FILE with `Content-Range: bytes
/// */SIZE`. Blocking (open and fstat); reentrant.
std::optional<Download> open_download(const Context& context, const std::string& path,
                                      const std::string* range, bool keep_alive, Failure& failure);

/// The JSON body of GET /files/info for `paths` (lstat each: a link is described, not followed),
/// or nullopt and `failure` (404 FILE_NOT_FOUND for a missing path). Reentrant.
std::optional<std::string> info(const Context& context, const std::vector<std::string>& paths,
                                Failure& failure);

/// `size` random bytes (at most 16) as lowercase hex, from getrandom; without it (a very old
/// kernel) unique but not secret: the clock, a counter and the pid. Command ids, temp names.
std::string random_hex(std::size_t size);

}  // namespace sbx::agent::files
