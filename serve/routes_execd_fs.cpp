// The execd file-system routes beyond upload, download and info, and execd's own GET /metrics
// and GET /metrics/watch
// (docs/serve.md "The execd API on the gateway"). Each call runs ONE shell script in the sandbox
// through Sandbox::exec_async (bounded by kExecTimeoutS) and shapes its output into execd's
// answer; only POST /files/replace does more (below). The scripts are plain POSIX sh, run alike
// by busybox sh, dash and bash, and use only tools busybox has: test, stat, find, mkdir, chmod,
// chown, rm, mv, cat, head, nproc, sleep. Every path goes into a script through shell_quote; a
// path that is empty or holds a line break is refused with 400 before anything runs (the scripts
// answer in lines).
//
//   POST   /directories            {"DIR": {owner?, group?, mode?}}: mkdir -p; a directory it
//                                  made gets the mode and the owner
//   DELETE /directories?path=      rm -rf, each path (repeatable)
//   GET    /directories/list?path=&depth=   find + stat: [FileInfo], lexical, links not followed
//   DELETE /files?path=            rm -f, each path; a missing one is skipped, a directory is 500
//   POST   /files/mv               [{src, dest}]: mv, the destination's directory made first
//   POST   /files/permissions      {"PATH": {owner?, group?, mode?}}: chmod, chown
//   GET    /files/search?path=&pattern=     find -name (each {a,b} alternative) + stat:
//                                  [FileInfo] of what is not a directory
//   POST   /files/replace[?verbose=true]    {"PATH": {old, new}}: literal replacement, the file
//                                  through the server (download, replace, upload, cat)
//   GET    /metrics                /proc/stat twice, a second apart, and /proc/meminfo
//   GET    /metrics/watch          the same, read after read, one JSON line each on one stream
//
// A script that fails says which item failed by printing its index as its last line and exiting
// with a code that names the failure (fail_at). owner/group are names for chown in the sandbox;
// a chown that fails is logged, not an error (as upload does: execd ignores unknown names).
//
// THREADING: the handlers run on the connection's strand; the continuations of exec and
// transfers run on plugin threads and answer through Reply (any thread). OWNERSHIP: a call's
// continuations hold what they need (Ctx: the sandbox, the reply, the HTTP version), never the
// Call, which lives only as long as its handler.

#include "kept_exec.hpp"
#include "state.hpp"

#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>

namespace sbx::serve {

namespace json = boost::json;
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

// One call's script, as /files/info's.
constexpr double kExecTimeoutS = 60;
// What the server keeps of a script's output (KeptExec): a listing or a search is at most
// kMaxEntries lines of stat; the metrics are a few lines of /proc.
constexpr std::size_t kMaxScriptOutput = 64 * 1024 * 1024;
constexpr std::size_t kMaxMetricsOutput = 1024 * 1024;
// A listing or a search answers at most this many entries (more: 500, ask for less).
constexpr std::size_t kMaxEntries = 100'000;

// What a call's continuations need to answer it.
struct Ctx {
  std::shared_ptr<Server::State> state;
  std::shared_ptr<Entry> entry;
  Reply reply;
  unsigned version;

  explicit Ctx(const Call& call)
      : state(call.state), entry(call.entry), reply(call.reply), version(call.request.version()) {}

  Request shape() const {
    Request r;
    r.version(version);
    return r;
  }
  void error(http::status status, const std::string& code, const std::string& message) const {
    reply(execd_error(shape(), status, code, message));
  }
  void bad_request(const std::string& message) const {
    error(http::status::bad_request, "INVALID_REQUEST_BODY", message);
  }
  void not_found(const std::string& message) const {
    error(http::status::not_found, "FILE_NOT_FOUND", message);
  }
  void runtime_error(const std::string& message) const {
    error(http::status::internal_server_error, "RUNTIME_ERROR", message);
  }
  // A failed provider call: a sandbox that no longer runs as every route answers it, anything
  // else 500 RUNTIME_ERROR.
  void provider_error(std::exception_ptr exception) const {
    const sbx::Error e = sbx::to_error(exception);
    if (sandbox_gone(e, *entry)) return reply(sandbox_gone_response(shape(), e, entry->id));
    runtime_error(e.what());
  }
  void ok() const { reply(empty_response(shape(), http::status::ok)); }
  void ok(const json::value& body) const {
    Response r = json_response(shape(), http::status::ok, body);
    r.set(http::field::content_type, "application/json; charset=utf-8");
    reply(std::move(r));
  }
};

// Not empty, no line break (the scripts answer in lines), no NUL (it would end the script).
bool usable_path(const std::string& path) {
  return !path.empty() && path.find_first_of(std::string_view("\n\r\0", 3)) == std::string::npos;
}

// `path` without trailing slashes ("/" stays), as execd cleans it.
std::string without_trailing_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  return path;
}

// The one `path` query value of a listing or a search, usable, without its trailing slash;
// nullopt after answering 400.
std::optional<std::string> query_root(const Call& call, const Ctx& ctx) {
  const auto paths = query_values(call.request, "path");
  if (paths.empty() || paths.front().empty()) {
    ctx.error(http::status::bad_request, "MISSING_QUERY", "missing query parameter 'path'");
    return std::nullopt;
  }
  if (!usable_path(paths.front())) {
    ctx.bad_request("invalid path: " + paths.front());
    return std::nullopt;
  }
  return without_trailing_slash(paths.front());
}

// The `path` query values, each usable; nullopt after answering 400.
std::optional<std::vector<std::string>> query_paths(const Call& call, const Ctx& ctx) {
  auto paths = query_values(call.request, "path");
  if (paths.empty()) {
    ctx.error(http::status::bad_request, "MISSING_QUERY", "missing query parameter 'path'");
    return std::nullopt;
  }
  for (const auto& p : paths) {
    if (!usable_path(p)) {
      ctx.bad_request("invalid path: " + p);
      return std::nullopt;
    }
  }
  return paths;
}

// execd's message for a body it cannot bind.
std::string invalid_body(const std::string& why) {
  return "error parsing request, MAYBE invalid body format. " + why;
}

// The body as JSON; nullopt after answering 400 INVALID_REQUEST_BODY.
std::optional<json::value> body_json(const Call& call, const Ctx& ctx) {
  boost::system::error_code ec;
  json::value value = json::parse(call.request.body(), ec);
  if (ec) {
    ctx.bad_request(invalid_body(ec.message()));
    return std::nullopt;
  }
  return value;
}

// A Permission of POST /directories and POST /files/permissions, as script arguments.
struct Permission {
  std::string mode;   // octal digits for chmod ("755"), or empty: left as it is
  std::string chown;  // "owner", "owner:group" or ":group" for chown, or empty
};

// {owner?, group?, mode?} (null: nothing); `mode` is octal written in decimal, 755 is 0o755
// (0 or absent: left alone). nullopt with `why` for anything else.
std::optional<Permission> read_permission(const json::value& v, std::string& why) {
  Permission out;
  if (v.is_null()) return out;
  if (!v.is_object()) {
    why = invalid_body("a permission must be an object {owner, group, mode}");
    return std::nullopt;
  }
  const json::object& o = v.as_object();
  std::string owner, group;
  for (const char* name : {"owner", "group"}) {
    const auto* f = o.if_contains(name);
    if (!f || f->is_null()) continue;
    if (!f->is_string()) {
      why = invalid_body(std::string(name) + " must be a string");
      return std::nullopt;
    }
    (std::string_view(name) == "owner" ? owner : group) = std::string(f->as_string());
  }
  if (!owner.empty() || !group.empty()) out.chown = owner + (group.empty() ? "" : ":" + group);
  if (const auto* mode = o.if_contains("mode"); mode && !mode->is_null()) {
    const auto n = integer_of(*mode);
    const std::string digits = n ? std::to_string(*n) : std::string();
    if (!n || *n < 0 || *n > 7777 || digits.find_first_of("89") != std::string::npos) {
      why = invalid_body("mode must be an octal permission written in decimal, e.g. 755");
      return std::nullopt;
    }
    if (*n != 0) out.mode = digits;
  }
  return out;
}

// The script's answer to an item that failed: its index as the last line, and exit `code`.
std::string fail_at(std::size_t index, int code) {
  return " || { echo " + std::to_string(index) + "; exit " + std::to_string(code) + "; }";
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  for (std::size_t start = 0; start < text.size();) {
    auto eol = text.find('\n', start);
    if (eol == std::string::npos) eol = text.size();
    lines.push_back(text.substr(start, eol - start));
    start = eol + 1;
  }
  return lines;
}

// The index a failed script printed last (fail_at), if it is one of `count` items.
std::optional<std::size_t> failed_index(const sbx::ExecResult& result, std::size_t count) {
  const auto lines = lines_of(result.stdout_text);
  if (lines.empty()) return std::nullopt;
  std::size_t index = 0;
  const std::string& last = lines.back();
  const auto [end, ec] = std::from_chars(last.data(), last.data() + last.size(), index);
  if (ec != std::errc() || end != last.data() + last.size() || index >= count) return std::nullopt;
  return index;
}

// What the tools said (stderr, else stdout), trimmed and bounded, for a message.
std::string said(const sbx::ExecResult& result) {
  std::string text = result.stderr_text.empty() ? result.stdout_text : result.stderr_text;
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.pop_back();
  if (text.size() > 2000) text = text.substr(0, 2000) + "...";
  return text.empty() ? "exit status " + std::to_string(result.return_code) : text;
}

// Runs `script` in the call's sandbox; `done` gets a result of a script that ran (any exit
// status), on a plugin thread. An exec that fails, times out or cannot start is answered here
// (500 RUNTIME_ERROR).
void run_script(const Ctx& ctx, std::string script,
                std::function<void(const sbx::ExecResult&)> done) {
  sbx::ExecOptions options;
  options.timeout_s = kExecTimeoutS;
  std::shared_ptr<KeptExec> exec;
  try {
    exec =
        KeptExec::start(*ctx.entry->box(), std::move(script), std::move(options), kMaxScriptOutput);
  } catch (...) {
    ctx.provider_error(std::current_exception());
    return;
  }
  exec->then([ctx, done = std::move(done)](KeptExec& finished) {
    sbx::ExecResult result;
    try {
      result = finished.get();
    } catch (...) {
      ctx.provider_error(std::current_exception());
      return;
    }
    if (result.timed_out()) {
      ctx.runtime_error("the command in the sandbox did not finish within " +
                        std::to_string(static_cast<int>(kExecTimeoutS)) + " s");
      return;
    }
    if (result.error_type) {
      ctx.runtime_error("the sandbox could not run the command: " + said(result));
      return;
    }
    done(result);
  });
}

// The directory `path` is in ("." for a bare name), as Go's filepath.Dir.
std::string parent_of(const std::string& path) {
  const std::string p = without_trailing_slash(path);
  const auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : without_trailing_slash(p.substr(0, slash));
}

// ----------------------------------------------------------------------------------------------
// Entries found under a root (GET /directories/list, GET /files/search): `find ROOT ... -exec
// stat -c 'kStatFormat|%n' -- {} +`, one line per entry (names with a line break are pruned
// before stat sees them), at most kMaxEntries + 1 lines read.

// `root` as find's starting point: a relative one behind "./", so that no root ("-delete", "!")
// is read as part of find's expression.
std::string find_start(const std::string& root) {
  return root.front() == '/' ? root : "./" + root;
}

// The find expression's prune of names holding a line break, and its stat.
std::string find_stat() {
  return std::string("-exec stat -c '") + kStatFormat + "|%n' -- {} + | head -n " +
         std::to_string(kMaxEntries + 1);
}
constexpr const char* kPruneLineBreaks = "-path '*\n*' -prune -o";

// Parent before child, and names in byte order within a directory (Go's os.ReadDir and
// filepath.Walk): byte order with '/' below every other byte.
bool tree_order(const std::string& a, const std::string& b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    const int rx = x == '/' ? -1 : static_cast<unsigned char>(x);
    const int ry = y == '/' ? -1 : static_cast<unsigned char>(y);
    return rx < ry;
  });
}

// The FileInfo of each line of `find_stat` under `root` (as the caller named it, without a
// trailing slash; find_start(root) for find), in tree order; nullopt after answering 500.
std::optional<json::array> entries_of(const Ctx& ctx, const std::string& root,
                                      const sbx::ExecResult& result) {
  const std::string start = find_start(root);
  const auto lines = lines_of(result.stdout_text);
  if (lines.size() > kMaxEntries) {
    ctx.runtime_error("more than " + std::to_string(kMaxEntries) + " entries under " + root +
                      ": ask for a narrower path, depth or pattern");
    return std::nullopt;
  }
  std::vector<std::pair<std::string, json::object>> found;  // (path under root, its FileInfo)
  for (const auto& line : lines) {
    std::size_t name_at = std::string::npos;  // the bar after the 7 fields
    for (std::size_t from = 0, bars = 0; bars < 7; ++bars, from = name_at + 1) {
      name_at = line.find('|', from);
      if (name_at == std::string::npos) break;
    }
    if (name_at == std::string::npos) {
      ctx.runtime_error("unexpected stat output: " + line);
      return std::nullopt;
    }
    const std::string printed = line.substr(name_at + 1);
    std::string under = printed;
    if (printed.compare(0, start.size(), start) == 0) {
      under = printed.substr(start.size());
      under.erase(0, under.find_first_not_of('/'));
    }
    const std::string path = under.empty() ? root : root + (root.back() == '/' ? "" : "/") + under;
    auto info = file_info_json(path, std::string_view(line).substr(0, name_at));
    if (!info) {
      ctx.runtime_error("unexpected stat output: " + line);
      return std::nullopt;
    }
    found.emplace_back(under, std::move(*info));
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return tree_order(a.first, b.first); });
  json::array out;
  for (auto& [under, info] : found)
    out.push_back(std::move(info));
  return out;
}

}  // namespace

// The body {"PATH": {owner?, group?, mode?}, ...} of POST /directories and POST
// /files/permissions, in the body's order, each path usable; nullopt after answering 400.
std::optional<std::vector<std::pair<std::string, Permission>>> permission_body(const Call& call,
                                                                               const Ctx& ctx) {
  const auto body = body_json(call, ctx);
  if (!body) return std::nullopt;
  if (!body->is_object()) {
    ctx.bad_request(invalid_body("the body must be an object {path: {owner, group, mode}}"));
    return std::nullopt;
  }
  std::vector<std::pair<std::string, Permission>> items;
  for (const auto& [key, value] : body->as_object()) {
    std::string why;
    auto perm = read_permission(value, why);
    if (!perm) {
      ctx.bad_request(why);
      return std::nullopt;
    }
    std::string path(key);
    if (!usable_path(path)) {
      ctx.bad_request("invalid path: " + path);
      return std::nullopt;
    }
    items.emplace_back(std::move(path), std::move(*perm));
  }
  return items;
}

// ----------------------------------------------------------------------------------------------
// POST /directories {"DIR": {owner?, group?, mode?}}: `mkdir -p` of each, in the body's order; a
// directory that did not exist gets the mode (chmod) and the owner (chown), one that did is left
// as it is (execd's MakeDir). A path that exists and is not a directory fails (500).

void post_directories(const Call& call) {
  const Ctx ctx(call);
  const auto items = permission_body(call, ctx);
  if (!items) return;
  std::vector<std::string> dirs;
  std::string script;
  for (const auto& [dir, permission] : *items) {
    const std::string q = shell_quote(dir);
    std::string made = "mkdir -p -- " + q;
    if (!permission.mode.empty()) made += " && chmod " + permission.mode + " -- " + q;
    if (!permission.chown.empty())
      made += " && { chown -- " + shell_quote(permission.chown) + " " + q + " || :; }";
    script += "if [ -e " + q + " ]; then mkdir -p -- " + q + "; else " + made + "; fi" +
              fail_at(dirs.size(), 1) + "\n";
    dirs.push_back(dir);
  }
  if (dirs.empty()) {
    ctx.ok();
    return;
  }
  run_script(ctx, std::move(script), [ctx, dirs](const sbx::ExecResult& result) {
    if (result.return_code != 0) {
      const auto i = failed_index(result, dirs.size());
      ctx.runtime_error("error accessing file: " + (i ? dirs[*i] + ": " : "") + said(result));
      return;
    }
    if (!result.stderr_text.empty()) {  // a chown that failed (an unknown name)
      spdlog::warn("sbx serve: POST /directories in sandbox {}: {}", ctx.entry->id, said(result));
    }
    ctx.ok();
  });
}

// ----------------------------------------------------------------------------------------------
// DELETE /directories?path=... (repeatable): `rm -rf` of each (a missing one is no error; a
// symbolic link is removed, not what it leads to).

void delete_directories(const Call& call) {
  const Ctx ctx(call);
  const auto paths = query_paths(call, ctx);
  if (!paths) return;
  std::string script;
  for (std::size_t i = 0; i < paths->size(); ++i)
    // Without its trailing slash: `rm -rf LINK/` would empty the directory a link leads to (GNU),
    // where execd (os.RemoveAll of the cleaned path) removes the link.
    script +=
        "rm -rf -- " + shell_quote(without_trailing_slash((*paths)[i])) + fail_at(i, 1) + "\n";
  run_script(ctx, std::move(script), [ctx, paths = *paths](const sbx::ExecResult& result) {
    if (result.return_code != 0) {
      const auto i = failed_index(result, paths.size());
      ctx.runtime_error("error removing directory " + (i ? paths[*i] : std::string()) + ". " +
                        said(result));
      return;
    }
    ctx.ok();
  });
}

// ----------------------------------------------------------------------------------------------
// GET /directories/list?path=DIR&depth=N (depth 1 by default: the children; 0: none): the
// entries under DIR down to N levels as [FileInfo], each directory's entries in byte order and a
// directory's own entries right after it. Symbolic links are listed, never followed; DIR itself
// a link: 400. Missing: 404; not a directory: 400.

void get_directories_list(const Call& call) {
  const Ctx ctx(call);
  const auto found = query_root(call, ctx);
  if (!found) return;
  const std::string& root = *found;
  int depth = 1;
  if (const auto depths = query_values(call.request, "depth"); !depths.empty()) {
    const std::string& text = depths.front();
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), depth);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || depth < 0) {
      ctx.bad_request("invalid query parameter 'depth': " + text);
      return;
    }
  }
  const std::string q = shell_quote(root);
  std::string script = "if [ -L " + q + " ]; then exit 4; fi\n" +    //
                       "if [ ! -e " + q + " ]; then exit 3; fi\n" +  //
                       "if [ ! -d " + q + " ]; then exit 5; fi\n";
  if (depth > 0) {
    script += "find " + shell_quote(find_start(root)) + " -mindepth 1 -maxdepth " +
              std::to_string(depth) + " " + kPruneLineBreaks + " " + find_stat() + "\n";
  }
  run_script(ctx, std::move(script), [ctx, root](const sbx::ExecResult& result) {
    switch (result.return_code) {
      case 0:
        break;
      case 3:
        ctx.not_found("file not found. lstat " + root + ": no such file or directory");
        return;
      case 4:
        ctx.bad_request("path is a symbolic link, refusing to traverse: " + root);
        return;
      case 5:
        ctx.bad_request("path is not a directory: " + root);
        return;
      default:
        ctx.runtime_error("error listing directory " + root + ". " + said(result));
        return;
    }
    if (auto entries = entries_of(ctx, root, result)) ctx.ok(*entries);
  });
}

// ----------------------------------------------------------------------------------------------
// DELETE /files?path=... (repeatable): `rm -f` of each file. A path that does not exist (a
// dangling link included) is skipped; a directory (or a link to one) fails the call with 500,
// the paths before it removed (execd's DeleteFile).

void delete_files(const Call& call) {
  const Ctx ctx(call);
  const auto paths = query_paths(call, ctx);
  if (!paths) return;
  std::string script;
  for (std::size_t i = 0; i < paths->size(); ++i) {
    const std::string q = shell_quote((*paths)[i]);
    script += "if [ -d " + q + " ]; then echo " + std::to_string(i) + "; exit 2; elif [ -e " + q +
              " ]; then rm -f -- " + q + fail_at(i, 1) + "; fi\n";
  }
  run_script(ctx, std::move(script), [ctx, paths = *paths](const sbx::ExecResult& result) {
    if (result.return_code == 0) {
      ctx.ok();
      return;
    }
    const auto i = failed_index(result, paths.size());
    const std::string path = i ? paths[*i] : std::string();
    if (result.return_code == 2) {
      ctx.runtime_error("error removing file " + path + ". path is a directory: " + path);
    } else {
      ctx.runtime_error("error removing file " + path + ". failed to remove file: " + said(result));
    }
  });
}

// ----------------------------------------------------------------------------------------------
// POST /files/mv [{src, dest}]: in order, `mv` of each (files and directories): the source must
// exist (404 otherwise), the destination's directory is made, and a destination that exists is
// refused (500), as execd's RenameFile. The moves before a failure stay done.

void post_files_mv(const Call& call) {
  const Ctx ctx(call);
  const auto body = body_json(call, ctx);
  if (!body) return;
  if (!body->is_array()) {
    ctx.bad_request(invalid_body("the body must be an array [{src, dest}]"));
    return;
  }
  std::vector<std::pair<std::string, std::string>> moves;
  std::string script;
  for (const auto& item : body->as_array()) {
    const auto* o = item.if_object();
    const auto* src = o ? o->if_contains("src") : nullptr;
    const auto* dest = o ? o->if_contains("dest") : nullptr;
    if (!src || !dest || !src->is_string() || !dest->is_string()) {
      ctx.bad_request(invalid_body("each move must be {\"src\": string, \"dest\": string}"));
      return;
    }
    const std::string from(src->as_string()), to(dest->as_string());
    if (!usable_path(from) || !usable_path(to)) {
      ctx.bad_request("invalid path: " + (usable_path(from) ? to : from));
      return;
    }
    const std::size_t i = moves.size();
    // Cleaned as execd cleans them: a trailing slash would make mv act on a link's target.
    const std::string qs = shell_quote(without_trailing_slash(from)),
                      qd = shell_quote(without_trailing_slash(to));
    script += "[ -e " + qs + " ]" + fail_at(i, 3) + "\n" +                          //
              "mkdir -p -- " + shell_quote(parent_of(to)) + fail_at(i, 1) + "\n" +  //
              "if [ -e " + qd + " ]; then echo " + std::to_string(i) + "; exit 2; fi\n" + "mv -- " +
              qs + " " + qd + fail_at(i, 1) + "\n";
    moves.emplace_back(from, to);
  }
  if (moves.empty()) {
    ctx.ok();
    return;
  }
  run_script(ctx, std::move(script), [ctx, moves](const sbx::ExecResult& result) {
    if (result.return_code == 0) {
      ctx.ok();
      return;
    }
    const auto i = failed_index(result, moves.size());
    const std::string src = i ? moves[*i].first : std::string();
    const std::string dest = i ? moves[*i].second : std::string();
    if (result.return_code == 3) {
      ctx.not_found("file not found. source path not found: " + src + ": stat " + src +
                    ": no such file or directory");
    } else if (result.return_code == 2) {
      ctx.runtime_error("error accessing file: destination path already exists: " + dest);
    } else {
      ctx.runtime_error("error accessing file: " + said(result));
    }
  });
}

// ----------------------------------------------------------------------------------------------
// POST /files/permissions {"PATH": {owner?, group?, mode?}}: in the body's order, `chmod` (a mode
// given) and `chown` (an owner or group given) of each. A missing path fails the call (500, as
// execd's chmod error), the paths before it changed. Unlike execd, a call without owner and group
// leaves the owner as it is (execd chowns the file to itself then).

void post_files_permissions(const Call& call) {
  const Ctx ctx(call);
  const auto items = permission_body(call, ctx);
  if (!items) return;
  std::vector<std::string> paths;
  std::string script;
  for (const auto& [path, permission] : *items) {
    const std::size_t i = paths.size();
    const std::string q = shell_quote(path);
    script += "{ [ -e " + q + " ] || [ -L " + q + " ]; }" + fail_at(i, 3) + "\n";
    if (!permission.mode.empty())
      script += "chmod " + permission.mode + " -- " + q + fail_at(i, 1) + "\n";
    if (!permission.chown.empty())
      script += "chown -- " + shell_quote(permission.chown) + " " + q + " || :\n";
    paths.push_back(path);
  }
  if (paths.empty()) {
    ctx.ok();
    return;
  }
  run_script(ctx, std::move(script), [ctx, paths](const sbx::ExecResult& result) {
    if (result.return_code != 0) {
      const auto i = failed_index(result, paths.size());
      const std::string path = i ? paths[*i] : std::string();
      ctx.runtime_error("error changing permissions for " + path + ". " +
                        (result.return_code == 3 ? "chmod " + path + ": no such file or directory"
                                                 : said(result)));
      return;
    }
    if (!result.stderr_text.empty()) {  // a chown that failed (an unknown name)
      spdlog::warn("sbx serve: POST /files/permissions in sandbox {}: {}", ctx.entry->id,
                   said(result));
    }
    ctx.ok();
  });
}

// ----------------------------------------------------------------------------------------------
// GET /files/search?path=DIR&pattern=GLOB (default "**"): what is not a directory under DIR
// (links not followed) whose NAME matches GLOB, as [FileInfo] in tree order. execd matches the
// base name with doublestar; here it is find's -name (fnmatch: *, ?, [...]) of each alternative
// doublestar's {a,b} groups give (expanded here, nested groups too, at most kMaxAlternatives; an
// unclosed group is execd's 500 "invalid pattern"); a leading "**/" is dropped, since it may
// match no directory at all. DIR missing: 404.

namespace {

constexpr std::size_t kMaxAlternatives = 1024;

// Expands a doublestar pattern's {a,b,...} groups into the plain patterns they stand for, in
// order ("x{a,b{c,d}}" is x a, x bc, x bd). A backslash keeps the next character and a bracket
// class its braces and commas; outside a group ',' and '}' are plain characters. nullopt: a group
// is not closed, or there are more than kMaxAlternatives patterns.
class Alternatives {
 public:
  static std::optional<std::vector<std::string>> expand(std::string_view pattern) {
    Alternatives parser(pattern);
    auto out = parser.sequence(false);
    if (!out || parser.at_ < pattern.size()) return std::nullopt;
    return out;
  }

 private:
  explicit Alternatives(std::string_view p) : p_(p) {}

  // Pieces up to the end, or (in a group) up to its next ',' or '}'.
  std::optional<std::vector<std::string>> sequence(bool in_group) {
    std::vector<std::string> out{""};
    while (at_ < p_.size()) {
      const char c = p_[at_];
      if (in_group && (c == ',' || c == '}')) break;
      if (c == '{') {
        ++at_;
        auto group = alternatives();
        if (!group) return std::nullopt;
        std::vector<std::string> product;
        for (const auto& head : out) {
          for (const auto& tail : *group) {
            if (product.size() == kMaxAlternatives) return std::nullopt;
            product.push_back(head + tail);
          }
        }
        out = std::move(product);
        continue;
      }
      const std::string_view piece = literal();
      for (auto& o : out)
        o += piece;
    }
    return out;
  }

  // After a '{': the alternatives up to its '}'.
  std::optional<std::vector<std::string>> alternatives() {
    std::vector<std::string> out;
    for (;;) {
      auto one = sequence(true);
      if (!one) return std::nullopt;
      for (auto& o : *one) {
        if (out.size() == kMaxAlternatives) return std::nullopt;
        out.push_back(std::move(o));
      }
      if (at_ == p_.size()) return std::nullopt;  // not closed
      if (p_[at_++] == '}') return out;
    }
  }

  // One character, an escaped pair or a whole bracket class (an unclosed '[' is one character).
  std::string_view literal() {
    const std::size_t start = at_;
    if (p_[at_] == '\\' && at_ + 1 < p_.size()) {
      at_ += 2;
    } else if (p_[at_] == '[') {
      std::size_t i = at_ + 1;
      if (i < p_.size() && (p_[i] == '!' || p_[i] == '^')) ++i;
      if (i < p_.size() && p_[i] == ']') ++i;  // a ']' first is a member
      while (i < p_.size() && p_[i] != ']')
        i += p_[i] == '\\' && i + 1 < p_.size() ? 2 : 1;
      at_ = i < p_.size() ? i + 1 : at_ + 1;
    } else {
      ++at_;
    }
    return p_.substr(start, at_ - start);
  }

  std::string_view p_;
  std::size_t at_ = 0;
};

}  // namespace

void get_files_search(const Call& call) {
  const Ctx ctx(call);
  const auto found = query_root(call, ctx);
  if (!found) return;
  const std::string& root = *found;
  const auto patterns = query_values(call.request, "pattern");
  std::string pattern = patterns.empty() || patterns.front().empty() ? "**" : patterns.front();
  if (!usable_path(pattern)) {
    ctx.bad_request("invalid pattern: " + pattern);
    return;
  }
  while (pattern.rfind("**/", 0) == 0 && pattern.size() > 3)
    pattern.erase(0, 3);
  const auto names = Alternatives::expand(pattern);
  if (!names) {
    ctx.runtime_error("error searching files. invalid pattern " + pattern +
                      ": syntax error in pattern (an unclosed {, or more than " +
                      std::to_string(kMaxAlternatives) + " alternatives)");
    return;
  }
  std::string match;
  for (const auto& name : *names)
    match += (match.empty() ? "" : " -o ") + std::string("-name ") + shell_quote(name);
  const std::string q = shell_quote(root);
  const std::string script = "if [ ! -e " + q + " ]; then exit 3; fi\n" + "find " +
                             shell_quote(find_start(root)) + " " + kPruneLineBreaks +
                             " ! -type d \\( " + match + " \\) " + find_stat() + "\n";
  run_script(ctx, script, [ctx, root](const sbx::ExecResult& result) {
    if (result.return_code == 3) {
      ctx.not_found("file not found. stat " + root + ": no such file or directory");
      return;
    }
    if (result.return_code != 0) {
      ctx.runtime_error("error searching files. " + said(result));
      return;
    }
    if (auto entries = entries_of(ctx, root, result)) ctx.ok(*entries);
  });
}

// ----------------------------------------------------------------------------------------------
// POST /files/replace[?verbose=true] {"PATH": {old, new}}: every `old` in the file becomes `new`,
// literally (Go's strings.ReplaceAll; matches left to right, not overlapping); verbose answers
// {"PATH": {"replacedCount": n}}, otherwise 200 empty.
//
// Why through the server: no busybox tool replaces a literal byte string safely (sed and awk take
// patterns, work in lines and stop at NUL bytes), so the bytes are replaced here, exactly:
//   1. one script checks every path first (a regular file, or a link to one; its size): missing
//      404, anything else 500, larger than kMaxReplaceBytes 500, nothing changed yet;
//   2. then, file by file, Sandbox::download_to_async into a directory of the server's temp dir
//      (its bytes taken from the temp space as they come, 507 when full; stopped past
//      kMaxReplaceBytes, 500), the replacement streamed from it into a second temp file (a
//      64 KiB piece and the tail a match may straddle in memory);
//   3. a file with matches is uploaded next to the original under a hidden unique name, and
//      `cat TEMP > PATH; rm TEMP` writes it back: the file keeps its inode, mode and owner, and a
//      link is written through, as execd's os.WriteFile does. A file without a match is not
//      written.
// Limits: the files are read in turn, not atomically (a file changed between the download and
// the write loses that change, as with execd); a failure stops the call, the files before it
// replaced; the streaming runs on a plugin thread, bounded by the size cap.

namespace {

constexpr uint64_t kMaxReplaceBytes = 32ull << 20;
constexpr std::size_t kReplacePiece = 64 * 1024;

struct TempSpaceFull {};

std::string too_large(const std::string& path, uint64_t size) {
  return path + " is " + std::to_string(size) + " bytes: sbx serve replaces text in files of " +
         "at most " + std::to_string(kMaxReplaceBytes) + " bytes";
}

// Copies `in` to `out` with every `old` replaced by `repl`; the number replaced. `take(n)` is
// asked before n more bytes are written (false: TempSpaceFull). Throws std::runtime_error on I/O
// errors.
int64_t replace_stream(const fs::path& in_path, const fs::path& out_path, const std::string& old,
                       const std::string& repl, const std::function<bool(uint64_t)>& take) {
  std::ifstream in(in_path, std::ios::binary);
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!in || !out) throw std::runtime_error("cannot open the replacement's temp files");
  fs::permissions(out_path, fs::perms::owner_read | fs::perms::owner_write);
  auto emit = [&](std::string_view bytes) {
    if (bytes.empty()) return;
    if (!take(bytes.size())) throw TempSpaceFull{};
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  int64_t count = 0;
  std::string buffer;  // bytes read and not written yet
  std::string piece(kReplacePiece, '\0');
  for (bool end = false; !end;) {
    in.read(piece.data(), static_cast<std::streamsize>(piece.size()));
    if (in.bad()) throw std::runtime_error("cannot read the downloaded file");
    end = in.eof();
    buffer.append(piece.data(), static_cast<std::size_t>(in.gcount()));
    std::size_t pos = 0;
    for (std::size_t at; (at = buffer.find(old, pos)) != std::string::npos; pos = at + old.size()) {
      emit(std::string_view(buffer).substr(pos, at - pos));
      emit(repl);
      ++count;
    }
    // The last old.size() - 1 bytes may begin a match the next piece completes.
    const std::size_t tail = std::min(buffer.size() - pos, old.size() - 1);
    const std::size_t keep_from = end ? buffer.size() : buffer.size() - tail;
    emit(std::string_view(buffer).substr(pos, keep_from - pos));
    buffer.erase(0, keep_from);
  }
  out.close();
  if (!out) throw std::runtime_error("cannot write the replacement's temp file");
  return count;
}

// A file being downloaded into the replacement's temp file (plugin thread, then the
// continuation): its size so far and why it stopped.
struct Incoming {
  explicit Incoming(int f) : fd(f) {}
  ~Incoming() { close(); }
  Incoming(const Incoming&) = delete;
  Incoming& operator=(const Incoming&) = delete;
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  int fd;
  uint64_t size = 0;
  bool too_large = false;
  bool full = false;
  int write_error = 0;
};

// One POST /files/replace: its files replaced in turn (step 2 and 3 above).
class Replace : public std::enable_shared_from_this<Replace> {
 public:
  struct Item {
    std::string path, old, repl;
    uint64_t size = 0;  // from step 1
    int64_t count = 0;
  };

  Replace(Ctx ctx, std::vector<Item> items, bool verbose)
      : ctx_(std::move(ctx)), items_(std::move(items)), verbose_(verbose) {}
  ~Replace() {
    if (!dir_.empty()) {
      std::error_code ignored;
      fs::remove_all(dir_, ignored);
    }
    ctx_.state->temp_space.give(taken_);
  }
  Replace(const Replace&) = delete;
  Replace& operator=(const Replace&) = delete;

  void start() {
    dir_ = ctx_.state->temp_dir / ("replace-" + new_request_id());
    if (::mkdir(dir_.c_str(), 0700) != 0) {
      const std::string why = "cannot create " + dir_.string() + ": " + std::strerror(errno);
      dir_.clear();
      ctx_.runtime_error(why);
      return;
    }
    next(0);
  }

 private:
  bool take(uint64_t n) {
    if (!ctx_.state->temp_space.take(n)) return false;
    taken_ += n;
    return true;
  }
  void temp_full() const {
    ctx_.error(http::status::insufficient_storage, "INSUFFICIENT_STORAGE",
               "the server's temporary space for transfers is full (at most " +
                   std::to_string(ctx_.state->temp_space.limit()) +
                   " bytes at once, serve.temp_limit); try again later");
  }

  // Downloads item i (all before it done).
  void next(std::size_t i) {
    if (i == items_.size()) {
      finish();
      return;
    }
    std::error_code ignored;
    fs::remove(dir_ / "in", ignored);
    fs::remove(dir_ / "out", ignored);
    ctx_.state->temp_space.give(taken_);
    taken_ = 0;
    // Streamed into the temp file, each byte taken from the temp space as it comes: a file that
    // grew since step 1 (or a sandbox that lies about it) stops at the size cap, or at the temp
    // space's limit, not after.
    const int fd = ::open((dir_ / "in").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      ctx_.runtime_error("cannot create the replacement's temp file: " +
                         std::string(std::strerror(errno)));
      return;
    }
    auto in = std::make_shared<Incoming>(fd);
    sbx::DownloadSink sink;
    sink.on_data = [self = shared_from_this(), in](std::string_view bytes) {
      in->size += bytes.size();
      if (in->size > kMaxReplaceBytes) {
        in->too_large = true;
        return false;
      }
      if (!self->take(bytes.size())) {
        in->full = true;
        return false;
      }
      for (std::size_t done = 0; done < bytes.size();) {
        const ssize_t n = ::write(in->fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          in->write_error = errno ? errno : EIO;
          return false;
        }
        done += static_cast<std::size_t>(n);
      }
      return true;
    };
    sbx::Operation<void> op;
    try {
      op = ctx_.entry->box()->download_to_async(items_[i].path, std::move(sink));
    } catch (...) {
      transfer_failed(std::current_exception(), i);
      return;
    }
    op.then([self = shared_from_this(), i, in](sbx::Operation<void>& done) {
      in->close();
      if (in->too_large) return self->ctx_.runtime_error(too_large(self->items_[i].path, in->size));
      if (in->full) return self->temp_full();
      if (in->write_error) {
        return self->ctx_.runtime_error("cannot write the replacement's temp file: " +
                                        std::string(std::strerror(in->write_error)));
      }
      try {
        done.get();
      } catch (...) {
        self->transfer_failed(std::current_exception(), i);
        return;
      }
      self->replace(i);
    });
  }

  // Replaces item i's downloaded bytes; uploads the result if anything changed.
  void replace(std::size_t i) {
    Item& item = items_[i];
    std::error_code ec;
    const uint64_t size = fs::file_size(dir_ / "in", ec);
    if (ec || size > kMaxReplaceBytes) {
      ctx_.runtime_error(ec ? "cannot read the downloaded " + item.path
                            : too_large(item.path, size));
      return;
    }
    try {
      item.count = replace_stream(dir_ / "in", dir_ / "out", item.old, item.repl,
                                  [this](uint64_t n) { return take(n); });
    } catch (const TempSpaceFull&) {
      temp_full();
      return;
    } catch (const std::exception& e) {
      ctx_.runtime_error(e.what());
      return;
    }
    if (item.count == 0) {
      next(i + 1);
      return;
    }
    const std::string parent = parent_of(item.path);
    const std::string temp =
        parent + (parent == "/" ? "" : "/") + ".sbx-replace-" + new_request_id();
    sbx::Operation<void> op;
    try {
      op = ctx_.entry->box()->upload_async(dir_ / "out", temp);
    } catch (...) {
      transfer_failed(std::current_exception(), i);
      return;
    }
    op.then([self = shared_from_this(), i, temp](sbx::Operation<void>& done) {
      try {
        done.get();
      } catch (...) {
        self->transfer_failed(std::current_exception(), i);
        self->remove_quietly(temp);  // in case the provider left part of it
        return;
      }
      self->write_back(i, temp);
    });
  }

  // Writes the uploaded `temp` into item i's file, which keeps its inode, mode and owner.
  void write_back(std::size_t i, const std::string& temp) {
    const std::string qt = shell_quote(temp);
    run_script(ctx_,
               "cat -- " + qt + " > " + shell_quote(items_[i].path) + "; rc=$?; rm -f -- " + qt +
                   "; exit $rc\n",
               [self = shared_from_this(), i](const sbx::ExecResult& result) {
                 if (result.return_code != 0) {
                   self->ctx_.runtime_error("error accessing file: " + said(result));
                   return;
                 }
                 self->next(i + 1);
               });
  }

  // Best effort, after the answer: the result is not waited for.
  void remove_quietly(const std::string& path) const {
    sbx::ExecOptions options;
    options.timeout_s = kExecTimeoutS;
    options.on_output = [](sbx::OutputStream, std::string_view) {};  // never read: not kept
    try {
      ctx_.entry->box()->exec_async("rm -f -- " + shell_quote(path), std::move(options));
    } catch (const std::exception& e) {
      spdlog::warn("sbx serve: removing {} in sandbox {}: {}", path, ctx_.entry->id, e.what());
    }
  }

  void finish() {
    if (!verbose_) {
      ctx_.ok();
      return;
    }
    json::object body;
    for (const auto& item : items_)
      body[item.path] = json::object{{"replacedCount", item.count}};
    ctx_.ok(body);
  }

  void transfer_failed(std::exception_ptr error, std::size_t i) const {
    const sbx::Error e = sbx::to_error(error);
    if (sandbox_gone(e, *ctx_.entry)) {
      ctx_.reply(sandbox_gone_response(ctx_.shape(), e, ctx_.entry->id));
    } else if (e.status() == SBX_STATUS_NOT_FOUND) {
      ctx_.not_found("file not found. open " + items_[i].path + ": no such file or directory");
    } else {
      ctx_.runtime_error("error accessing file: " + std::string(e.what()));
    }
  }

  const Ctx ctx_;
  std::vector<Item> items_;
  const bool verbose_;
  fs::path dir_;        // this call's directory in the server's temp dir
  uint64_t taken_ = 0;  // from the temp space, for the file being replaced
};

}  // namespace

void post_files_replace(const Call& call) {
  const Ctx ctx(call);
  const auto verbose = query_values(call.request, "verbose");
  const bool is_verbose = !verbose.empty() && verbose.front() == "true";
  const auto body = body_json(call, ctx);
  if (!body) return;
  if (!body->is_object()) {
    ctx.bad_request(invalid_body("the body must be an object {path: {old, new}}"));
    return;
  }
  std::vector<Replace::Item> items;
  for (const auto& [key, value] : body->as_object()) {
    Replace::Item item;
    item.path = std::string(key);
    const auto* o = value.if_object();
    const auto* old = o ? o->if_contains("old") : nullptr;
    const auto* repl = o ? o->if_contains("new") : nullptr;
    if (!o || (old && !old->is_string() && !old->is_null()) ||
        (repl && !repl->is_string() && !repl->is_null())) {
      ctx.bad_request(invalid_body("each replacement must be {\"old\": string, \"new\": string}"));
      return;
    }
    if (!old || !old->is_string() || old->as_string().empty()) {
      ctx.bad_request("old content must not be empty");
      return;
    }
    if (!usable_path(item.path)) {
      ctx.bad_request("invalid path: " + item.path);
      return;
    }
    item.old = std::string(old->as_string());
    if (repl && repl->is_string()) item.repl = std::string(repl->as_string());
    items.push_back(std::move(item));
  }
  if (items.empty()) {
    if (is_verbose) {
      ctx.ok(json::object{});
    } else {
      ctx.ok();
    }
    return;
  }
  // Step 1: one line per path: its size, "missing", or "other" (not a regular file).
  std::string script;
  for (const auto& item : items) {
    const std::string q = shell_quote(item.path);
    script += "if [ ! -e " + q + " ]; then echo missing; elif [ ! -f " + q +
              " ]; then echo other; else stat -L -c %s -- " + q + " || echo missing; fi\n";
  }
  run_script(ctx, std::move(script),
             [ctx, items, is_verbose](const sbx::ExecResult& result) mutable {
               const auto lines = lines_of(result.stdout_text);
               if (lines.size() != items.size()) {
                 ctx.runtime_error("stat in the sandbox failed: " + said(result));
                 return;
               }
               for (std::size_t i = 0; i < items.size(); ++i) {
                 const std::string& path = items[i].path;
                 if (lines[i] == "missing") {
                   ctx.not_found("file not found. stat " + path + ": no such file or directory");
                   return;
                 }
                 uint64_t size = 0;
                 const auto [end, ec] =
                     std::from_chars(lines[i].data(), lines[i].data() + lines[i].size(), size);
                 if (lines[i] == "other" || ec != std::errc() ||
                     end != lines[i].data() + lines[i].size()) {
                   ctx.runtime_error("error accessing file: " + path + " is not a regular file");
                   return;
                 }
                 if (size > kMaxReplaceBytes) {
                   ctx.runtime_error(too_large(path, size));
                   return;
                 }
                 items[i].size = size;
               }
               std::make_shared<Replace>(ctx, std::move(items), is_verbose)->start();
             });
}

// ----------------------------------------------------------------------------------------------
// GET /metrics (execd's, under the sandbox's execd path): {cpu_count, cpu_used_pct,
// mem_total_mib, mem_used_mib, timestamp} as execd's gopsutil reads them: the CPU's busy share
// between two reads of /proc/stat a second apart (the call takes a second, as execd's), the
// CPUs the sandbox's processes may use (nproc), memory from /proc/meminfo (used = total - free
// - buffers - cached - reclaimable slab). Inside a container /proc shows the host's CPU and
// memory unless the runtime virtualises it (as with execd). The numbers are written as Go writes
// float64 (4, 45.5), not as Boost.JSON writes doubles (4E0).

namespace {

// user+nice+system+idle+iowait+irq+softirq+steal, and idle+iowait, of /proc/stat's "cpu" line.
std::optional<std::pair<double, double>> cpu_times(const std::string& line) {
  std::istringstream in(line);
  std::string name;
  in >> name;
  if (name != "cpu") return std::nullopt;
  double total = 0, idle = 0, v = 0;
  for (int i = 0; i < 8 && in >> v; ++i) {
    total += v;
    if (i == 3 || i == 4) idle += v;
  }
  return std::make_pair(total, idle);
}

std::string go_number(double v) {
  if (!std::isfinite(v)) v = 0;
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : "0";
}

// Reads the sandbox's metrics (the read takes a second); `done` gets execd's JSON object, or
// why not, once, on a plugin thread (or at once when the exec cannot start). The read's
// operation, to cancel it (empty when it could not start).
sbx::Operation<sbx::ExecResult> read_metrics(
    const std::shared_ptr<Entry>& entry,
    std::function<void(std::optional<std::string> body, const std::string& error)> done) {
  const int64_t timestamp = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  const std::string script =
      "head -n 1 /proc/stat && sleep 1 && head -n 1 /proc/stat &&\n"
      "{ nproc 2>/dev/null || grep -c '^cpu[0-9]' /proc/stat; } && cat /proc/meminfo\n";
  sbx::ExecOptions options;
  options.timeout_s = kExecTimeoutS;
  std::shared_ptr<KeptExec> exec;
  try {
    exec = KeptExec::start(*entry->box(), script, std::move(options), kMaxMetricsOutput);
  } catch (const std::exception& e) {
    done(std::nullopt, e.what());
    return {};
  }
  exec->then([timestamp, done = std::move(done)](KeptExec& finished) {
    sbx::ExecResult result;
    try {
      result = finished.get();
    } catch (const std::exception& e) {
      done(std::nullopt, e.what());
      return;
    }
    const auto lines = lines_of(result.stdout_text);
    const auto first = lines.size() > 3 ? cpu_times(lines[0]) : std::nullopt;
    const auto second = lines.size() > 3 ? cpu_times(lines[1]) : std::nullopt;
    double cpus = 0;
    if (lines.size() > 3) std::from_chars(lines[2].data(), lines[2].data() + lines[2].size(), cpus);
    std::map<std::string, double> mem;  // kB
    for (std::size_t i = 3; i < lines.size(); ++i) {
      const auto colon = lines[i].find(':');
      if (colon == std::string::npos) continue;
      std::istringstream value(lines[i].substr(colon + 1));
      double kb = 0;
      if (value >> kb) mem[lines[i].substr(0, colon)] = kb;
    }
    if (result.timed_out() || result.error_type || result.return_code != 0 || !first || !second ||
        cpus <= 0 || !mem.count("MemTotal")) {
      done(std::nullopt, said(result));
      return;
    }
    const double total = second->first - first->first;
    const double busy = total - (second->second - first->second);
    const double pct = total > 0 ? std::clamp(busy / total * 100, 0.0, 100.0) : 0.0;
    const double mem_total = mem["MemTotal"];
    double used = mem_total - mem["MemFree"] - mem["Buffers"] - mem["Cached"] - mem["SReclaimable"];
    if (used < 0) used = mem_total - mem["MemFree"];
    done("{\"cpu_count\":" + go_number(cpus) + ",\"cpu_used_pct\":" + go_number(pct) +
             ",\"mem_total_mib\":" + go_number(mem_total / 1024) + ",\"mem_used_mib\":" +
             go_number(used / 1024) + ",\"timestamp\":" + std::to_string(timestamp) + "}",
         {});
  });
  return exec->operation();
}

}  // namespace

void get_execd_metrics(const Call& call) {
  const Ctx ctx(call);
  read_metrics(ctx.entry, [ctx](std::optional<std::string> body, const std::string& error) {
    if (!body) {
      ctx.runtime_error("error reading runtime metrics. " + error);
      return;
    }
    Response r{http::status::ok, ctx.version};
    r.set(http::field::content_type, "application/json; charset=utf-8");
    r.body() = std::move(*body);
    r.prepare_payload();
    ctx.reply(std::move(r));
  });
}

// ----------------------------------------------------------------------------------------------
// GET /metrics/watch: execd's metrics stream, one JSON object and a newline per read (execd
// writes no `data:` framing under its text/event-stream type), a read after the other, so a line
// comes each second; a read that fails gives {"error": "..."} and the next read a second later,
// as execd. One sampler per sandbox, shared by its watches: however many clients watch, one read
// runs in the sandbox at a time, and every watch gets the same lines from its first. A watch
// counts as an open stream (--max-streams, not a command: a stop does not wait for it), at most
// kMaxWatches per sandbox (429 TOO_MANY_WATCHES beyond). The stream ends when the client goes
// away, when the sandbox leaves the server (deleted, expired) or when the server stops; a client
// that lets more than kWatchBacklog bytes wait is cut. The sampler's read in flight is
// cancelled when its last watch goes.

namespace {

constexpr std::size_t kWatchBacklog = 64 * 1024;
constexpr std::size_t kMaxWatches = 64;

}  // namespace

class MetricsSampler : public std::enable_shared_from_this<MetricsSampler> {
 public:
  MetricsSampler(std::shared_ptr<Server::State> state, std::shared_ptr<Entry> entry)
      : state_(std::move(state)),
        entry_(std::move(entry)),
        timer_(asio::make_strand(state_->ioc)) {}

  // A watch: its stream, and what it holds until it leaves (its count in --max-streams).
  struct Watch {
    std::shared_ptr<ChunkSink> sink;
    std::shared_ptr<void> held;
  };
  enum class Join { ok, full, ended };
  // Opens a watch's stream (`open` sends the head) and adds it, unless this sampler has
  // kMaxWatches already (full) or stopped when its last watch went (ended: make another; `open`
  // was not called). Any thread.
  Join join(const std::function<std::shared_ptr<ChunkSink>()>& open, std::shared_ptr<void> held) {
    std::shared_ptr<ChunkSink> sink;
    bool first = false;
    {
      std::lock_guard lock(mutex_);
      if (ended_) return Join::ended;
      if (watches_.size() >= kMaxWatches) return Join::full;
      first = watches_.empty();
      sink = open();
      watches_.push_back(Watch{sink, std::move(held)});
    }
    // Weakly: the sink holds this callback and the sampler holds the sink.
    sink->on_gone([weak = weak_from_this(), raw = sink.get()] {
      if (const auto self = weak.lock()) self->leave(raw);
    });
    if (first) read();
    return Join::ok;
  }

 private:
  // Any thread.
  void read() {
    if (state_->gate.stopping() || state_->registry.find(entry_->id) != entry_) {
      end_all();
      return;
    }
    const auto started = std::chrono::steady_clock::now();
    auto op = read_metrics(entry_, [self = shared_from_this(), started](
                                       std::optional<std::string> body, const std::string& error) {
      self->sent(body ? std::move(*body)
                      : json::serialize(
                            json::object{{"error", "error reading runtime metrics. " + error}}),
                 started);
    });
    std::unique_lock lock(mutex_);
    if (!ended_) {
      reading_ = std::move(op);
      return;
    }
    lock.unlock();
    op.cancel();
  }

  // A read's line to every watch, then the next read, a second after this one started.
  void sent(std::string line, std::chrono::steady_clock::time_point started) {
    std::vector<std::shared_ptr<ChunkSink>> to;
    {
      std::lock_guard lock(mutex_);
      reading_ = {};
      if (ended_) return;
      for (const auto& w : watches_)
        to.push_back(w.sink);
    }
    line += "\n";
    for (const auto& sink : to) {
      if (sink->queued() > kWatchBacklog) {
        spdlog::warn("sbx serve: cutting a metrics watch: its client let more than {} bytes wait",
                     kWatchBacklog);
        sink->abort();  // then on_gone: leave()
      } else {
        sink->send(line);
      }
    }
    asio::post(timer_.get_executor(), [self = shared_from_this(), started] {
      self->timer_.expires_at(started + std::chrono::seconds(1));
      self->timer_.async_wait([self](boost::system::error_code ec) {
        if (!ec) self->read();
      });
    });
  }

  // A watch's client went away: the last one stops the sampler.
  void leave(ChunkSink* gone) {
    Watch left;
    {
      std::lock_guard lock(mutex_);
      const auto it = std::find_if(watches_.begin(), watches_.end(),
                                   [gone](const Watch& w) { return w.sink.get() == gone; });
      if (it == watches_.end()) return;
      left = std::move(*it);
      watches_.erase(it);
      if (!watches_.empty() || ended_) return;
    }
    end_all();
  }

  // Once: the read in flight cancelled, the timer stopped, every watch's stream ended. Any thread.
  void end_all() {
    sbx::Operation<sbx::ExecResult> op;
    std::vector<Watch> watches;
    {
      std::lock_guard lock(mutex_);
      if (ended_) return;
      ended_ = true;
      op = std::move(reading_);
      watches.swap(watches_);
    }
    if (op.valid()) op.cancel();
    asio::post(timer_.get_executor(), [self = shared_from_this()] { self->timer_.cancel(); });
    for (const auto& w : watches)
      w.sink->end();
  }

  const std::shared_ptr<Server::State> state_;
  const std::shared_ptr<Entry> entry_;
  asio::steady_timer timer_;  // on its own strand
  std::mutex mutex_;          // guards what follows
  bool ended_ = false;
  std::vector<Watch> watches_;
  sbx::Operation<sbx::ExecResult> reading_;
};

void get_execd_metrics_watch(const Call& call) {
  const auto& state = call.state;
  if (!admit_stream(*state, call.request, call.reply, false)) return;
  // The stream's count, given back when the watch leaves its sampler (or is refused).
  const std::shared_ptr<void> counted(nullptr, [state](void*) { state->gate.close_stream(); });
  const auto open = [&call] {
    Response head{http::status::ok, call.request.version()};
    head.set(http::field::content_type, "text/event-stream");
    head.set(http::field::cache_control, "no-cache");
    head.set("X-Accel-Buffering", "no");
    return call.open_stream(std::move(head), true);
  };
  Entry& entry = *call.entry;
  for (;;) {
    std::shared_ptr<MetricsSampler> sampler;
    {
      std::lock_guard lock(entry.metrics_mutex);
      sampler = entry.metrics_sampler.lock();
      if (!sampler) {
        sampler = std::make_shared<MetricsSampler>(state, call.entry);
        entry.metrics_sampler = sampler;
      }
    }
    switch (sampler->join(open, counted)) {
      case MetricsSampler::Join::ok:
        return;
      case MetricsSampler::Join::full:
        call.reply(execd_error(call.request, http::status::too_many_requests, "TOO_MANY_WATCHES",
                               "this sandbox has " + std::to_string(kMaxWatches) +
                                   " metrics watches open, the most it may; try again later"));
        return;
      case MetricsSampler::Join::ended: {  // its last watch just went: replace it
        std::lock_guard lock(entry.metrics_mutex);
        if (entry.metrics_sampler.lock() == sampler) entry.metrics_sampler.reset();
        break;
      }
    }
  }
}

}  // namespace sbx::serve
