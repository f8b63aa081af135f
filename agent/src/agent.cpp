// The agent's loop. Everything here runs on the one thread that called run(): no locks, no
// threads. Sources of events, all in one epoll set: the listeners, a signalfd (SIGCHLD, SIGTERM,
// SIGINT, and with an entrypoint the signals forwarded to it), the client connections, and the
// read ends of the commands' output pipes. Timers (pings, command timeouts, the expiry check, the
// entrypoint's stop grace) are an ordered set whose first entry bounds epoll_wait's timeout.
#include "agent.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "files.hpp"
#include "http.hpp"
#include "io.hpp"
#include "json.hpp"
#include "ring.hpp"
#include "users.hpp"
#include "ws.hpp"

extern char** environ;

namespace sbx::agent {

namespace {

constexpr std::size_t kMaxLine = 8 * 1024 * 1024;     // a longer line is sent in pieces
constexpr std::size_t kReadChunk = 64 * 1024;         // one read() from a pipe or a socket
constexpr std::size_t kPauseAbove = 4 * 1024 * 1024;  // unsent bytes that pause a command's output
constexpr std::size_t kResumeBelow = 1024 * 1024;     // ... and resume it
constexpr std::size_t kMaxLogRead = 4 * 1024 * 1024;  // one GET /command/{id}/logs answer
constexpr std::size_t kMaxContent = 64 * 1024;        // the command text kept for status
constexpr std::size_t kPiece = 128 * 1024;            // one read of a download from disk
constexpr int kPiecesPerWake = 8;  // a download's pieces per writable event (the others' turn)
// PTY sessions (agent/README.md, "PTY sessions").
constexpr std::size_t kMaxSessions = 64;               // sessions kept (running, exited, unstarted)
constexpr std::size_t kSessionRing = 1024 * 1024;      // output kept per session for replay
constexpr std::size_t kWsMaxFrame = 1024 * 1024;       // a client frame's payload, at most
constexpr std::size_t kWsMaxQueued = 4 * 1024 * 1024;  // unsent to a client: beyond, it is cut
constexpr std::size_t kMaxStdinPending = 1024 * 1024;  // stdin the shell has not read yet
constexpr int64_t kSessionDrainMs = 200;  // after the shell's exit: wait for its last output
// Bash sessions (agent/README.md, "Bash sessions").
constexpr std::size_t kMaxBashSessions = 256;  // POST /session beyond: 429 TOO_MANY_SESSIONS
constexpr const char* kDefaultPath =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
// Keys of the agent's own timers in the timer set: connections and commands take keys counting up
// from 1, so these cannot collide with them.
constexpr uint64_t kExpiryTimer = UINT64_MAX;     // the expiry check
constexpr uint64_t kGraceTimer = UINT64_MAX - 1;  // SIGKILL to an entrypoint that outlived SIGTERM
constexpr uint64_t kDrainTimer = UINT64_MAX - 2;  // the stop after the expiry, drained or not
constexpr int64_t kExpiryRetryMs = 1000;  // an unreadable expiry file, once expired: read again
constexpr int kExpiryRetries = 2;         // ... this many times before the last expiry seen counts
// After the expiry, how long the agent that stops may take to send the ends of the commands it
// killed (their clients learn that the sandbox expired, not that the agent vanished).
constexpr int64_t kExpiryDrainMs = 2000;
// What the agent forwards to the entrypoint's process group (what a container's PID 1 is sent).
constexpr int kForwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

int64_t mono_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

int64_t real_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// RFC 3339 with nanoseconds, as execd (Go) prints.
std::string rfc3339(int64_t ns) {
  const std::time_t secs = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(ns % 1000000000));
  return buf;
}

std::string stamp() {
  return ",\"timestamp\":" + std::to_string(real_ns() / 1000000);
}

// One event of the stream: a bare JSON object and a blank line (execd's framing).
std::string text_event(std::string_view type, std::string_view text) {
  std::string e = "{\"type\":\"";
  e += type;
  e += "\",\"text\":";
  json::append_string(e, text);
  e += stamp();
  e += "}\n\n";
  return e;
}

// `more`, when not empty, is a second line of the traceback (execd's has one).
std::string error_event(std::string_view evalue, std::string_view traceback,
                        std::string_view more = {}) {
  std::string e =
      "{\"type\":\"error\"" + stamp() + ",\"error\":{\"ename\":\"CommandExecError\",\"evalue\":";
  json::append_string(e, evalue);
  e += ",\"traceback\":[";
  json::append_string(e, traceback);
  if (!more.empty()) {
    e += ',';
    json::append_string(e, more);
  }
  e += "]}}\n\n";
  return e;
}

std::string complete_event(int64_t execution_ms) {
  return "{\"type\":\"execution_complete\",\"execution_time\":" + std::to_string(execution_ms) +
         stamp() + "}\n\n";
}

// sbx's byte-exact command stream (agent/README.md, "Frames"), asked for with `Accept:
// application/vnd.sbx.frames`: a kind byte, the payload's length (4 bytes, big-endian), the
// payload.
constexpr std::string_view kFramesType = "application/vnd.sbx.frames";

std::string frame(char kind, std::string_view payload) {
  std::string f;
  f.reserve(5 + payload.size());
  f += kind;
  const auto n = static_cast<uint32_t>(payload.size());
  for (int shift = 24; shift >= 0; shift -= 8)
    f += static_cast<char>((n >> shift) & 0xff);
  f += payload;
  return f;
}

// The environment variable that tags every process of a command (inherited by its children).
constexpr std::string_view kExecIdVar = "SBX_EXEC_ID";

// strerror's text as Go (and so execd) writes it: "argument list too long".
std::string errno_text(int error) {
  std::string text = std::strerror(error);
  if (!text.empty()) text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return text;
}

std::string error_body(std::string_view code, std::string_view message) {
  std::string b = "{\"code\":";
  json::append_string(b, code);
  b += ",\"message\":";
  json::append_string(b, message);
  b += "}";
  return b;
}

// Go's names for the signals a command most often dies of ("signal: killed").
std::string signal_text(int sig) {
  switch (sig) {
    case SIGKILL:
      return "signal: killed";
    case SIGTERM:
      return "signal: terminated";
    case SIGINT:
      return "signal: interrupt";
    case SIGHUP:
      return "signal: hangup";
    case SIGQUIT:
      return "signal: quit";
    case SIGABRT:
      return "signal: aborted";
    case SIGSEGV:
      return "signal: segmentation fault";
    case SIGBUS:
      return "signal: bus error";
    case SIGFPE:
      return "signal: floating point exception";
    case SIGPIPE:
      return "signal: broken pipe";
    case SIGXFSZ:
      return "signal: file size limit exceeded";
    default:
      return "signal: " + std::to_string(sig);
  }
}

// Compares without an early exit, so the time taken does not tell how much of a token matched.
bool equal_constant_time(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string new_id() {
  return files::random_hex(16);
}

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Output split into lines: '\n', '\r' and "\r\n" end one; an empty line is sent as "\n" (as execd
// does); a line longer than kMaxLine is sent in pieces.
class LineSplitter {
 public:
  template <typename Emit>
  void feed(std::string_view data, Emit&& emit) {
    while (!data.empty()) {
      if (after_cr_) {
        after_cr_ = false;
        if (data.front() == '\n') {  // the rest of a "\r\n"
          data.remove_prefix(1);
          continue;
        }
      }
      // A run of line bytes at once (one append per read, not one per byte), cut where the line
      // would pass kMaxLine.
      const std::size_t end = std::min(data.find_first_of("\r\n"), data.size());
      std::string_view run = data.substr(0, end);
      while (!run.empty()) {
        if (partial_.size() == kMaxLine) {  // only when the line goes on past the cap
          emit(std::string_view(partial_));
          partial_.clear();
        }
        const std::size_t take = std::min(run.size(), kMaxLine - partial_.size());
        partial_.append(run.substr(0, take));
        run.remove_prefix(take);
      }
      if (end == data.size()) return;
      after_cr_ = data[end] == '\r';
      emit(partial_.empty() ? std::string_view("\n") : std::string_view(partial_));
      partial_.clear();
      data.remove_prefix(end + 1);
    }
  }
  template <typename Emit>
  void flush(Emit&& emit) {
    if (!partial_.empty()) emit(std::string_view(partial_));
    partial_.clear();
  }

 private:
  std::string partial_;
  bool after_cr_ = false;
};

// The expiry file's content: decimal Unix seconds, possibly followed by white space (a newline).
// nullopt when it cannot be read or does not hold a positive number (say, a writer between its
// create and its write).
std::optional<int64_t> read_expiry_file(int dir, const std::string& name) {
  constexpr std::size_t kLimit = 64;  // a number and white space; longer is not an expiry
  const std::optional<std::string> text = read_file_at(dir, name, kLimit);
  if (!text) return std::nullopt;
  const char* buf = text->data();
  const std::size_t got = text->size();
  std::size_t i = 0;
  int64_t value = 0;
  for (; i < got && buf[i] >= '0' && buf[i] <= '9'; ++i) {
    if (value > (INT64_MAX - 9) / 10) return std::nullopt;
    value = value * 10 + (buf[i] - '0');
  }
  if (i == 0 || got == kLimit) return std::nullopt;
  for (; i < got; ++i)
    if (buf[i] != '\n' && buf[i] != '\r' && buf[i] != ' ' && buf[i] != '\t') return std::nullopt;
  if (value <= 0) return std::nullopt;
  return value;
}

// --user USER[:GROUP]: USER a name or a uid, GROUP a name or a gid. As Docker's --user: with a
// GROUP, that group alone (no supplementary groups from /etc/group).
std::optional<Identity> resolve_user_spec(const std::string& etc_dir, const std::string& spec,
                                          std::string& error) {
  const std::size_t colon = spec.find(':');
  auto identity = resolve_user(etc_dir, spec.substr(0, colon), error);
  if (!identity || colon == std::string::npos) return identity;
  const auto gid = resolve_group(etc_dir, spec.substr(colon + 1), error);
  if (!gid) return std::nullopt;
  identity->gid = *gid;
  identity->groups = {*gid};
  return identity;
}

enum class Kind { listener, signal, connection, pipe, session };

// What an epoll registration stands for: looked up by the registration's token, so an event for a
// closed fd (or an fd number reused within one batch) finds nothing instead of the wrong object.
struct Source {
  Kind kind;
  uint64_t key;    // the connection's or command's key; a listener's fd
  int stream = 0;  // a pipe: 0 stdout (or the combined output), 1 stderr; a session: its fds[i]
};

struct Connection {
  uint64_t key = 0;
  uint64_t token = 0;
  int fd = -1;
  std::string in;
  std::string out;
  std::size_t out_off = 0;
  bool want_out = false;
  bool have_head = false;
  bool sent_continue = false;
  bool closing = false;  // close once `out` is written
  bool dead = false;
  uint64_t command = 0;  // the command whose events it streams, 0 when none
  http::Request req;
  // POST /files/upload: the body goes to `upload` as it arrives; `body_left` bytes are still due
  // (with Content-Length), or `chunks` decodes it (chunked).
  std::unique_ptr<files::Upload> upload;
  uint64_t body_left = 0;
  http::ChunkedDecoder chunks;
  // GET /files/download: the file being sent, a piece at a time once `out` is written.
  std::optional<files::Download> download;
  // After a WebSocket upgrade (GET /pty/{id}/ws): the frames' parser, and the session attached
  // (0 once detached).
  std::optional<ws::Parser> ws;
  uint64_t session = 0;

  std::size_t pending() const { return out.size() - out_off; }
  // A response still going out that is not in `out` whole: no next request is read before it.
  bool busy() const { return command != 0 || download.has_value() || ws.has_value(); }
  ~Connection() {
    if (download && download->fd >= 0) ::close(download->fd);
  }
};

struct Command {
  uint64_t key = 0;
  std::string id;
  std::string content;
  bool background = false;
  pid_t pid = -1;
  bool running = false;
  bool killed = false;
  std::optional<int> exit_code;
  std::optional<std::string> error;
  int64_t started_ns = 0;
  int64_t finished_ns = 0;
  int64_t started_ms = 0;
  int64_t deadline_ms = 0;  // 0: no timeout
  int64_t last_event_ms = 0;
  int64_t timer_at = 0;  // the wake-up scheduled in timers_, 0 when none
  int fds[2] = {-1, -1};
  uint64_t tokens[2] = {0, 0};
  LineSplitter lines[2];
  bool frames = false;  // output as sbx frames (raw bytes), not execd's line events
  uid_t uid = 0;        // who it runs as
  gid_t gid = 0;
  bool timed_out = false;  // killed because its timeout passed
  bool expired = false;    // killed because the sandbox expired while it ran
  bool paused = false;
  uint64_t conn = 0;  // the streaming connection, 0 when none
  int log_fd = -1;
  std::string log_path;
  uint64_t log_size = 0;
};

// A PTY session: made by POST /pty, started by its first attach, kept until DELETE or until
// kMaxSessions pushes it out (agent/README.md, "PTY sessions").
struct Session {
  uint64_t key = 0;
  std::string id;
  std::string cwd;
  std::string command;                                    // empty: an interactive shell
  std::vector<std::pair<std::string, std::string>> envs;  // over a command's environment
  std::optional<Identity> identity;                       // who the shell runs as; none: the agent
  uint16_t rows = 24, cols = 80;                          // the terminal's size at the start
  bool tty = true;  // false: pipe mode (pty=0), stdout and stderr apart
  bool started = false;
  bool running = false;  // started and not ended
  bool exited = false;   // the shell was reaped (its output may still be drained)
  std::optional<int> exit_code;
  pid_t pid = -1;  // also its session and process group
  // tty: fds[0] the PTY's master (output and stdin); pipes: stdout, stderr, stdin.
  int fds[3] = {-1, -1, -1};
  uint64_t tokens[3] = {0, 0, 0};
  std::string stdin_pending;  // written to the shell once it reads
  Ring output{kSessionRing};
  uint64_t conn = 0;  // the attached WebSocket connection, 0 when none
  int64_t timer_at = 0;
};

// A bash session (POST /session): state, not a process. Each run is a command of its own whose
// script restores the session's saved state (exported variables, working directory) from a file
// in the state directory and saves it again after (agent/README.md, "Bash sessions").
struct BashSession {
  std::string id;
  std::string cwd;            // the session's directory (POST /session's cwd; may be empty)
  std::deque<uint64_t> runs;  // its runs still going (command keys), for DELETE to kill
};

struct Listener {
  int fd = -1;
  std::string unix_path;  // empty for TCP
  dev_t dev = 0;
  ino_t ino = 0;
};

// The parsed body of POST /command.
struct CommandRequest {
  std::string command;
  std::vector<std::string> argv;  // sbx extension: run this instead of `shell -c command`
  std::optional<std::string> cwd;
  bool background = false;
  int64_t timeout_ms = 0;
  std::vector<std::pair<std::string, std::string>> envs;
  std::optional<Identity> identity;
};

class Server {
 public:
  /// `entry_user`: who the entrypoint runs as (resolved from options.user), nullopt: the agent's
  /// own identity.
  Server(Options options, std::optional<Identity> entry_user)
      : opt_(std::move(options)), entry_user_(std::move(entry_user)) {}
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  ~Server() { shutdown(); }

  /// 0 when it serves; else the exit code for run() (the reason is on stderr).
  int start();
  void loop();
  /// What run() returns once loop() is back: 0, or the entrypoint's exit code.
  int exit_code() const { return exit_code_; }

 private:
  // Registration.
  uint64_t watch(int fd, uint32_t events, Source source);
  void rewatch(uint64_t token, int fd, uint32_t events);
  void unwatch(uint64_t& token, int fd);

  // Listening and connections.
  bool listen_on(const std::string& spec);
  void on_accept(int fd);
  void on_readable(Connection& c);
  void on_writable(Connection& c);
  void process_input(Connection& c);
  void handle(Connection& c);
  void send(Connection& c, std::string_view data);
  void reply(Connection& c, int status, std::string_view type, std::string_view body,
             const std::vector<std::string>& extra = {});
  void reply_error(Connection& c, int status, std::string_view code, std::string_view message);
  void fail_head(Connection& c, int status, std::string_view message);
  void close_conn(Connection& c);
  Connection* conn_of(uint64_t key);
  bool authorized(const http::Request& r) const;

  // Files.
  files::Context file_context() const { return {opt_.etc_dir, opt_.workdir}; }
  void begin_upload(Connection& c);
  void feed_upload(Connection& c);
  void get_download(Connection& c);
  bool next_piece(Connection& c);
  void get_info(Connection& c);

  // Commands.
  void post_command(Connection& c);
  /// Starts `req` as a command streaming to `c` (its init event's text: `init_text`, the command's
  /// id when empty); the command's key.
  uint64_t start_command(Connection& c, const CommandRequest& req, const std::string& init_text);
  std::optional<CommandRequest> read_command(const std::string& body, std::string& why);
  bool read_envs_and_user(const json::Value& v,
                          std::vector<std::pair<std::string, std::string>>& envs,
                          std::optional<Identity>& identity, std::string& why) const;
  std::optional<std::string> spawn(Command& cmd, const CommandRequest& req);
  void delete_command(Connection& c);
  void command_status(Connection& c, const std::string& id);
  void command_logs(Connection& c, const std::string& id);
  Command* command_of(uint64_t key);
  Command* command_by_id(const std::string& id);
  void emit(Command& cmd, std::string_view event);
  void emit_output(Command& cmd, int stream, std::string_view data);
  void on_pipe(Command& cmd, int stream, bool final_drain);
  void kill_group(Command& cmd);
  void kill_tagged(const std::string& id) const;
  void add_env_file(const std::function<void(const std::string&, const std::string&)>& set) const;
  /// A child's environment (agent/README.md, "Commands"): the agent's, EXECD_ENVS, HOME of
  /// `identity`, SBX_EXEC_ID=`id`, then `envs`.
  std::vector<std::string> child_env(
      const std::string& id, const std::optional<Identity>& identity,
      const std::vector<std::pair<std::string, std::string>>& envs) const;
  void on_exit(pid_t pid, int status);
  void finish(Command& cmd, int status);
  void fail_start(Command& cmd, const std::string& why);
  void retire(Command& cmd);
  void pause_output(Command& cmd, bool pause);
  void schedule(Command& cmd);
  void run_timers();
  int next_timeout() const;

  // PTY sessions.
  Session* session_of(uint64_t key);
  Session* session_by_id(const std::string& id);
  void post_pty(Connection& c);
  void pty_status(Connection& c, const std::string& id);
  void pty_delete(Connection& c, const std::string& id);
  void pty_attach(Connection& c, const std::string& id);
  void remove_session(Session& s, std::string_view reason = "session deleted");
  std::optional<std::string> spawn_session(Session& s);
  void on_session_fd(Session& s, int stream, uint32_t events);
  void read_session(Session& s, int stream, std::size_t budget);
  void session_exited(Session& s, int status);
  void end_session(Session& s);
  bool write_stdin(Session& s, std::string_view data);
  void flush_stdin(Session& s);
  void close_stdin(Session& s);  // pipe mode's, once its reader is gone
  void ws_send(Connection& c, uint8_t opcode, std::string_view payload);
  void ws_close(Connection& c, uint16_t code, std::string_view reason);
  void ws_readable(Connection& c);
  void ws_input(Connection& c);
  void ws_message(Connection& c, Session& s, const std::string& text);

  // Bash sessions.
  void post_bash_session(Connection& c);
  void bash_session_run(Connection& c, const std::string& id);
  void bash_session_delete(Connection& c, const std::string& id);
  std::string bash_state_path(const std::string& id) const;
  void remove_bash_state(const std::string& id) const;

  void on_signal();
  void shutdown();

  // PID-1 duties: the entrypoint and the expiry.
  int start_entrypoint();
  void signal_entrypoint(int sig);
  void check_expiry();
  void expire();
  /// Stops once the ends of the commands killed at the expiry are written (drained()), at most
  /// kExpiryDrainMs from now.
  void stop_when_drained();
  bool drained() const;
  /// The expiry as the end of a command that it cut short says it (finish()).
  std::string expired_text() const;

  Options opt_;
  std::optional<Identity> entry_user_;
  pid_t entry_pid_ = -1;  // also its process group; -1 without an entrypoint
  bool entry_running_ = false;
  int exit_code_ = 0;
  int64_t expiry_ = 0;  // the last expiry seen (Unix seconds), 0 none yet
  // The expiry file's directory, opened at the start (before any other process of the sandbox
  // runs), and the file's name in it: a directory renamed or replaced later changes nothing.
  int expiry_dir_ = -1;
  std::string expiry_name_;
  int expiry_retries_ = 0;
  bool expired_ = false;
  bool draining_ = false;  // stopping after the expiry, once drained()
  rlimit nofile_{};        // RLIMIT_NOFILE as the agent found it, given back to the entrypoint
  bool nofile_raised_ = false;
  int epfd_ = -1;
  int sigfd_ = -1;
  int reserve_fd_ = -1;  // given up to accept (and drop) a connection when out of fds
  bool stop_ = false;
  bool shut_ = false;
  bool made_state_dir_ = false;
  std::vector<std::string> base_env_;
  std::vector<Listener> listeners_;
  uint64_t next_token_ = 1;
  uint64_t next_key_ = 1;
  std::unordered_map<uint64_t, Source> sources_;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns_;
  std::unordered_map<uint64_t, std::unique_ptr<Command>> commands_;
  std::unordered_map<std::string, uint64_t> ids_;
  std::unordered_map<pid_t, uint64_t> pids_;  // commands' and sessions' shells
  std::unordered_map<uint64_t, std::unique_ptr<Session>> sessions_;
  std::unordered_map<std::string, uint64_t> session_ids_;
  std::unordered_map<std::string, BashSession> bash_sessions_;
  std::deque<uint64_t> finished_;
  std::set<std::pair<int64_t, uint64_t>> timers_;
  std::vector<uint64_t> dead_conns_;
  std::vector<uint64_t> resume_input_;  // connections whose stream ended: parse what they sent
};

uint64_t Server::watch(int fd, uint32_t events, Source source) {
  const uint64_t token = next_token_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return 0;
  sources_.emplace(token, source);
  return token;
}

void Server::rewatch(uint64_t token, int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  ::epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev);
}

void Server::unwatch(uint64_t& token, int fd) {
  if (token == 0) return;
  ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  sources_.erase(token);
  token = 0;
}

int Server::start() {
  // The children's environment: the agent's own (in a container, the image's ENV), without the
  // token, with a default PATH when there is none.
  bool have_path = false;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    if (entry.starts_with("SBX_AGENT_TOKEN=")) continue;
    if (entry.starts_with("PATH=")) have_path = true;
    base_env_.emplace_back(entry);
  }
  if (!have_path) base_env_.emplace_back(kDefaultPath);

  if (::getrlimit(RLIMIT_NOFILE, &nofile_) == 0 && nofile_.rlim_cur < nofile_.rlim_max) {
    rlimit raised = nofile_;
    raised.rlim_cur = raised.rlim_max;
    nofile_raised_ = ::setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  if (!opt_.entrypoint.empty())
    for (const int sig : kForwarded)
      sigaddset(&mask, sig);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  // Orphans of the commands (a `cmd &` whose shell exited) become the agent's children and are
  // reaped here, not left as zombies; as PID 1 this is implied.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  // Not dumpable: no process of the sandbox may ptrace the agent or read its memory (that takes
  // CAP_SYS_PTRACE, which Docker does not grant), e.g. to change the expiry it enforces. Its
  // commands are dumpable again once they exec.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  if (!opt_.expiry_file.empty()) {
    const std::size_t slash = opt_.expiry_file.rfind('/');
    const std::string dir =
        slash == std::string::npos ? "." : opt_.expiry_file.substr(0, slash + 1);
    expiry_name_ = opt_.expiry_file.substr(slash == std::string::npos ? 0 : slash + 1);
    expiry_dir_ = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (expiry_dir_ < 0) {
      std::fprintf(stderr,
                   "sbx-agent: cannot open the expiry file's directory %s (%s): the "
                   "expiry is --expires-at's\n",
                   dir.c_str(), std::strerror(errno));
    }
  }

  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  sigfd_ = ::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (epfd_ < 0 || sigfd_ < 0) {
    std::fprintf(stderr, "sbx-agent: epoll/signalfd: %s\n", std::strerror(errno));
    return 1;
  }
  watch(sigfd_, EPOLLIN, Source{Kind::signal, 0});
  reserve_fd_ = ::open("/", O_RDONLY | O_CLOEXEC);

  if (opt_.state_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/sbx-agent-XXXXXX";
    if (!::mkdtemp(templ.data())) {
      std::fprintf(stderr, "sbx-agent: cannot make a state directory %s: %s\n", templ.c_str(),
                   std::strerror(errno));
      return 1;
    }
    opt_.state_dir = templ;
    made_state_dir_ = true;
  } else if (::mkdir(opt_.state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "sbx-agent: cannot make %s: %s\n", opt_.state_dir.c_str(),
                 std::strerror(errno));
    return 1;
  }

  if (opt_.listen.empty()) {
    std::fprintf(stderr, "sbx-agent: nothing to listen on (--listen unix:PATH or tcp:HOST:PORT)\n");
    return 1;
  }
  for (const auto& spec : opt_.listen)
    if (!listen_on(spec)) return 1;

  // The entrypoint once the agent serves (a bad --listen does not start it), then the expiry: its
  // first check is due at once.
  if (!opt_.entrypoint.empty()) {
    if (const int code = start_entrypoint(); code != 0) return code;
  }
  if (opt_.expires_at > 0 || !opt_.expiry_file.empty()) {
    expiry_ = opt_.expires_at;
    timers_.emplace(mono_ms(), kExpiryTimer);
  }
  return 0;
}

bool Server::listen_on(const std::string& spec) {
  Listener l;
  if (spec.starts_with("unix:")) {
    const std::string path = spec.substr(5);
    sockaddr_un addr{};
    if (path.empty() || path.size() >= sizeof addr.sun_path) {
      std::fprintf(stderr, "sbx-agent: bad unix socket path '%s'\n", path.c_str());
      return false;
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        std::fprintf(stderr, "sbx-agent: refusing to replace %s: it is not a socket\n",
                     path.c_str());
        return false;
      }
      // A socket someone still answers on is not stale.
      const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const bool live =
          probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      if (probe >= 0) ::close(probe);
      if (live) {
        std::fprintf(stderr, "sbx-agent: %s is in use by another process\n", path.c_str());
        return false;
      }
      ::unlink(path.c_str());
    }
    l.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const mode_t old = ::umask(0177);  // born 0600: no window with a wider mode
    const int rc = l.fd < 0 ? -1 : ::bind(l.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::umask(old);
    if (rc != 0 || ::listen(l.fd, 1024) != 0 || ::lstat(path.c_str(), &st) != 0) {
      std::fprintf(stderr, "sbx-agent: cannot listen on %s: %s\n", path.c_str(),
                   std::strerror(errno));
      if (l.fd >= 0) ::close(l.fd);
      return false;
    }
    ::chmod(path.c_str(), 0600);
    l.unix_path = path;
    l.dev = st.st_dev;
    l.ino = st.st_ino;
  } else if (spec.starts_with("tcp:")) {
    const std::string rest = spec.substr(4);
    const std::size_t colon = rest.rfind(':');
    std::string host = colon == std::string::npos ? "" : rest.substr(0, colon);
    const std::string port_text = colon == std::string::npos ? "" : rest.substr(colon + 1);
    char* end = nullptr;
    const long port = std::strtol(port_text.c_str(), &end, 10);
    sockaddr_storage ss{};
    socklen_t len = 0;
    bool ok = !port_text.empty() && *end == '\0' && port >= 0 && port <= 65535;
    if (ok && host.size() > 2 && host.front() == '[' && host.back() == ']') {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
      a6->sin6_family = AF_INET6;
      a6->sin6_port = htons(static_cast<uint16_t>(port));
      ok = ::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a6->sin6_addr) == 1;
      len = sizeof *a6;
    } else if (ok) {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
      a4->sin_family = AF_INET;
      a4->sin_port = htons(static_cast<uint16_t>(port));
      ok = ::inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1;
      len = sizeof *a4;
    }
    if (!ok) {
      std::fprintf(stderr, "sbx-agent: bad TCP address '%s' (tcp:IPV4:PORT or tcp:[IPV6]:PORT)\n",
                   rest.c_str());
      return false;
    }
    l.fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (l.fd >= 0) ::setsockopt(l.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l.fd < 0 || ::bind(l.fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
        ::listen(l.fd, 1024) != 0) {
      std::fprintf(stderr, "sbx-agent: cannot listen on %s: %s\n", spec.c_str(),
                   std::strerror(errno));
      if (l.fd >= 0) ::close(l.fd);
      return false;
    }
  } else {
    std::fprintf(stderr, "sbx-agent: --listen takes unix:PATH or tcp:HOST:PORT, not '%s'\n",
                 spec.c_str());
    return false;
  }
  watch(l.fd, EPOLLIN, Source{Kind::listener, static_cast<uint64_t>(l.fd)});
  listeners_.push_back(l);
  return true;
}

void Server::loop() {
  epoll_event events[256];
  while (!stop_) {
    const int n = ::epoll_wait(epfd_, events, 256, next_timeout());
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "sbx-agent: epoll_wait: %s\n", std::strerror(errno));
      exit_code_ = 1;
      return;
    }
    for (int i = 0; i < n; ++i) {
      const auto it = sources_.find(events[i].data.u64);
      if (it == sources_.end()) continue;  // closed earlier in this batch
      const Source source = it->second;
      const uint32_t ev = events[i].events;
      switch (source.kind) {
        case Kind::listener:
          on_accept(static_cast<int>(source.key));
          break;
        case Kind::signal:
          on_signal();
          break;
        case Kind::connection:
          if (Connection* c = conn_of(source.key)) {
            if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) on_readable(*c);
            if (!c->dead && (ev & EPOLLOUT)) on_writable(*c);
          }
          break;
        case Kind::pipe:
          if (Command* cmd = command_of(source.key)) on_pipe(*cmd, source.stream, false);
          break;
        case Kind::session:
          if (Session* s = session_of(source.key)) on_session_fd(*s, source.stream, ev);
          break;
      }
    }
    run_timers();
    while (!resume_input_.empty()) {
      std::vector<uint64_t> keys;
      keys.swap(resume_input_);
      for (uint64_t key : keys)
        if (Connection* c = conn_of(key)) process_input(*c);
    }
    for (uint64_t key : dead_conns_)
      conns_.erase(key);
    dead_conns_.clear();
    if (draining_ && drained()) stop_ = true;
  }
}

void Server::on_signal() {
  signalfd_siginfo info[16];
  bool child = false;
  for (;;) {
    const ssize_t n = ::read(sigfd_, info, sizeof info);
    if (n <= 0) break;
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) / sizeof info[0]; ++i) {
      const int sig = static_cast<int>(info[i].ssi_signo);
      if (sig == SIGCHLD) {
        child = true;
      } else if (!opt_.entrypoint.empty()) {
        // The entrypoint decides what a stop request means; its exit stops the agent.
        if (entry_running_) signal_entrypoint(sig);
      } else if (sig == SIGTERM || sig == SIGINT) {
        stop_ = true;
      }
    }
  }
  if (!child) return;
  // Signals coalesce: reap until there is nothing left, commands and adopted orphans alike.
  for (;;) {
    // The entrypoint's exit is seen before it is reaped: what is left of its process group goes
    // with it, as a container's processes go with its main process, while its id is still its
    // own (once reaped, the id may be another process's).
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid <= 0) break;
    if (info.si_pid == entry_pid_) signal_entrypoint(SIGKILL);
    int status = 0;
    const pid_t pid = ::waitpid(info.si_pid, &status, WNOHANG);
    if (pid <= 0) break;
    on_exit(pid, status);
  }
}

void Server::on_accept(int lfd) {
  for (;;) {
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && reserve_fd_ >= 0) {
        // Out of fds: accept and drop one connection so the listener does not spin.
        close_fd(reserve_fd_);
        const int drop = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (drop >= 0) ::close(drop);
        reserve_fd_ = ::open("/", O_RDONLY | O_CLOEXEC);
        continue;
      }
      return;  // EAGAIN, or an error for this one connection
    }
    auto c = std::make_unique<Connection>();
    c->key = next_key_++;
    c->fd = fd;
    c->token = watch(fd, EPOLLIN | EPOLLRDHUP, Source{Kind::connection, c->key});
    if (c->token == 0) {
      ::close(fd);
      continue;
    }
    conns_.emplace(c->key, std::move(c));
  }
}

Connection* Server::conn_of(uint64_t key) {
  const auto it = conns_.find(key);
  return it == conns_.end() || it->second->dead ? nullptr : it->second.get();
}

Command* Server::command_of(uint64_t key) {
  const auto it = commands_.find(key);
  return it == commands_.end() ? nullptr : it->second.get();
}

Command* Server::command_by_id(const std::string& id) {
  const auto it = ids_.find(id);
  return it == ids_.end() ? nullptr : command_of(it->second);
}

void Server::close_conn(Connection& c) {
  if (c.dead) return;
  c.dead = true;
  if (Command* cmd = command_of(c.command)) {
    // The client went away mid-stream: nobody will read the command's output.
    cmd->conn = 0;
    if (cmd->running) kill_group(*cmd);
    if (cmd->paused) pause_output(*cmd, false);
    schedule(*cmd);
  }
  c.command = 0;
  if (Session* s = session_of(c.session); s && s->conn == c.key) s->conn = 0;  // detached
  c.session = 0;
  c.upload.reset();  // a body that did not arrive whole: its temp files go now
  if (c.download) close_fd(c.download->fd);
  c.download.reset();
  unwatch(c.token, c.fd);
  close_fd(c.fd);
  dead_conns_.push_back(c.key);
}

void Server::on_readable(Connection& c) {
  if (c.ws) {
    ws_readable(c);
    return;
  }
  char buf[kReadChunk];
  for (int round = 0; round < 4; ++round) {
    const ssize_t n = ::read(c.fd, buf, sizeof buf);
    if (n > 0) {
      c.in.append(buf, static_cast<std::size_t>(n));
      if (c.in.size() > opt_.max_head + opt_.max_body + kReadChunk) {
        // A client that sends while it is being streamed to (or floods): more than one request.
        close_conn(c);
        return;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n == 0 && !c.command && !c.closing) {
      // The client finished sending (a half-close): answer what it sent, then close. A stream
      // started by it has nobody to go to and ends like a client gone.
      process_input(c);
      if (c.dead) return;
      if (!c.command) {
        c.closing = true;
        if (c.pending() == 0 && !c.download) {
          close_conn(c);
        } else {
          c.want_out = true;
          rewatch(c.token, c.fd, EPOLLOUT);  // no EPOLLIN: it would report the EOF forever
        }
        return;
      }
    }
    close_conn(c);  // EOF or a reset: the client is gone (a streamed command is killed)
    return;
  }
  if (!c.busy()) process_input(c);
}

void Server::on_writable(Connection& c) {
  for (int piece = 0;; ++piece) {
    while (c.pending() > 0) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.pending(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out_off += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      close_conn(c);
      return;
    }
    // A download's next piece once the last is written: at most one piece in memory, and a few
    // pieces per event so that other connections get their turn.
    if (c.pending() > 0 || !c.download || piece == kPiecesPerWake) break;
    c.out.clear();
    c.out_off = 0;
    if (!next_piece(c)) return;
  }
  if (c.pending() == 0) {
    c.out.clear();
    c.out_off = 0;
    if (c.closing && !c.download) {
      close_conn(c);
      return;
    }
    if (c.want_out && !c.download) {
      c.want_out = false;
      rewatch(c.token, c.fd, EPOLLIN | EPOLLRDHUP);
    }
  } else if (c.out_off > 1024 * 1024) {
    c.out.erase(0, c.out_off);
    c.out_off = 0;
  }
  if (c.download && !c.want_out) {
    c.want_out = true;
    rewatch(c.token, c.fd,
            c.closing ? static_cast<uint32_t>(EPOLLOUT) : EPOLLIN | EPOLLRDHUP | EPOLLOUT);
  }
  if (c.pending() < kResumeBelow)
    if (Command* cmd = command_of(c.command); cmd && cmd->paused) pause_output(*cmd, false);
}

void Server::send(Connection& c, std::string_view data) {
  if (c.dead || data.empty()) return;
  c.out.append(data);
  if (!c.want_out) {
    on_writable(c);
    if (c.dead || c.pending() == 0) return;
    c.want_out = true;
    rewatch(c.token, c.fd, EPOLLIN | EPOLLRDHUP | EPOLLOUT);
  }
  if (c.pending() > kPauseAbove)
    if (Command* cmd = command_of(c.command); cmd && !cmd->paused) pause_output(*cmd, true);
}

void Server::reply(Connection& c, int status, std::string_view type, std::string_view body,
                   const std::vector<std::string>& extra) {
  const bool keep = c.req.keep_alive && !c.closing;
  send(c, http::response(status, type, body, keep, extra));
  if (!keep) {
    c.closing = true;
    if (!c.dead && c.pending() == 0) close_conn(c);
  }
}

void Server::reply_error(Connection& c, int status, std::string_view code,
                         std::string_view message) {
  reply(c, status, "application/json; charset=utf-8", error_body(code, message));
}

void Server::fail_head(Connection& c, int status, std::string_view message) {
  // The stream is out of step (an unread body, a broken head): answer and close.
  c.closing = true;
  c.req.keep_alive = false;
  send(c, http::response(status, "application/json; charset=utf-8",
                         error_body("INVALID_REQUEST", message), false));
  if (!c.dead && c.pending() == 0) close_conn(c);
}

void Server::process_input(Connection& c) {
  while (!c.dead && !c.closing && !c.busy()) {
    if (c.upload) {
      feed_upload(c);
      if (c.upload) return;  // more of its body is due
      continue;
    }
    if (!c.have_head) {
      const std::size_t end = c.in.find("\r\n\r\n");
      if (end == std::string::npos || end + 4 > opt_.max_head) {
        if (end != std::string::npos || c.in.size() > opt_.max_head) {
          fail_head(c, 431,
                    "the request head is larger than " + std::to_string(opt_.max_head) + " bytes");
        }
        return;
      }
      c.req = http::Request{};
      if (const auto err = http::parse_head(std::string_view(c.in).substr(0, end + 4), c.req)) {
        fail_head(c, err->status, err->message);
        return;
      }
      if (c.req.method == "POST" && c.req.path == "/files/upload") {
        // Streamed to disk as it arrives: the body limit does not apply.
        c.in.erase(0, end + 4);
        c.have_head = true;
        c.sent_continue = false;
        begin_upload(c);
        continue;
      }
      if (c.req.chunked) {
        fail_head(c, 411, "a chunked request body is taken by uploads only: send Content-Length");
        return;
      }
      if (c.req.content_length > opt_.max_body) {
        fail_head(c, 413,
                  "the request body is larger than " + std::to_string(opt_.max_body) + " bytes");
        return;
      }
      c.in.erase(0, end + 4);
      c.have_head = true;
      c.sent_continue = false;
    }
    if (c.in.size() < c.req.content_length) {
      if (c.req.expect_continue && !c.sent_continue) {
        c.sent_continue = true;
        send(c, "HTTP/1.1 100 Continue\r\n\r\n");
      }
      return;
    }
    c.req.body = c.in.substr(0, c.req.content_length);
    c.in.erase(0, c.req.content_length);
    c.have_head = false;
    handle(c);
  }
}

void Server::handle(Connection& c) {
  const http::Request& r = c.req;
  const bool is_ping = r.path == "/ping";
  if (!authorized(r)) {
    reply(c, 401, "application/json; charset=utf-8",
          "{\"error\":\"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN\"}");
    return;
  }
  // An expired sandbox is gone: it starts, shows and transfers nothing more, in the moment before
  // the agent stops (or, with an entrypoint, during its stop grace).
  if (expired_ && !is_ping) {
    reply_error(c, 410, "SANDBOX_EXPIRED", expired_text());
    return;
  }
  auto method_not_allowed = [&] {
    reply_error(c, 405, "NOT_SUPPORTED", "method " + r.method + " is not allowed on " + r.path);
  };
  if (is_ping) {
    if (r.method == "GET" || r.method == "HEAD") {
      reply(c, 200, "", "");
    } else {
      method_not_allowed();
    }
    return;
  }
  if (r.path == "/command") {
    if (r.method == "POST") {
      post_command(c);
    } else if (r.method == "DELETE") {
      delete_command(c);
    } else {
      method_not_allowed();
    }
    return;
  }
  if (r.path == "/files/download" || r.path == "/files/info" || r.path == "/files/upload") {
    if (r.method != "GET" || r.path == "/files/upload") return method_not_allowed();
    if (r.path == "/files/download") {
      get_download(c);
    } else {
      get_info(c);
    }
    return;
  }
  if (r.path == "/pty") {
    if (r.method != "POST") return method_not_allowed();
    post_pty(c);
    return;
  }
  if (r.path.starts_with("/pty/") && r.path.size() > 5) {
    std::string id = r.path.substr(5);
    const bool attach = id.ends_with("/ws");
    if (attach) id.resize(id.size() - 3);
    if (!id.empty() && id.find('/') == std::string::npos) {
      if (attach) {
        if (r.method != "GET") return method_not_allowed();
        pty_attach(c, id);
      } else if (r.method == "GET") {
        pty_status(c, id);
      } else if (r.method == "DELETE") {
        pty_delete(c, id);
      } else {
        method_not_allowed();
      }
      return;
    }
  }
  if (r.path == "/session") {
    if (r.method != "POST") return method_not_allowed();
    post_bash_session(c);
    return;
  }
  if (r.path.starts_with("/session/") && r.path.size() > 9) {
    std::string id = r.path.substr(9);
    const bool run = id.ends_with("/run");
    if (run) id.resize(id.size() - 4);
    if (!id.empty() && id.find('/') == std::string::npos) {
      if (run) {
        if (r.method != "POST") return method_not_allowed();
        bash_session_run(c, id);
      } else if (r.method == "DELETE") {
        bash_session_delete(c, id);
      } else {
        method_not_allowed();
      }
      return;
    }
  }
  constexpr std::string_view kStatus = "/command/status/";
  constexpr std::string_view kLogs = "/logs";
  const std::string_view path = r.path;
  if (path.starts_with(kStatus) && path.size() > kStatus.size() &&
      path.find('/', kStatus.size()) == std::string_view::npos) {
    if (r.method != "GET") return method_not_allowed();
    command_status(c, std::string(path.substr(kStatus.size())));
    return;
  }
  if (path.starts_with("/command/") && path.ends_with(kLogs) &&
      path.size() > std::string_view("/command/").size() + kLogs.size()) {
    const std::string_view id = path.substr(9, path.size() - 9 - kLogs.size());
    if (id.find('/') == std::string_view::npos) {
      if (r.method != "GET") return method_not_allowed();
      command_logs(c, std::string(id));
      return;
    }
  }
  reply_error(c, 404, "NOT_FOUND", "no route " + r.method + " " + r.path);
}

bool Server::authorized(const http::Request& r) const {
  if (opt_.token.empty() || (r.path == "/ping" && r.method == "GET")) return true;
  const std::string* token = r.header("x-execd-access-token");
  return token && equal_constant_time(*token, opt_.token);
}

void Server::begin_upload(Connection& c) {
  // Decided from the head alone, before a byte is written: a refusal closes the connection, since
  // the body it leaves unread would be taken for the next request.
  auto refuse = [&](int status, std::string_view body) {
    c.req.keep_alive = c.req.keep_alive && c.req.content_length == 0 && !c.req.chunked;
    reply(c, status, "application/json; charset=utf-8", body);
    c.have_head = false;
  };
  if (!authorized(c.req)) {
    refuse(401, "{\"error\":\"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN\"}");
    return;
  }
  if (expired_) {
    refuse(410, error_body("SANDBOX_EXPIRED", expired_text()));
    return;
  }
  const std::string* type = c.req.header("content-type");
  const auto boundary = files::multipart_boundary(type ? *type : "");
  if (!boundary) {
    refuse(400, error_body("INVALID_FILE", "the body must be multipart/form-data with a boundary"));
    return;
  }
  c.upload = std::make_unique<files::Upload>(*boundary, file_context());
  c.body_left = c.req.content_length;
  c.chunks = {};
  if (c.req.expect_continue && (c.req.chunked ? c.in.empty() : c.body_left > c.in.size())) {
    c.sent_continue = true;
    send(c, "HTTP/1.1 100 Continue\r\n\r\n");
  }
}

void Server::feed_upload(Connection& c) {
  // Written to disk as it arrives (blocking writes of at most what one readable event read).
  if (c.req.chunked) {
    // A chunked body may end before its multipart does: a client that cannot finish (its source
    // failed, it was cancelled) ends it early and is answered once the temp files are gone.
    c.in.erase(0, c.chunks.feed(c.in, [&](std::string_view data) { c.upload->feed(data); }));
    if (const char* error = c.chunks.error()) {
      c.upload.reset();
      c.have_head = false;
      fail_head(c, 400, std::string("malformed chunked body: ") + error);
      return;
    }
    if (!c.chunks.done()) return;
  } else {
    const std::size_t take = static_cast<std::size_t>(std::min<uint64_t>(c.in.size(), c.body_left));
    if (take > 0) {
      c.upload->feed(std::string_view(c.in).substr(0, take));
      c.in.erase(0, take);
      c.body_left -= take;
    }
    if (c.body_left > 0) return;
  }
  const auto failure = c.upload->finish();
  c.upload.reset();
  c.have_head = false;
  if (failure) {
    reply_error(c, failure->status, failure->code, failure->message);
  } else {
    reply(c, 200, "", "");
  }
}

void Server::get_download(Connection& c) {
  const std::string* path = c.req.query_value("path");
  if (!path || path->empty()) {
    reply_error(c, 400, "MISSING_QUERY", "missing query parameter 'path'");
    return;
  }
  files::Failure failure;
  auto d = files::open_download(file_context(), *path, c.req.header("range"),
                                c.req.keep_alive && !c.closing, failure);
  if (!d) {
    reply(c, failure.status, "application/json; charset=utf-8",
          error_body(failure.code, failure.message), failure.headers);
    return;
  }
  std::string head = std::move(d->head);
  if (d->length == 0) {  // an empty file (or range): the head is the whole answer
    ::close(d->fd);
    send(c, head);
    if (!c.req.keep_alive) {
      c.closing = true;
      if (!c.dead && c.pending() == 0) close_conn(c);
    }
    return;
  }
  c.download = std::move(*d);
  send(c, head);
  if (!c.dead && !c.want_out) on_writable(c);  // the head went at once: start the pieces
}

bool Server::next_piece(Connection& c) {
  files::Download& d = *c.download;
  const std::size_t want = static_cast<std::size_t>(std::min<uint64_t>(d.length, kPiece));
  c.out.resize(want);
  ssize_t n = -1;
  do {
    n = ::pread(d.fd, c.out.data(), want, static_cast<off_t>(d.offset));
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    // The file shrank under us: the promised Content-Length cannot be kept, so the connection is
    // cut (the client sees a short body, not a wrong one).
    c.out.clear();
    close_conn(c);
    return false;
  }
  c.out.resize(static_cast<std::size_t>(n));
  d.offset += static_cast<uint64_t>(n);
  d.length -= static_cast<uint64_t>(n);
  if (d.length == 0) {  // the last piece is in `out`: the next request may be read
    close_fd(d.fd);
    c.download.reset();
    if (!c.req.keep_alive) {
      c.closing = true;
    } else {
      resume_input_.push_back(c.key);
    }
  }
  return true;
}

void Server::get_info(Connection& c) {
  std::vector<std::string> paths;
  for (const auto& [k, v] : c.req.query)
    if (k == "path") paths.push_back(v);
  if (paths.empty()) {
    reply_error(c, 400, "MISSING_QUERY", "missing query parameter 'path'");
    return;
  }
  files::Failure failure;
  const auto body = files::info(file_context(), paths, failure);
  if (!body) {
    reply_error(c, failure.status, failure.code, failure.message);
    return;
  }
  reply(c, 200, "application/json; charset=utf-8", *body);
}

// A body's "envs" (an object of strings) and who runs the child: "user" (USER[:GROUP], a name or
// a uid) or "uid" with an optional "gid". False, with `why`, for a bad field.
bool Server::read_envs_and_user(const json::Value& v,
                                std::vector<std::pair<std::string, std::string>>& envs,
                                std::optional<Identity>& identity, std::string& why) const {
  using K = json::Value::Kind;
  auto present = [&](const char* name) {
    const json::Value* f = v.find(name);
    return f && f->kind != K::null ? f : nullptr;
  };
  auto id_number = [&](const json::Value& f, const char* name) -> std::optional<uint32_t> {
    if (f.kind != K::number || !f.integer_ok || f.integer < 0 || f.integer > UINT32_MAX) {
      why = std::string("invalid request body: ") + name + " must be a non-negative integer";
      return std::nullopt;
    }
    return static_cast<uint32_t>(f.integer);
  };
  if (const json::Value* given = present("envs")) {
    if (given->kind != K::object) {
      why = "invalid request body: envs must be an object of strings";
      return false;
    }
    for (const auto& [k, val] : given->members) {
      if (val.kind != K::string) {
        why = "invalid request body: envs." + k + " must be a string";
        return false;
      }
      if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
          val.text.find('\0') != std::string::npos) {
        why = "invalid request body: bad environment variable name or value: " + k;
        return false;
      }
      envs.emplace_back(k, val.text);
    }
  }
  std::optional<uint32_t> uid, gid;
  if (const json::Value* f = present("uid")) {
    if (!(uid = id_number(*f, "uid"))) return false;
  }
  if (const json::Value* f = present("gid")) {
    if (!(gid = id_number(*f, "gid"))) return false;
  }
  const json::Value* user = present("user");
  if (user && uid) {
    why = "invalid request body: give user or uid, not both";
    return false;
  }
  if (gid && !uid && !user) {
    why = "invalid request body: gid requires uid";
    return false;
  }
  if (user) {
    std::string name;
    if (user->kind == K::string) {
      name = user->text;
    } else if (user->kind == K::number && user->integer_ok && user->integer >= 0 &&
               user->integer <= UINT32_MAX) {
      name = std::to_string(user->integer);
    } else {
      why = "invalid request body: user must be a user name or a uid";
      return false;
    }
    // USER[:GROUP], as Docker's --user (an sbx extension; execd takes a name or a uid).
    std::string error;
    identity = resolve_user_spec(opt_.etc_dir, name, error);
    if (!identity) {
      why = "invalid request body: " + error;
      return false;
    }
    if (gid) {
      identity->gid = *gid;
      identity->groups.insert(identity->groups.begin(), *gid);
    }
  } else if (uid) {
    identity = resolve_uid(opt_.etc_dir, *uid, gid);
  }
  return true;
}

std::optional<CommandRequest> Server::read_command(const std::string& body, std::string& why) {
  json::Value v;
  if (!json::parse(body, v, why)) {
    why = "invalid request body: " + why;
    return std::nullopt;
  }
  if (v.kind != json::Value::Kind::object) {
    why = "invalid request body: the body must be a JSON object";
    return std::nullopt;
  }
  using K = json::Value::Kind;
  auto present = [&](const char* name) {
    const json::Value* f = v.find(name);
    return f && f->kind != K::null ? f : nullptr;
  };
  CommandRequest out;
  // argv (an sbx extension): the program and its arguments, run without a shell.
  if (const json::Value* argv = present("argv")) {
    if (argv->kind != K::array || argv->items.empty()) {
      why = "invalid request body: argv must be a non-empty array of strings";
      return std::nullopt;
    }
    for (const json::Value& item : argv->items) {
      if (item.kind != K::string || item.text.find('\0') != std::string::npos) {
        why = "invalid request body: argv must be strings without NUL characters";
        return std::nullopt;
      }
      out.argv.push_back(item.text);
    }
    if (out.argv[0].empty()) {
      why = "invalid request body: argv[0] is empty";
      return std::nullopt;
    }
  }
  const json::Value* command = present("command");
  if (out.argv.empty() && (!command || command->kind != K::string || command->text.empty())) {
    why = "invalid request body: command is required (a non-empty string)";
    return std::nullopt;
  }
  if (command && command->kind == K::string) out.command = command->text;
  if (out.argv.empty() && out.command.find('\0') != std::string::npos) {
    why = "invalid request body: command contains a NUL character";
    return std::nullopt;
  }
  if (out.command.empty()) {  // what status reports as the command's content
    for (const auto& a : out.argv)
      out.command += (out.command.empty() ? "" : " ") + a;
  }
  if (const json::Value* cwd = present("cwd")) {
    if (cwd->kind != K::string) {
      why = "invalid request body: cwd must be a string";
      return std::nullopt;
    }
    if (!cwd->text.empty()) out.cwd = cwd->text;
  }
  if (const json::Value* bg = present("background")) {
    if (bg->kind != K::boolean) {
      why = "invalid request body: background must be a boolean";
      return std::nullopt;
    }
    out.background = bg->boolean;
  }
  if (const json::Value* t = present("timeout")) {
    if (t->kind != K::number || !t->integer_ok || t->integer < 0) {
      why = "invalid request body: timeout must be a non-negative integer (milliseconds)";
      return std::nullopt;
    }
    out.timeout_ms = t->integer;
  }
  if (!read_envs_and_user(v, out.envs, out.identity, why)) return std::nullopt;
  if (out.cwd) {
    struct stat st {};
    if (::stat(out.cwd->c_str(), &st) != 0) {
      why = "invalid request body: cwd " + *out.cwd + ": " + std::strerror(errno);
      return std::nullopt;
    }
    if (!S_ISDIR(st.st_mode)) {
      why = "invalid request body: cwd " + *out.cwd + " is not a directory";
      return std::nullopt;
    }
  }
  return out;
}

void Server::post_command(Connection& c) {
  std::string why;
  const auto req = read_command(c.req.body, why);
  if (!req) {
    reply_error(c, 400, "INVALID_REQUEST_BODY", why);
    return;
  }
  start_command(c, *req, {});
}

uint64_t Server::start_command(Connection& c, const CommandRequest& request,
                               const std::string& init_text) {
  const CommandRequest* req = &request;
  auto owned = std::make_unique<Command>();
  Command& cmd = *owned;
  cmd.key = next_key_++;
  const uint64_t key = cmd.key;  // `cmd` may be gone after retire()
  cmd.id = new_id();
  cmd.content = req->command.substr(0, kMaxContent);
  cmd.background = req->background;
  const std::string* accept = c.req.header("accept");
  cmd.frames = !cmd.background && accept && accept->find(kFramesType) != std::string::npos;
  cmd.started_ns = real_ns();
  cmd.started_ms = mono_ms();
  cmd.last_event_ms = cmd.started_ms;
  commands_.emplace(cmd.key, std::move(owned));
  ids_.emplace(cmd.id, cmd.key);

  // The response is committed from here on: every outcome is an event.
  if (cmd.frames) {
    send(c, http::stream_head(kFramesType));
    send(c, http::chunk(frame('i', init_text.empty() ? cmd.id : init_text)));
  } else {
    send(c, http::stream_head());
    send(c, http::chunk(text_event("init", init_text.empty() ? cmd.id : init_text)));
    send(c, http::chunk(text_event("ping", "pong")));
  }
  if (c.dead) {  // gone before the command started: do not start it
    cmd.error = "the client disconnected";
    cmd.finished_ns = real_ns();
    retire(cmd);
    return key;
  }
  cmd.conn = c.key;
  c.command = cmd.key;

  std::optional<std::string> failed;
  if (req->argv.empty() && ::access(opt_.shell.c_str(), X_OK) != 0) {
    failed = opt_.shell + ": " + std::strerror(errno) +
             ": a shell is needed to run a command, and this sandbox's image has none";
  } else {
    failed = spawn(cmd, *req);
  }
  if (failed) {
    fail_start(cmd, *failed);
    return key;
  }
  if (cmd.background) {
    emit(cmd, complete_event(mono_ms() - cmd.started_ms));
    send(c, http::kLastChunk);
    cmd.conn = 0;
    c.command = 0;
    if (!c.req.keep_alive) {
      c.closing = true;
      if (c.pending() == 0) close_conn(c);
    }
  }
  schedule(cmd);
  return key;
}

void Server::fail_start(Command& cmd, const std::string& why) {
  close_fd(cmd.log_fd);
  cmd.error = why;
  cmd.exit_code = -1;
  cmd.finished_ns = real_ns();
  Connection* c = conn_of(cmd.conn);
  if (c) {
    std::string end = "{\"error\":";
    json::append_string(end, why);
    emit(cmd, cmd.frames ? frame('x', end + "}") : error_event(why, why));
    send(*c, http::kLastChunk);
    c->command = 0;
    if (!c->req.keep_alive) {
      c->closing = true;
      if (c->pending() == 0) close_conn(*c);
    }
  }
  cmd.conn = 0;
  retire(cmd);
}

// What the child reports through its close-on-exec pipe when it fails before execve.
struct ChildFailure {
  int stage;  // 0 setgroups, 1 setgid, 2 setuid, 3 chdir, 4 execve
  int error;
};

// In a forked child, before its execve (system calls only): stdin at end of file at once (no
// /dev/null needed), then who it runs as. The step that failed, or stage -1.
// In the parent, after the fork: the child's process group made here too (so a signal right after
// this cannot miss it), then a wait for its execve (the close-on-exec pipe `report` closes) or the
// failure it wrote there; microseconds. Closes `report`. Stage -1 when the execve happened.
ChildFailure await_exec(pid_t pid, int report, bool set_group = true) {
  if (set_group) ::setpgid(pid, pid);  // not for a session leader (it makes its own, by setsid)
  ChildFailure f{-1, 0};
  ssize_t got = 0;
  do {
    got = ::read(report, &f, sizeof f);
  } while (got < 0 && errno == EINTR);
  ::close(report);
  return got == static_cast<ssize_t>(sizeof f) ? f : ChildFailure{-1, 0};
}

// Who a child becomes, prepared before the fork. No switch without an identity, or when the agent
// is not root and is asked to stay who it is (setgroups would fail).
struct ChildUser {
  bool needed = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

ChildUser child_user(const std::optional<Identity>& who) {
  if (!who) return {};
  return {!(::geteuid() != 0 && who->uid == ::geteuid() && who->gid == ::getegid()), who->uid,
          who->gid, who->groups};
}

// The places execvp tries for `name` under the PATH of `env`: `name` itself when it has a '/',
// else each PATH directory joined with it (an empty entry, the working directory: `name` alone).
std::vector<std::string> exec_candidates(const std::string& name,
                                         const std::vector<std::string>& env) {
  if (name.empty() || name.find('/') != std::string::npos) return {name};
  std::string_view path_var;
  for (const auto& e : env)
    if (e.starts_with("PATH=")) path_var = std::string_view(e).substr(5);
  std::vector<std::string> paths;
  for (;;) {
    const std::size_t colon = path_var.find(':');
    const std::string_view dir = path_var.substr(0, colon);
    paths.push_back(dir.empty() ? name : std::string(dir) + "/" + name);
    if (colon == std::string_view::npos) return paths;
    path_var.remove_prefix(colon + 1);
  }
}

// In a forked child, before its execve (system calls only): the signals the agent blocks or
// ignores back to their defaults, a process group of its own, stdin at end of file at once (no
// /dev/null needed), then who it runs as. The step that failed, or stage -1.
ChildFailure enter_child(const ChildUser& user, bool own_session = false) {
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  if (own_session) {
    ::setsid();  // a PTY session: its own session (and group), for the terminal to control
  } else {
    ::setpgid(0, 0);
  }
  int in[2];
  if (::pipe(in) == 0) {
    ::dup2(in[0], 0);
    ::close(in[0]);
    ::close(in[1]);
  }
  if (!user.needed) return {-1, 0};
  if (::setgroups(user.groups.size(), user.groups.data()) != 0) return {0, errno};
  if (::setgid(user.gid) != 0) return {1, errno};
  if (::setuid(user.uid) != 0) return {2, errno};
  return {-1, 0};
}

namespace {

// The value of `name` in an environment of "NAME=value" entries, or nullopt.
std::optional<std::string> env_value(const std::vector<std::string>& env, std::string_view name) {
  for (const auto& e : env) {
    if (e.size() > name.size() && e[name.size()] == '=' && e.starts_with(name)) {
      return e.substr(name.size() + 1);
    }
  }
  return std::nullopt;
}

// $NAME and ${NAME} in `value` replaced by their values in `env` (empty when unset), by the rules
// of Go's os.ExpandEnv, which execd applies: a name is letters, digits and '_', or one special
// character (a digit, *#$@!?-); "${}" and an unclosed "${" are dropped; a '$' before anything
// else, or last, stays.
std::string expand_env(std::string_view value, const std::vector<std::string>& env) {
  const auto is_alnum = [](char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  const auto is_special = [](char c) {
    return std::string_view("*#$@!?-").find(c) != std::string_view::npos || (c >= '0' && c <= '9');
  };
  std::string out;
  std::size_t i = 0;
  while (i < value.size()) {
    if (value[i] != '$' || i + 1 == value.size()) {
      out += value[i++];
      continue;
    }
    const std::string_view rest = value.substr(i + 1);
    std::string_view name;
    std::size_t used = 0;  // of `rest`
    if (rest.front() == '{') {
      if (rest.size() > 2 && is_special(rest[1]) && rest[2] == '}') {
        name = rest.substr(1, 1);
        used = 3;
      } else if (const auto close = rest.find('}'); close == std::string_view::npos) {
        used = 1;  // "${" unclosed: dropped, the rest kept
      } else {
        name = rest.substr(1, close - 1);  // empty for "${}": dropped
        used = close + 1;
      }
    } else if (is_special(rest.front())) {
      name = rest.substr(0, 1);
      used = 1;
    } else {
      while (used < rest.size() && is_alnum(rest[used]))
        ++used;
      name = rest.substr(0, used);
      if (used == 0) out += '$';  // not followed by a name: kept
    }
    if (!name.empty()) out += env_value(env, name).value_or("");
    i += 1 + used;
  }
  return out;
}

// A value of the EXECD_ENVS file, as a dotenv parser reads it (what the SDKs' set_env writes):
// 'single-quoted' is literal; "double-quoted" takes the escapes \\ \" \$ \n \r \t and expands
// $NAME; a bare value expands $NAME. A quote that is not closed at the line's end is kept.
std::string env_file_value(std::string_view value, const std::vector<std::string>& env) {
  if (value.size() >= 2 && value.front() == '\'' && value.back() == '\'') {
    return std::string(value.substr(1, value.size() - 2));
  }
  if (value.size() < 2 || value.front() != '"' || value.back() != '"') {
    return expand_env(value, env);
  }
  value = value.substr(1, value.size() - 2);
  std::string out;
  std::size_t plain = 0;  // where the text not yet expanded starts
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '\\' || i + 1 == value.size()) continue;
    out += expand_env(value.substr(plain, i - plain), env);
    const char c = value[i + 1];
    out += c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;  // \\ \" \$: the character
    plain = ++i + 1;
  }
  return out + expand_env(value.substr(plain), env);
}

}  // namespace

// execd's EXECD_ENVS: when the agent's environment names a file there, its KEY=VALUE lines are
// each command's environment over the agent's and under the request's. Read for every command
// (a command may have written it for the next), at most 1 MiB; blank lines, `#` comments and
// lines without `=` or with an empty key are skipped; values as env_file_value reads them, $NAME
// and ${NAME} expanding from the agent's environment.
void Server::add_env_file(
    const std::function<void(const std::string&, const std::string&)>& set) const {
  const auto path = env_value(base_env_, "EXECD_ENVS");
  if (!path || path->empty()) return;
  const std::optional<std::string> text = read_file(*path, 1024 * 1024);
  if (!text) return;
  std::size_t start = 0;
  while (start < text->size()) {
    auto eol = text->find('\n', start);
    if (eol == std::string::npos) eol = text->size();
    std::string_view line(text->data() + start, eol - start);
    start = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t'))
      line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    const auto eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    std::string_view key = line.substr(0, eq);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t'))
      key.remove_suffix(1);
    if (key.empty()) continue;
    set(std::string(key), env_file_value(line.substr(eq + 1), base_env_));
  }
}

std::vector<std::string> Server::child_env(
    const std::string& id, const std::optional<Identity>& identity,
    const std::vector<std::pair<std::string, std::string>>& envs) const {
  std::vector<std::string> env = base_env_;
  auto set_env = [&](const std::string& name, const std::string& value) {
    const std::string prefix = name + "=";
    for (auto& e : env) {
      if (e.starts_with(prefix)) {
        e = prefix + value;
        return;
      }
    }
    env.push_back(prefix + value);
  };
  add_env_file(set_env);
  if (identity) set_env("HOME", identity->home);
  set_env(std::string(kExecIdVar), id);  // the tag kill_tagged() finds
  for (const auto& [k, v] : envs)
    set_env(k, v);
  return env;
}

std::optional<std::string> Server::spawn(Command& cmd, const CommandRequest& req) {
  // Everything the child needs is built here, before fork: the child only makes system calls.
  std::vector<std::string> env = child_env(cmd.id, req.identity, req.envs);
  std::vector<char*> envp;
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = req.argv;
  std::string program = opt_.shell;
  if (args.empty()) {
    args = {"sh", "-c", req.command};
  } else if (args[0].find('/') == std::string::npos) {
    // A bare name is looked up in the command's own PATH, as execvp would, before the fork (the
    // child only makes system calls). Relative PATH entries are relative to the command's cwd.
    program.clear();
    for (const std::string& path : exec_candidates(args[0], env)) {
      const std::string candidate =
          path.starts_with("/") || !req.cwd ? path : *req.cwd + "/" + path;
      struct stat st {};
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          ::access(candidate.c_str(), X_OK) == 0) {
        program = candidate;
        break;
      }
    }
    if (program.empty()) return "exec " + args[0] + ": executable file not found in $PATH";
  } else {
    program = args[0];
  }
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  const char* cwd = req.cwd ? req.cwd->c_str() : nullptr;
  const char* shell = program.c_str();
  const ChildUser user = child_user(req.identity);
  cmd.uid = req.identity ? user.uid : ::geteuid();
  cmd.gid = req.identity ? user.gid : ::getegid();

  int out[2] = {-1, -1}, err[2] = {-1, -1}, report[2] = {-1, -1};
  if (cmd.background) {
    cmd.log_path = opt_.state_dir + "/" + cmd.id + ".log";
    cmd.log_fd =
        ::open(cmd.log_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
    if (cmd.log_fd < 0)
      return "cannot create the log file " + cmd.log_path + ": " + std::strerror(errno);
  }
  if (::pipe2(out, O_CLOEXEC) != 0 || (!cmd.background && ::pipe2(err, O_CLOEXEC) != 0) ||
      ::pipe2(report, O_CLOEXEC) != 0) {
    const std::string why = std::string("pipe: ") + std::strerror(errno);
    for (int* p : {out, err, report}) {
      close_fd(p[0]);
      close_fd(p[1]);
    }
    return why;
  }
  const int child_out = out[1];
  const int child_err = cmd.background ? out[1] : err[1];

  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(child_out, 1);
    ::dup2(child_err, 2);
    ChildFailure f = enter_child(user);
    if (f.stage < 0 && cwd && ::chdir(cwd) != 0) f = {3, errno};
    if (f.stage < 0) {
      ::execve(shell, argv.data(), envp.data());
      f = {4, errno};
    }
    [[maybe_unused]] const ssize_t n = ::write(report[1], &f, sizeof f);
    ::_exit(127);
  }
  const int fork_errno = errno;
  close_fd(out[1]);
  close_fd(err[1]);
  close_fd(report[1]);
  if (pid < 0) {
    close_fd(out[0]);
    close_fd(err[0]);
    close_fd(report[0]);
    return std::string("fork: ") + std::strerror(fork_errno);
  }
  // Start failures become an error event rather than a shell's exit code.
  const ChildFailure f = await_exec(pid, report[0]);
  cmd.pid = pid;
  cmd.running = true;
  pids_.emplace(pid, cmd.key);
  cmd.fds[0] = out[0];
  cmd.fds[1] = err[0];
  if (f.stage >= 0) {
    close_fd(cmd.fds[0]);
    close_fd(cmd.fds[1]);
    cmd.running = false;  // the child exits 127; on_exit finds no running command for it
    static const char* const kStage[] = {"setgroups", "setgid", "setuid", "chdir", "exec"};
    std::string what = kStage[std::clamp(f.stage, 0, 4)];
    if (f.stage == 3) what += " " + *req.cwd;
    if (f.stage == 4) what += " " + program;
    return what + ": " + errno_text(f.error);
  }
  for (int s = 0; s < 2; ++s) {
    if (cmd.fds[s] < 0) continue;
    set_nonblocking(cmd.fds[s]);
    cmd.tokens[s] = watch(cmd.fds[s], EPOLLIN, Source{Kind::pipe, cmd.key, s});
  }
  if (req.timeout_ms > 0) cmd.deadline_ms = cmd.started_ms + req.timeout_ms;
  return std::nullopt;
}

void Server::emit(Command& cmd, std::string_view event) {
  Connection* c = conn_of(cmd.conn);
  if (!c) return;
  send(*c, http::chunk(event));
  cmd.last_event_ms = mono_ms();
}

void Server::pause_output(Command& cmd, bool pause) {
  cmd.paused = pause;
  for (int s = 0; s < 2; ++s)
    if (cmd.tokens[s])
      rewatch(cmd.tokens[s], cmd.fds[s], pause ? 0u : static_cast<uint32_t>(EPOLLIN));
}

void Server::on_pipe(Command& cmd, int stream, bool final_drain) {
  char buf[kReadChunk];
  // A final drain reads what the exited process left in the pipe, but not forever: an orphan that
  // keeps writing to the inherited pipe is cut off after a bounded amount.
  std::size_t budget = final_drain ? 16 * kReadChunk : kReadChunk;
  while (cmd.fds[stream] >= 0 && budget > 0) {
    const ssize_t n = ::read(cmd.fds[stream], buf, std::min(sizeof buf, budget));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {  // EOF (every writer gone) or an error
      unwatch(cmd.tokens[stream], cmd.fds[stream]);
      close_fd(cmd.fds[stream]);
      break;
    }
    budget -= static_cast<std::size_t>(n);
    const std::string_view data(buf, static_cast<std::size_t>(n));
    if (cmd.background) {
      if (cmd.log_fd >= 0 && cmd.log_size < opt_.log_cap) {
        const std::size_t keep = std::min<std::size_t>(data.size(), opt_.log_cap - cmd.log_size);
        const ssize_t w = ::write(cmd.log_fd, data.data(), keep);
        if (w > 0) cmd.log_size += static_cast<uint64_t>(w);
      }
    } else {
      emit_output(cmd, stream, data);
    }
    if (!final_drain) return;  // level-triggered: the loop comes back while there is more
  }
}

void Server::emit_output(Command& cmd, int stream, std::string_view data) {
  if (cmd.frames) {
    emit(cmd, frame(stream == 0 ? 'o' : 'e', data));
    return;
  }
  const char* type = stream == 0 ? "stdout" : "stderr";
  cmd.lines[stream].feed(data, [&](std::string_view line) { emit(cmd, text_event(type, line)); });
}

void Server::kill_group(Command& cmd) {
  if (!cmd.running || cmd.pid <= 0) return;
  ::kill(-cmd.pid, SIGKILL);
  cmd.killed = true;
  if (cmd.uid == ::geteuid()) {
    kill_tagged(cmd.id);
    return;
  }
  // Another user's processes: their environment is readable to that user (without
  // CAP_SYS_PTRACE, which containers lack, not even to root). A child of that user scans; the
  // loop waits for it (a /proc scan, milliseconds) so the command's end is sent after it.
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(cmd.gid) == 0 && ::setuid(cmd.uid) == 0) kill_tagged(cmd.id);
    ::_exit(0);
  }
  if (pid > 0) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

// Processes that left the command's group (setsid, a daemon's double fork) still carry its tag in
// their environment: find them in /proc and kill them too. A pass finds the ones that forked
// during the last; a few passes end it (a fork bomb outruns any scan, the group kill aside).
void Server::kill_tagged(const std::string& id) const {
  const std::string tag = std::string(kExecIdVar) + "=" + id;
  for (int pass = 0; pass < 4; ++pass) {
    DIR* proc = ::opendir("/proc");
    if (!proc) return;
    int killed = 0;
    while (const dirent* entry = ::readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(entry->d_name, &end, 10);
      if (pid <= 1 || *end != '\0' || pid == ::getpid()) continue;
      const std::string path = std::string("/proc/") + entry->d_name + "/environ";
      const std::optional<std::string> read = read_file(path, 16 * 1024 * 1024);
      if (!read) continue;
      const std::string& env = *read;
      for (std::size_t at = 0; at < env.size();) {
        const std::size_t nul = std::min(env.find('\0', at), env.size());
        if (std::string_view(env).substr(at, nul - at) == tag) {
          ::kill(static_cast<pid_t>(pid), SIGKILL);
          ++killed;
          break;
        }
        at = nul + 1;
      }
    }
    ::closedir(proc);
    if (killed == 0) return;
  }
}

void Server::on_exit(pid_t pid, int status) {
  if (pid == entry_pid_ && entry_running_) {
    entry_running_ = false;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status)
                                   : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    // As a container ends with its main process; after the expiry, once the ends of the commands
    // it killed are sent (they may be reaped in the same batch as the entrypoint).
    if (expired_) {
      stop_when_drained();
    } else {
      stop_ = true;
    }
    return;
  }
  const auto it = pids_.find(pid);
  if (it == pids_.end()) return;  // an adopted orphan: reaping it was the point
  const uint64_t key = it->second;
  pids_.erase(it);
  if (Session* s = session_of(key)) {
    session_exited(*s, status);
    return;
  }
  Command* cmd = command_of(key);
  if (cmd && cmd->running) finish(*cmd, status);
}

void Server::finish(Command& cmd, int status) {
  cmd.running = false;  // first: a client found gone while draining must not kill a reaped pid
  // What the process wrote before it exited is in the pipes now: send it before the last event.
  for (int s = 0; s < 2; ++s) {
    on_pipe(cmd, s, true);
    unwatch(cmd.tokens[s], cmd.fds[s]);
    close_fd(cmd.fds[s]);
    if (!cmd.background && !cmd.frames) {
      const char* type = s == 0 ? "stdout" : "stderr";
      cmd.lines[s].flush([&](std::string_view line) { emit(cmd, text_event(type, line)); });
    }
  }
  close_fd(cmd.log_fd);
  cmd.finished_ns = real_ns();
  const int64_t elapsed = mono_ms() - cmd.started_ms;
  // A command the expiry cut short (expire()) ends as a killed one does, and says why: frames
  // with "sandbox_expired", execd's error event with a second line of traceback.
  const std::string expired = cmd.expired ? expired_text() : std::string();
  std::string event;
  std::string end;  // the frames' end, without its closing brace
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    cmd.exit_code = code;
    if (code == 0) {
      event = complete_event(elapsed);
    } else {
      cmd.error = "exit status " + std::to_string(code);
      event = error_event(std::to_string(code), *cmd.error, expired);
    }
    end = "{\"exit_code\":" + std::to_string(code);
  } else {
    cmd.exit_code = -1;
    const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    cmd.error = signal_text(sig);
    event = error_event("-1", *cmd.error, expired);
    end = "{\"signal\":" + std::to_string(sig) + (cmd.timed_out ? ",\"timed_out\":true" : "");
  }
  if (cmd.frames) {
    if (cmd.expired) end += ",\"sandbox_expired\":" + std::to_string(expiry_);
    event = frame('x', end + "}");
  }
  if (Connection* c = conn_of(cmd.conn)) {
    emit(cmd, event);
    send(*c, http::kLastChunk);
    c->command = 0;
    if (!c->req.keep_alive) {
      c->closing = true;
      if (c->pending() == 0) close_conn(*c);
    } else {
      resume_input_.push_back(c->key);  // a request it pipelined behind this one
    }
  }
  cmd.conn = 0;
  retire(cmd);
}

void Server::retire(Command& cmd) {
  if (cmd.timer_at) timers_.erase({cmd.timer_at, cmd.key});
  cmd.timer_at = 0;
  finished_.push_back(cmd.key);
  while (finished_.size() > opt_.max_finished) {
    const uint64_t old = finished_.front();
    finished_.pop_front();
    if (Command* gone = command_of(old)) {
      if (!gone->log_path.empty()) ::unlink(gone->log_path.c_str());
      ids_.erase(gone->id);
      commands_.erase(old);
    }
  }
}

void Server::schedule(Command& cmd) {
  int64_t wake = INT64_MAX;
  if (cmd.running && cmd.deadline_ms && !cmd.killed) wake = cmd.deadline_ms;
  if (cmd.conn) wake = std::min(wake, cmd.last_event_ms + opt_.ping_ms);
  if (cmd.timer_at == wake) return;
  if (cmd.timer_at) timers_.erase({cmd.timer_at, cmd.key});
  cmd.timer_at = wake == INT64_MAX ? 0 : wake;
  if (cmd.timer_at) timers_.emplace(cmd.timer_at, cmd.key);
}

void Server::run_timers() {
  const int64_t now = mono_ms();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    const uint64_t key = timers_.begin()->second;
    timers_.erase(timers_.begin());
    if (key == kExpiryTimer) {
      check_expiry();
      continue;
    }
    if (key == kGraceTimer) {
      if (entry_running_) signal_entrypoint(SIGKILL);
      continue;
    }
    if (key == kDrainTimer) {
      stop_ = true;
      continue;
    }
    if (Session* s = session_of(key)) {  // its outputs did not end in time after the exit
      s->timer_at = 0;
      end_session(*s);
      continue;
    }
    Command* cmd = command_of(key);
    if (!cmd) continue;
    cmd->timer_at = 0;
    if (cmd->running && cmd->deadline_ms && !cmd->killed && now >= cmd->deadline_ms) {
      kill_group(*cmd);  // its exit (SIGKILL) ends the stream with evalue -1
      cmd->timed_out = true;
    }
    if (cmd->conn && now - cmd->last_event_ms >= opt_.ping_ms)
      emit(*cmd, cmd->frames ? frame('p', "") : text_event("ping", "pong"));
    if (cmd->running) schedule(*cmd);
  }
}

int Server::next_timeout() const {
  if (!resume_input_.empty()) return 0;
  if (timers_.empty()) return -1;
  const int64_t wait = timers_.begin()->first - mono_ms();
  return static_cast<int>(std::clamp<int64_t>(wait, 0, INT_MAX));
}

void Server::delete_command(Connection& c) {
  const std::string* id = c.req.query_value("id");
  if (!id || id->empty()) {
    reply_error(c, 400, "MISSING_QUERY", "missing query parameter 'id'");
    return;
  }
  Command* cmd = command_by_id(*id);
  if (!cmd || !cmd->running) {
    reply_error(c, 500, "RUNTIME_ERROR", "command not found or not running: " + *id);
    return;
  }
  kill_group(*cmd);
  schedule(*cmd);
  reply(c, 200, "", "");
}

void Server::command_status(Connection& c, const std::string& id) {
  const Command* cmd = command_by_id(id);
  if (!cmd) {
    reply_error(c, 404, "INVALID_REQUEST_BODY", "command not found: " + id);
    return;
  }
  std::string b = "{\"id\":";
  json::append_string(b, cmd->id);
  b += ",\"content\":";
  json::append_string(b, cmd->content);
  b += cmd->running ? ",\"running\":true" : ",\"running\":false";
  if (cmd->exit_code) b += ",\"exit_code\":" + std::to_string(*cmd->exit_code);
  if (cmd->error) {
    b += ",\"error\":";
    json::append_string(b, *cmd->error);
  }
  b += ",\"started_at\":\"" + rfc3339(cmd->started_ns) + "\"";
  if (cmd->finished_ns) b += ",\"finished_at\":\"" + rfc3339(cmd->finished_ns) + "\"";
  b += "}";
  reply(c, 200, "application/json; charset=utf-8", b);
}

void Server::command_logs(Connection& c, const std::string& id) {
  const Command* cmd = command_by_id(id);
  if (!cmd) {
    reply_error(c, 404, "INVALID_REQUEST_BODY", "command not found: " + id);
    return;
  }
  if (!cmd->background) {
    reply_error(c, 400, "INVALID_REQUEST_BODY", "command " + id + " is not a background command");
    return;
  }
  uint64_t cursor = 0;
  if (const std::string* text = c.req.query_value("cursor"); text && !text->empty()) {
    if (text->find_first_not_of("0123456789") != std::string::npos || text->size() > 18) {
      reply_error(c, 400, "INVALID_REQUEST_BODY", "invalid cursor: " + *text);
      return;
    }
    cursor = std::stoull(*text);
  }
  std::string body;
  if (cursor < cmd->log_size && !cmd->log_path.empty()) {
    const std::size_t want =
        static_cast<std::size_t>(std::min<uint64_t>(cmd->log_size - cursor, kMaxLogRead));
    const int fd = ::open(cmd->log_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      body.resize(want);
      std::size_t got = 0;
      while (got < want) {
        const ssize_t n =
            ::pread(fd, body.data() + got, want - got, static_cast<off_t>(cursor + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      ::close(fd);
      body.resize(got);
    }
  }
  reply(c, 200, "text/plain; charset=utf-8", body,
        {"Execd-Commands-Tail-Cursor: " + std::to_string(cursor + body.size())});
}

// ---------------------------------------------------------------------------------------------
// PTY sessions (agent/README.md, "PTY sessions"): POST /pty makes one, the first WebSocket attach
// starts its shell, output goes to the attached socket and into a bounded ring for replay.

Session* Server::session_of(uint64_t key) {
  const auto it = sessions_.find(key);
  return it == sessions_.end() ? nullptr : it->second.get();
}

Session* Server::session_by_id(const std::string& id) {
  const auto it = session_ids_.find(id);
  return it == session_ids_.end() ? nullptr : session_of(it->second);
}

void Server::post_pty(Connection& c) {
  std::string cwd, command;
  std::vector<std::pair<std::string, std::string>> envs;
  std::optional<Identity> identity;
  uint16_t size[2] = {24, 80};  // rows, cols
  if (!c.req.body.empty()) {
    json::Value v;
    std::string why;
    if (!json::parse(c.req.body, v, why) || v.kind != json::Value::Kind::object) {
      reply_error(c, 400, "INVALID_REQUEST_BODY",
                  "invalid request body: " + (why.empty() ? "not a JSON object" : why));
      return;
    }
    for (const char* name : {"cwd", "command"}) {
      const json::Value* f = v.find(name);
      if (!f || f->kind == json::Value::Kind::null) continue;
      if (f->kind != json::Value::Kind::string || f->text.find('\0') != std::string::npos) {
        reply_error(c, 400, "INVALID_REQUEST_BODY",
                    std::string("invalid request body: ") + name + " must be a string");
        return;
      }
      (std::string_view(name) == "cwd" ? cwd : command) = f->text;
    }
    // sbx extensions: the environment and user as a command's, and the starting size.
    if (!read_envs_and_user(v, envs, identity, why)) {
      reply_error(c, 400, "INVALID_REQUEST_BODY", why);
      return;
    }
    const char* names[2] = {"rows", "cols"};
    for (int i = 0; i < 2; ++i) {
      const json::Value* f = v.find(names[i]);
      if (!f || f->kind == json::Value::Kind::null) continue;
      if (f->kind != json::Value::Kind::number || !f->integer_ok || f->integer < 1 ||
          f->integer > 65535) {
        reply_error(c, 400, "INVALID_REQUEST_BODY",
                    std::string("invalid request body: ") + names[i] +
                        " must be an integer from 1 to 65535");
        return;
      }
      size[i] = static_cast<uint16_t>(f->integer);
    }
  }
  if (!cwd.empty()) {
    struct stat st {};
    if (::stat(cwd.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      reply_error(c, 400, "INVALID_REQUEST_BODY",
                  "invalid request body: cwd " + cwd + " is not a directory");
      return;
    }
  }
  // The bound: beyond it the oldest session that is not running goes; when all run, a refusal.
  if (sessions_.size() >= kMaxSessions) {
    uint64_t oldest = 0;
    for (const auto& [key, s] : sessions_)
      if (!s->running && (oldest == 0 || key < oldest)) oldest = key;
    if (oldest == 0) {
      reply_error(
          c, 503, "RUNTIME_ERROR",
          "too many PTY sessions (" + std::to_string(kMaxSessions) + " running): delete one first");
      return;
    }
    remove_session(*session_of(oldest));
  }
  auto s = std::make_unique<Session>();
  s->key = next_key_++;
  s->id = new_id();
  s->cwd = cwd;
  s->command = command;
  s->envs = std::move(envs);
  s->identity = std::move(identity);
  s->rows = size[0];
  s->cols = size[1];
  std::string body = "{\"session_id\":";
  json::append_string(body, s->id);
  body += "}";
  session_ids_.emplace(s->id, s->key);
  sessions_.emplace(s->key, std::move(s));
  reply(c, 200, "application/json; charset=utf-8", body);
}

void Server::pty_status(Connection& c, const std::string& id) {
  const Session* s = session_by_id(id);
  if (!s) {
    reply_error(c, 404, "NOT_FOUND", "pty session not found: " + id);
    return;
  }
  std::string b = "{\"session_id\":";
  json::append_string(b, s->id);
  b += s->running ? ",\"running\":true" : ",\"running\":false";
  b += ",\"output_offset\":" + std::to_string(s->output.end());
  if (s->exit_code) b += ",\"exit_code\":" + std::to_string(*s->exit_code);
  b += "}";
  reply(c, 200, "application/json; charset=utf-8", b);
}

void Server::pty_delete(Connection& c, const std::string& id) {
  Session* s = session_by_id(id);
  if (!s) {
    reply_error(c, 404, "NOT_FOUND", "pty session not found: " + id);
    return;
  }
  remove_session(*s);
  reply(c, 200, "", "");
}

void Server::remove_session(Session& s, std::string_view reason) {
  if (s.running && s.pid > 0) {
    if (!s.exited) {  // once reaped (draining its last output), its pid may be another's
      ::kill(-s.pid, SIGKILL);
      pids_.erase(s.pid);  // reaped as any orphan
    }
    kill_tagged(s.id);  // what left its group: bash puts each job in a group of its own
  }
  if (Connection* c = conn_of(s.conn)) ws_close(*c, 1000, reason);
  for (int i = 0; i < 3; ++i) {
    unwatch(s.tokens[i], s.fds[i]);
    close_fd(s.fds[i]);
  }
  if (s.timer_at) timers_.erase({s.timer_at, s.key});
  session_ids_.erase(s.id);
  sessions_.erase(s.key);  // `s` is gone
}

void Server::pty_attach(Connection& c, const std::string& id) {
  const http::Request& r = c.req;
  Session* s = session_by_id(id);
  if (!s) {
    reply_error(c, 404, "NOT_FOUND", "pty session not found: " + id);
    return;
  }
  auto has_token = [&](const char* header, std::string_view token) {
    const std::string* v = r.header(header);
    if (!v) return false;
    std::string lower = *v;
    for (char& ch : lower)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return lower.find(token) != std::string::npos;
  };
  const std::string* key = r.header("sec-websocket-key");
  const std::string* version = r.header("sec-websocket-version");
  if (!has_token("upgrade", "websocket") || !has_token("connection", "upgrade")) {
    reply_error(c, 400, "INVALID_REQUEST", "a WebSocket upgrade is expected on " + r.path);
    return;
  }
  if (!version || *version != "13") {
    reply(c, 400, "application/json; charset=utf-8",
          error_body("INVALID_REQUEST", "unsupported Sec-WebSocket-Version (13 is)"),
          {"Sec-WebSocket-Version: 13"});
    return;
  }
  if (!key || !ws::valid_key(*key)) {
    reply_error(c, 400, "INVALID_REQUEST", "bad Sec-WebSocket-Key");
    return;
  }
  uint64_t since = 0;
  const std::string* since_text = r.query_value("since");
  if (since_text) {
    if (since_text->empty() || since_text->size() > 18 ||
        since_text->find_first_not_of("0123456789") != std::string::npos) {
      reply_error(c, 400, "INVALID_REQUEST", "since must be a byte offset");
      return;
    }
    since = std::stoull(*since_text);
  }
  const std::string* takeover = r.query_value("takeover");
  const bool take = takeover && (*takeover == "1" || *takeover == "true");
  if (Connection* holder = conn_of(s->conn); holder && holder != &c) {
    if (!take) {
      reply_error(c, 409, "SESSION_IN_USE",
                  "pty session " + id + " is attached elsewhere (takeover=1 evicts it)");
      return;
    }
    ws_close(*holder, 4001, "TAKEN_OVER");
  }
  if (!s->started) {
    const std::string* pty = r.query_value("pty");
    s->tty = !(pty && (*pty == "0" || *pty == "false"));
    if (const auto failed = spawn_session(*s)) {
      reply_error(c, 500, "RUNTIME_ERROR", *failed);
      return;
    }
  }
  send(c,
       "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
       "Sec-WebSocket-Accept: " +
           ws::accept_key(*key) + "\r\n\r\n");
  if (c.dead) return;
  c.ws.emplace(kWsMaxFrame);
  c.session = s->key;
  s->conn = c.key;
  const uint64_t from = std::max(since, s->output.begin());
  std::string hello = "{\"type\":\"connected\",\"session_id\":";
  json::append_string(hello, s->id);
  hello += s->tty ? ",\"mode\":\"pty\"" : ",\"mode\":\"pipe\"";
  hello += s->running ? ",\"running\":true" : ",\"running\":false";
  hello += ",\"output_offset\":" + std::to_string(s->output.end());
  if (since_text) {
    hello += ",\"replay_from\":" + std::to_string(std::min(from, s->output.end()));
    if (since < s->output.begin()) hello += ",\"replay_truncated\":true";
  }
  hello += "}";
  ws_send(c, ws::kText, hello);
  if (since_text) {
    for (uint64_t at = from; at < s->output.end() && !c.dead;) {
      const std::string bytes = s->output.read(at, kReadChunk);
      std::string payload(1, '\x03');
      for (int shift = 56; shift >= 0; shift -= 8)
        payload += static_cast<char>((at >> shift) & 0xff);
      payload += bytes;
      ws_send(c, ws::kBinary, payload);
      at += bytes.size();
    }
  }
  if (c.dead) return;
  if (!s->running && s->exit_code) {
    ws_send(c, ws::kText,
            "{\"type\":\"exit\",\"exit_code\":" + std::to_string(*s->exit_code) + "}");
    if (!c.dead) ws_close(c, 1000, "");
    return;
  }
  if (!c.in.empty()) ws_input(c);
}

std::optional<std::string> Server::spawn_session(Session& s) {
  std::vector<std::string> env = child_env(s.id, s.identity, s.envs);
  if (!env_value(env, "TERM")) env.emplace_back("TERM=xterm-256color");
  std::vector<char*> envp;
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  // The program: `shell -c COMMAND`, else an interactive bash when the PATH has one, else the
  // shell.
  std::string program = opt_.shell;
  std::vector<std::string> args{"sh"};
  if (!s.command.empty()) {
    args = {"sh", "-c", s.command};
  } else {
    for (const std::string& candidate : exec_candidates("bash", env)) {
      if (candidate.starts_with("/") && ::access(candidate.c_str(), X_OK) == 0) {
        program = candidate;
        args = {"bash"};
        break;
      }
    }
  }
  if (::access(program.c_str(), X_OK) != 0)
    return program + ": " + errno_text(errno) + ": a shell is needed for a PTY session";
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  const char* cwd = s.cwd.empty() ? nullptr : s.cwd.c_str();

  // Child ends: the PTY's slave on 0, 1 and 2, or three pipes. Parent ends in `mine`.
  int mine[3] = {-1, -1, -1};
  int theirs[3] = {-1, -1, -1};
  auto close_all = [&] {
    for (int i = 0; i < 3; ++i) {
      close_fd(mine[i]);
      close_fd(theirs[i]);
    }
  };
  if (s.tty) {
    // /dev/ptmx by hand (what posix_openpt, unlockpt and ptsname do), nothing from libutil.
    mine[0] = ::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    int unlock = 0;
    unsigned int n = 0;
    if (mine[0] < 0 || ::ioctl(mine[0], TIOCSPTLCK, &unlock) != 0 ||
        ::ioctl(mine[0], TIOCGPTN, &n) != 0) {
      const std::string why = "cannot open a PTY: " + errno_text(errno);
      close_all();
      return why;
    }
    const std::string slave = "/dev/pts/" + std::to_string(n);
    theirs[0] = ::open(slave.c_str(), O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (theirs[0] < 0) {
      const std::string why = "cannot open " + slave + ": " + errno_text(errno);
      close_all();
      return why;
    }
    winsize size{};
    size.ws_row = s.rows;
    size.ws_col = s.cols;
    ::ioctl(mine[0], TIOCSWINSZ, &size);
  } else {
    int p[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
    for (auto& pair : p) {
      if (::pipe2(pair, O_CLOEXEC) != 0) {
        const std::string why = "pipe: " + errno_text(errno);
        for (auto& q : p) {
          close_fd(q[0]);
          close_fd(q[1]);
        }
        return why;
      }
    }
    mine[0] = p[0][0];  // stdout
    theirs[1] = p[0][1];
    mine[1] = p[1][0];  // stderr
    theirs[2] = p[1][1];
    mine[2] = p[2][1];  // stdin
    theirs[0] = p[2][0];
  }
  int report[2] = {-1, -1};
  if (::pipe2(report, O_CLOEXEC) != 0) {
    const std::string why = "pipe: " + errno_text(errno);
    close_all();
    return why;
  }
  const bool tty = s.tty;
  const ChildUser user = child_user(s.identity);
  if (s.tty && s.identity) {  // the terminal is the user's, as a login's is
    [[maybe_unused]] const int ignored = ::fchown(theirs[0], user.uid, static_cast<gid_t>(-1));
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ChildFailure f = enter_child(user, true);
    if (tty) {
      for (int fd = 0; fd < 3; ++fd)
        ::dup2(theirs[0], fd);
      if (::ioctl(0, TIOCSCTTY, 0) != 0) f = {5, errno};
    } else {
      for (int fd = 0; fd < 3; ++fd)
        ::dup2(theirs[fd], fd);
    }
    if (f.stage < 0 && cwd && ::chdir(cwd) != 0) f = {3, errno};
    if (f.stage < 0) {
      ::execve(program.c_str(), argv.data(), envp.data());
      f = {4, errno};
    }
    [[maybe_unused]] const ssize_t n = ::write(report[1], &f, sizeof f);
    ::_exit(127);
  }
  const int fork_errno = errno;
  close_fd(report[1]);
  for (int i = 0; i < 3; ++i)
    close_fd(theirs[i]);
  if (pid < 0) {
    close_fd(report[0]);
    close_all();
    return "fork: " + errno_text(fork_errno);
  }
  const ChildFailure f = await_exec(pid, report[0], false);
  s.started = true;
  if (f.stage >= 0) {
    close_all();
    static const char* const kStage[] = {"setgroups", "setgid", "setuid",
                                         "chdir",     "exec",   "TIOCSCTTY"};
    std::string what = kStage[std::clamp(f.stage, 0, 5)];
    if (f.stage == 3) what += " " + s.cwd;
    if (f.stage == 4) what += " " + program;
    s.exit_code = 127;
    return what + ": " + errno_text(f.error);
  }
  s.pid = pid;
  s.running = true;
  pids_.emplace(pid, s.key);
  for (int i = 0; i < 3; ++i) {
    s.fds[i] = mine[i];
    if (s.fds[i] < 0) continue;
    set_nonblocking(s.fds[i]);
    s.tokens[i] = watch(s.fds[i], i == 2 ? 0u : static_cast<uint32_t>(EPOLLIN),
                        Source{Kind::session, s.key, i});
  }
  return std::nullopt;
}

void Server::on_session_fd(Session& s, int stream, uint32_t events) {
  const bool writes = stream == 2 || (stream == 0 && s.tty);
  if (writes && (events & (EPOLLOUT | EPOLLERR)) && !s.stdin_pending.empty()) flush_stdin(s);
  if (stream == 2) {
    // Pipe mode's stdin, whose reader closed it: epoll reports that until the fd goes (a spin),
    // so it goes, and later input is dropped.
    if ((events & (EPOLLERR | EPOLLHUP)) && s.fds[2] >= 0) close_stdin(s);
    return;
  }
  if (s.fds[stream] < 0) return;
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_session(s, stream, kReadChunk);
}

// Reads at most `budget` bytes from output `stream` (one read unless `budget` is larger): kept in
// the ring and sent to the attached socket. EOF or an error (EIO: the PTY's slave is closed
// everywhere) closes the stream; when the shell has exited and every output is closed, the
// session ends.
void Server::read_session(Session& s, int stream, std::size_t budget) {
  char buf[kReadChunk];
  while (s.fds[stream] >= 0 && budget > 0) {
    const ssize_t n = ::read(s.fds[stream], buf, std::min(sizeof buf, budget));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      unwatch(s.tokens[stream], s.fds[stream]);
      close_fd(s.fds[stream]);
      if (stream == 0 && s.tty) {  // the master was stdin too
        s.stdin_pending.clear();
      }
      if (s.exited && s.fds[0] < 0 && s.fds[1] < 0) end_session(s);
      return;
    }
    budget -= static_cast<std::size_t>(n);
    const std::string_view data(buf, static_cast<std::size_t>(n));
    s.output.append(data);
    if (Connection* c = conn_of(s.conn)) {
      std::string payload(1, stream == 0 ? '\x01' : '\x02');
      payload += data;
      ws_send(*c, ws::kBinary, payload);
    }
  }
}

void Server::session_exited(Session& s, int status) {
  s.exited = true;
  s.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  // What the shell wrote may still be on its way through the PTY (or held open by a process it
  // left behind): wait for the outputs' end, at most kSessionDrainMs.
  if (s.fds[0] < 0 && s.fds[1] < 0) {
    end_session(s);
    return;
  }
  s.timer_at = mono_ms() + kSessionDrainMs;
  timers_.emplace(s.timer_at, s.key);
}

void Server::end_session(Session& s) {
  if (!s.running) return;
  s.running = false;
  if (s.timer_at) timers_.erase({s.timer_at, s.key});
  s.timer_at = 0;
  for (int i = 0; i < 2; ++i)
    read_session(s, i, 16 * kReadChunk);  // what is readable now, bounded
  for (int i = 0; i < 3; ++i) {  // closing the master hangs up what is left on the terminal
    unwatch(s.tokens[i], s.fds[i]);
    close_fd(s.fds[i]);
  }
  s.stdin_pending.clear();
  if (Connection* c = conn_of(s.conn)) {
    ws_send(*c, ws::kText,
            "{\"type\":\"exit\",\"exit_code\":" + std::to_string(s.exit_code.value_or(-1)) + "}");
    if (!c->dead) ws_close(*c, 1000, "");
  }
}

bool Server::write_stdin(Session& s, std::string_view data) {
  const int fd = s.tty ? s.fds[0] : s.fds[2];
  if (fd < 0 || data.empty()) return true;  // nobody reads it any more: dropped
  if (s.stdin_pending.size() + data.size() > kMaxStdinPending) return false;
  s.stdin_pending.append(data);
  flush_stdin(s);
  return true;
}

void Server::close_stdin(Session& s) {
  unwatch(s.tokens[2], s.fds[2]);
  close_fd(s.fds[2]);
  s.stdin_pending.clear();
}

void Server::flush_stdin(Session& s) {
  const int stream = s.tty ? 0 : 2;
  const int fd = s.fds[stream];
  if (fd < 0) return;
  while (!s.stdin_pending.empty()) {
    const ssize_t n = ::write(fd, s.stdin_pending.data(), s.stdin_pending.size());
    if (n > 0) {
      s.stdin_pending.erase(0, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    s.stdin_pending.clear();  // the reader is gone
    if (stream == 2) {
      close_stdin(s);
      return;
    }
    break;
  }
  const uint32_t want = (stream == 0 ? static_cast<uint32_t>(EPOLLIN) : 0u) |
                        (s.stdin_pending.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
  rewatch(s.tokens[stream], fd, want);
}

void Server::ws_send(Connection& c, uint8_t opcode, std::string_view payload) {
  if (c.dead || c.closing) return;
  send(c, ws::frame(opcode, payload));
  // A client that does not read is cut, not buffered without end (its session goes on, its
  // output kept in the ring for a later attach with since=).
  if (!c.dead && c.pending() > kWsMaxQueued) close_conn(c);
}

void Server::ws_close(Connection& c, uint16_t code, std::string_view reason) {
  if (c.dead) return;
  ws_send(c, ws::kClose, code ? ws::close_payload(code, reason) : std::string());
  if (c.dead) return;
  if (Session* s = session_of(c.session); s && s->conn == c.key) s->conn = 0;
  c.session = 0;
  c.closing = true;
  c.in.clear();
  if (c.pending() == 0) close_conn(c);
}

void Server::ws_readable(Connection& c) {
  char buf[kReadChunk];
  for (int round = 0; round < 4; ++round) {
    const ssize_t n = ::read(c.fd, buf, sizeof buf);
    if (n > 0) {
      if (!c.closing) c.in.append(buf, static_cast<std::size_t>(n));
      if (c.in.size() > kWsMaxFrame + kReadChunk) break;  // parse what is there first
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // EOF or a reset: the client is gone (the session goes on), after the frames it sent before
    // it went (its last input, a close) are taken.
    ws_input(c);
    if (!c.dead) close_conn(c);
    return;
  }
  ws_input(c);
}

void Server::ws_input(Connection& c) {
  // The frames are read from `c.in` at `pos`, and what they took is erased once, at the end.
  std::size_t pos = 0;
  struct Consume {
    Connection& c;
    std::size_t& pos;
    ~Consume() {
      if (!c.dead) c.in.erase(0, std::min(pos, c.in.size()));
    }
  } consume{c, pos};
  ws::Frame f;
  while (!c.dead && !c.closing && c.ws) {
    const ws::Parser::Result result = c.ws->next(c.in, pos, f);
    if (result == ws::Parser::Result::need_more) return;
    if (result == ws::Parser::Result::error) {
      ws_close(c, c.ws->error_code, c.ws->error_reason);
      return;
    }
    Session* s = session_of(c.session);
    switch (f.opcode) {
      case ws::kPing:
        ws_send(c, ws::kPong, f.payload);
        break;
      case ws::kPong:
        break;
      case ws::kClose: {
        // Answered with the same code (RFC 6455, 5.5.1), then closed; no code: 1000. A one-byte
        // payload, or a code no endpoint may send (7.4.1: 1005, 1006, 1015, unassigned ones),
        // is a protocol error (1002).
        uint16_t code = 1000;
        if (f.payload.size() == 1) {
          code = 1002;
        } else if (f.payload.size() >= 2) {
          code = static_cast<uint16_t>((static_cast<unsigned char>(f.payload[0]) << 8) |
                                       static_cast<unsigned char>(f.payload[1]));
          const bool sendable = (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1011) ||
                                (code >= 3000 && code <= 4999);
          if (!sendable) code = 1002;
        }
        ws_close(c, code, "");
        return;
      }
      case ws::kBinary:
        if (f.payload.empty() || f.payload[0] != '\x00') {
          ws_send(c, ws::kText,
                  "{\"type\":\"error\",\"message\":\"a binary frame is 0x00 and stdin bytes\"}");
        } else if (s && !write_stdin(*s, std::string_view(f.payload).substr(1))) {
          ws_close(c, 1008, "stdin backlog too large");
          return;
        }
        break;
      case ws::kText:
        if (s) ws_message(c, *s, f.payload);
        break;
      default:
        break;
    }
  }
}

// Signals a client may name: with or without "SIG", or as a number.
int signal_number(std::string_view name) {
  if (!name.empty() && name.find_first_not_of("0123456789") == std::string_view::npos &&
      name.size() < 3)
    return std::stoi(std::string(name));
  if (name.starts_with("SIG")) name.remove_prefix(3);
  static const std::pair<std::string_view, int> kNames[] = {
      {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
      {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"ALRM", SIGALRM},
      {"STOP", SIGSTOP}, {"TSTP", SIGTSTP}, {"CONT", SIGCONT}, {"WINCH", SIGWINCH},
      {"PIPE", SIGPIPE}, {"ABRT", SIGABRT}, {"TTIN", SIGTTIN}, {"TTOU", SIGTTOU}};
  for (const auto& [n, sig] : kNames)
    if (n == name) return sig;
  return 0;
}

void Server::ws_message(Connection& c, Session& s, const std::string& text) {
  auto error = [&](const std::string& message) {
    std::string e = "{\"type\":\"error\",\"message\":";
    json::append_string(e, message);
    ws_send(c, ws::kText, e + "}");
  };
  json::Value v;
  std::string why;
  if (!json::parse(text, v, why) || v.kind != json::Value::Kind::object) {
    error("a text frame must be a JSON object");
    return;
  }
  const json::Value* type = v.find("type");
  const std::string kind = type && type->kind == json::Value::Kind::string ? type->text : "";
  if (kind == "ping") {
    ws_send(c, ws::kText, "{\"type\":\"pong\"}");
  } else if (kind == "resize") {
    const json::Value* cols = v.find("cols");
    const json::Value* rows = v.find("rows");
    auto ok = [](const json::Value* n) {
      return n && n->kind == json::Value::Kind::number && n->integer_ok && n->integer > 0 &&
             n->integer <= 65535;
    };
    if (!ok(cols) || !ok(rows)) {
      error("resize needs cols and rows (1 to 65535)");
      return;
    }
    if (!s.tty || s.fds[0] < 0) return;  // pipe mode: no terminal to size
    winsize size{};
    size.ws_col = static_cast<unsigned short>(cols->integer);
    size.ws_row = static_cast<unsigned short>(rows->integer);
    ::ioctl(s.fds[0], TIOCSWINSZ, &size);  // the kernel sends SIGWINCH to the foreground group
  } else if (kind == "signal") {
    const json::Value* name = v.find("signal");
    const int sig = name && name->kind == json::Value::Kind::string ? signal_number(name->text) : 0;
    if (sig <= 0 || sig >= NSIG) {
      error("unknown signal");
      return;
    }
    if (!s.running || s.exited) return;  // a reaped shell's pid may be another's by now
    // In a terminal, the foreground job's group (what Ctrl-C reaches); else the shell's group.
    pid_t group = s.tty && s.fds[0] >= 0 ? ::tcgetpgrp(s.fds[0]) : -1;
    if (group <= 0) group = s.pid;
    ::kill(-group, sig);
  } else {
    error("unknown message type '" + kind + "'");
  }
}

int Server::start_entrypoint() {
  // As for a command, everything is built before the fork: the child only makes system calls.
  std::vector<std::string> env = base_env_;
  if (entry_user_) {
    std::erase_if(env, [](const std::string& e) { return e.starts_with("HOME="); });
    env.push_back("HOME=" + entry_user_->home);
  }
  std::vector<char*> envp;
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = opt_.entrypoint;
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  // The places to try, as execvp searches the PATH the entrypoint gets.
  const std::string& name = opt_.entrypoint[0];
  const std::vector<std::string> paths = exec_candidates(name, env);
  const ChildUser user = child_user(entry_user_);
  const rlimit nofile = nofile_;
  const bool restore_nofile = nofile_raised_;

  int report[2] = {-1, -1};
  if (::pipe2(report, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "sbx-agent: cannot run the entrypoint %s: pipe: %s\n", name.c_str(),
                 std::strerror(errno));
    return 126;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (restore_nofile) ::setrlimit(RLIMIT_NOFILE, &nofile);
    // stdout and stderr stay the agent's (the container's log).
    ChildFailure f = enter_child(user);
    if (f.stage < 0) {
      // execvp's rules: a directory without it or without access is passed over; EACCES is
      // reported if nothing was found, any other error at once.
      int error = ENOENT;
      for (auto& p : paths) {
        ::execve(p.c_str(), argv.data(), envp.data());
        if (errno == EACCES) {
          error = EACCES;
        } else if (errno != ENOENT && errno != ENOTDIR && errno != ESTALE) {
          error = errno;
          break;
        }
      }
      f = {4, error};
    }
    [[maybe_unused]] const ssize_t n = ::write(report[1], &f, sizeof f);
    ::_exit(127);
  }
  const int fork_errno = errno;
  close_fd(report[1]);
  if (pid < 0) {
    close_fd(report[0]);
    std::fprintf(stderr, "sbx-agent: cannot run the entrypoint %s: fork: %s\n", name.c_str(),
                 std::strerror(fork_errno));
    return 126;
  }
  const ChildFailure f = await_exec(pid, report[0]);
  if (f.stage >= 0) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    static const char* const kStage[] = {"setgroups", "setgid", "setuid"};
    const std::string step =
        f.stage >= 0 && f.stage < 3 ? std::string(kStage[f.stage]) + ": " : std::string();
    std::fprintf(stderr, "sbx-agent: cannot run the entrypoint %s: %s%s\n", name.c_str(),
                 step.c_str(), std::strerror(f.error));
    return f.stage == 4 && (f.error == ENOENT || f.error == ENOTDIR) ? 127 : 126;
  }
  entry_pid_ = pid;
  entry_running_ = true;
  return 0;
}

void Server::signal_entrypoint(int sig) {
  // Only while it is unreaped: its pid (and so its group's id) is then nobody else's.
  if (entry_pid_ <= 0 || !entry_running_) return;
  ::kill(-entry_pid_, sig);
  // An entrypoint that moved to another process group still gets it.
  if (::getpgid(entry_pid_) != entry_pid_) ::kill(entry_pid_, sig);
}

void Server::check_expiry() {
  if (expired_) return;
  bool file_read = true;
  if (expiry_dir_ >= 0) {
    if (const auto value = read_expiry_file(expiry_dir_, expiry_name_)) {
      expiry_ = *value;
    } else {
      file_read = false;
    }
  }
  const int64_t now_ms = real_ns() / 1000000;
  const int64_t now_s = now_ms / 1000;
  if (expiry_ > 0 && now_s >= expiry_) {
    // A renew replaces the file by deleting it first: give the writer a moment before the last
    // expiry seen counts.
    if (!file_read && expiry_retries_ < kExpiryRetries) {
      ++expiry_retries_;
      timers_.emplace(mono_ms() + kExpiryRetryMs, kExpiryTimer);
      return;
    }
    expire();
    return;
  }
  expiry_retries_ = 0;
  // Wake at the expiry, and at least every expiry_poll_ms to see a renew (to a later or an earlier
  // time). At least 1 ms: the clocks' rounding must not make it spin before the second turns.
  int64_t wait = opt_.expiry_poll_ms;
  if (expiry_ > 0 && expiry_ - now_s <= wait / 1000 + 1)
    wait = std::min(wait, (expiry_ - now_s) * 1000 - now_ms % 1000);
  timers_.emplace(mono_ms() + std::max<int64_t>(wait, 1), kExpiryTimer);
}

// The sandbox is gone from now on, whatever still has to stop: what runs in it is killed at once
// (a command's stream ends with the expiry's end, see finish(); a PTY session's socket is closed),
// transfers under way are cut (an upload leaves nothing), every new request but GET /ping is
// answered 410 (handle()). Then the agent stops once the ends are sent, or the entrypoint gets
// SIGTERM and the agent stops when it has exited.
void Server::expire() {
  expired_ = true;
  for (auto& [key, cmd] : commands_) {
    if (!cmd->running) continue;
    cmd->expired = true;
    kill_group(*cmd);
    schedule(*cmd);
  }
  std::vector<Session*> sessions;
  for (auto& [key, s] : sessions_)
    sessions.push_back(s.get());
  for (Session* s : sessions)
    remove_session(*s, "sandbox expired");
  for (auto& [key, c] : conns_)
    if (!c->dead && (c->upload || c->download)) close_conn(*c);
  if (!entry_running_) {
    std::fprintf(stderr, "sbx-agent: the sandbox expired (at %lld): stopping\n",
                 static_cast<long long>(expiry_));
    stop_when_drained();
    return;
  }
  std::fprintf(stderr, "sbx-agent: the sandbox expired (at %lld): SIGTERM to the entrypoint\n",
               static_cast<long long>(expiry_));
  signal_entrypoint(SIGTERM);
  timers_.emplace(mono_ms() + opt_.stop_grace_ms, kGraceTimer);
}

void Server::stop_when_drained() {
  if (draining_) return;
  draining_ = true;
  timers_.emplace(mono_ms() + kExpiryDrainMs, kDrainTimer);
}

// Every command killed at the expiry has ended and its end is written (a client that does not
// read keeps it from that until kExpiryDrainMs). Downloads and PTY sockets were cut already.
bool Server::drained() const {
  for (const auto& [key, cmd] : commands_)
    if (cmd->running && cmd->conn) return false;
  for (const auto& [key, c] : conns_)
    if (!c->dead && c->pending() > 0) return false;
  return true;
}

std::string Server::expired_text() const {
  return "the sandbox expired at " + std::to_string(expiry_) + " (Unix seconds)";
}

// ---------------------------------------------------------------------------------------------
// Bash sessions (agent/README.md, "Bash sessions"): POST /session, POST /session/{id}/run,
// DELETE /session/{id}, answered as `sbx serve` answers them (serve/routes_execd_session.cpp).
//
// A session is state, not a process. Each run is a command of its own (start_command: the same
// stream, timeout, kill and client-gone handling as POST /command) whose script restores the
// session's state, runs the command as typed, and saves the state again. The state is a file of
// `export -p` lines in the agent's state directory, the working directory among them; it is
// replaced whole (written beside it, then renamed), so a run killed at any point leaves either the
// old state or the new one, never half of one.

namespace {

// `text` as one single-quoted shell word.
std::string shell_quote(std::string_view text) {
  std::string out = "'";
  for (const char ch : text) {
    if (ch == '\'') {
      out += "'\\''";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

// The script of a run (see above). With the run's own cwd, the session's saved directory is not
// entered; the directory the run ends in is saved either way, as execd's sessions do (the next
// run starts where this one ended). `exit` or `exec`
// in the command ends the shell before the save, leaving the state as it was. SBX_EXEC_ID (each
// command's tag for its kill) is not saved: every run keeps its own. The file is the agent's
// user's alone (umask 077): exported variables may be secrets.
std::string bash_run_script(const std::string& state, bool run_has_cwd,
                            const std::string& command) {
  std::string s = "__sbx_state=" + shell_quote(state) + "\n__sbx_dir=\n";
  s += "if [ -r \"$__sbx_state\" ]; then . \"$__sbx_state\" 2>/dev/null; "
       "__sbx_dir=$__sbx_session_pwd; unset __sbx_session_pwd; ";
  if (!run_has_cwd) s += "if [ -n \"$__sbx_dir\" ]; then cd -- \"$__sbx_dir\" 2>/dev/null; fi; ";
  s += "fi\n";
  s += command;
  if (command.empty() || command.back() != '\n') s += '\n';
  s += "__sbx_rc=$?\n";
  s += "__sbx_session_pwd=$(pwd)\n";
  s += "unset SBX_EXEC_ID; export __sbx_session_pwd\n"
       "(umask 077 && export -p > \"$__sbx_state.$$\") 2>/dev/null && "
       "mv -f \"$__sbx_state.$$\" \"$__sbx_state\" 2>/dev/null\n"
       "exit $__sbx_rc\n";
  return s;
}

}  // namespace

std::string Server::bash_state_path(const std::string& id) const {
  return opt_.state_dir + "/bash-session-" + id;
}

// The session's state file and what killed runs left beside it (`STATE.PID`), all in the agent's
// own state directory.
void Server::remove_bash_state(const std::string& id) const {
  const std::string name = "bash-session-" + id;
  DIR* dir = ::opendir(opt_.state_dir.c_str());
  if (!dir) return;
  std::vector<std::string> gone;
  while (const dirent* e = ::readdir(dir)) {
    const std::string_view n = e->d_name;
    if (n == name || (n.starts_with(name) && n.size() > name.size() && n[name.size()] == '.'))
      gone.emplace_back(n);
  }
  ::closedir(dir);
  for (const auto& n : gone)
    ::unlink((opt_.state_dir + "/" + n).c_str());
}

void Server::post_bash_session(Connection& c) {
  std::string cwd;
  const std::string& body = c.req.body;
  if (body.find_first_not_of(" \t\r\n") != std::string::npos) {
    json::Value v;
    std::string why;
    if (!json::parse(body, v, why)) {
      reply_error(c, 400, "INVALID_REQUEST_BODY", "invalid request body: " + why);
      return;
    }
    if (v.kind != json::Value::Kind::object) {
      reply_error(c, 400, "INVALID_REQUEST_BODY",
                  "invalid request body: the body must be a JSON object");
      return;
    }
    if (const json::Value* f = v.find("cwd"); f && f->kind != json::Value::Kind::null) {
      if (f->kind != json::Value::Kind::string || f->text.find('\0') != std::string::npos) {
        reply_error(c, 400, "INVALID_REQUEST_BODY", "invalid request body: cwd must be a string");
        return;
      }
      cwd = f->text;
    }
  }
  if (bash_sessions_.size() >= kMaxBashSessions) {
    reply_error(c, 429, "TOO_MANY_SESSIONS",
                "the sandbox has its maximum of " + std::to_string(kMaxBashSessions) +
                    " sessions; delete one (DELETE /session/{id})");
    return;
  }
  const std::string id = new_id();
  bash_sessions_[id] = BashSession{id, cwd, {}};
  std::string b = "{\"session_id\":";
  json::append_string(b, id);
  reply(c, 200, "application/json; charset=utf-8", b + "}");
}

void Server::bash_session_run(Connection& c, const std::string& id) {
  const auto it = bash_sessions_.find(id);
  if (it == bash_sessions_.end()) {
    reply_error(c, 404, "CONTEXT_NOT_FOUND", "session " + id + " not found");
    return;
  }
  BashSession& session = it->second;
  using K = json::Value::Kind;
  json::Value v;
  std::string why;
  if (!json::parse(c.req.body, v, why)) {
    reply_error(c, 400, "INVALID_REQUEST_BODY", "invalid request body: " + why);
    return;
  }
  if (v.kind != K::object) {
    reply_error(c, 400, "INVALID_REQUEST_BODY",
                "invalid request body: the body must be a JSON object");
    return;
  }
  const json::Value* command = v.find("command");
  if (!command || command->kind != K::string || command->text.empty() ||
      command->text.find('\0') != std::string::npos) {
    reply_error(c, 400, "INVALID_REQUEST_BODY",
                "invalid request body: command is required (a non-empty string)");
    return;
  }
  CommandRequest req;
  bool run_has_cwd = false;
  if (const json::Value* f = v.find("cwd"); f && f->kind != K::null) {
    if (f->kind != K::string || f->text.find('\0') != std::string::npos) {
      reply_error(c, 400, "INVALID_REQUEST_BODY", "invalid request body: cwd must be a string");
      return;
    }
    if (!f->text.empty()) {
      req.cwd = f->text;
      run_has_cwd = true;
    }
  }
  if (!req.cwd && !session.cwd.empty()) req.cwd = session.cwd;
  if (const json::Value* t = v.find("timeout"); t && t->kind != K::null) {
    if (t->kind != K::number || !t->integer_ok || t->integer < 0) {
      reply_error(c, 400, "INVALID_REQUEST_BODY",
                  "invalid request body: timeout must be a non-negative integer (milliseconds)");
      return;
    }
    req.timeout_ms = t->integer;  // 0: none
  }
  if (req.cwd) {
    struct stat st {};
    if (::stat(req.cwd->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      reply_error(c, 400, "INVALID_REQUEST_BODY",
                  "invalid request body: cwd " + *req.cwd + " is not a directory");
      return;
    }
  }
  req.command = bash_run_script(bash_state_path(id), run_has_cwd, command->text);
  const uint64_t key = start_command(c, req, id);
  if (Command* cmd = command_of(key)) cmd->content = command->text.substr(0, kMaxContent);
  // Every run still going is kept for DELETE to kill (one it missed would save the state again
  // after DELETE removed it); the ended ones are let go.
  std::erase_if(session.runs, [this](uint64_t k) {
    const Command* cmd = command_of(k);
    return !cmd || !cmd->running;
  });
  session.runs.push_back(key);
}

void Server::bash_session_delete(Connection& c, const std::string& id) {
  const auto it = bash_sessions_.find(id);
  if (it == bash_sessions_.end()) {
    reply_error(c, 404, "CONTEXT_NOT_FOUND", "session " + id + " not found");
    return;
  }
  // A run still going is killed (its stream ends with an error event, -1); runs that ended, and
  // what they started in the background, are left alone.
  for (const uint64_t key : it->second.runs) {
    if (Command* cmd = command_of(key); cmd && cmd->running) {
      kill_group(*cmd);
      schedule(*cmd);
    }
  }
  bash_sessions_.erase(it);
  remove_bash_state(id);
  reply(c, 200, "", "");
}

void Server::shutdown() {
  if (shut_) return;
  shut_ = true;
  // The entrypoint's process group goes with the agent (after its exit, the group went with it:
  // see on_signal).
  if (entry_running_) {
    signal_entrypoint(SIGKILL);
    int status = 0;
    while (entry_running_ && ::waitpid(entry_pid_, &status, 0) < 0 && errno == EINTR) {
    }
    entry_running_ = false;
  }
  // Kill what still runs and wait for those children (SIGKILL: they end at once).
  for (auto& [key, cmd] : commands_) {
    if (!cmd->running) continue;
    ::kill(-cmd->pid, SIGKILL);
    int status = 0;
    while (::waitpid(cmd->pid, &status, 0) < 0 && errno == EINTR) {
    }
    for (int s = 0; s < 2; ++s)
      close_fd(cmd->fds[s]);
    close_fd(cmd->log_fd);
    cmd->running = false;
  }
  for (auto& [key, s] : sessions_) {
    for (int i = 0; i < 3; ++i)
      close_fd(s->fds[i]);
    if (!s->running || s->exited) continue;
    ::kill(-s->pid, SIGKILL);
    kill_tagged(s->id);
    int status = 0;
    while (::waitpid(s->pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  for (auto& [key, c] : conns_)
    close_fd(c->fd);
  // As PID 1 (a container's main process) the socket file stays: a client then finds it refusing
  // connections, which tells a sandbox that ended from a socket someone removed (local_docker
  // reports the one as gone, the other as tampered with; decision 251).
  const bool pid1 = ::getpid() == 1;
  for (auto& l : listeners_) {
    close_fd(l.fd);
    struct stat st {};
    // Remove our socket, not one another process put at the same path since.
    if (!pid1 && !l.unix_path.empty() && ::lstat(l.unix_path.c_str(), &st) == 0 &&
        st.st_dev == l.dev && st.st_ino == l.ino)
      ::unlink(l.unix_path.c_str());
  }
  for (auto& [key, cmd] : commands_)
    if (!cmd->log_path.empty()) ::unlink(cmd->log_path.c_str());
  for (const auto& [id, session] : bash_sessions_)
    remove_bash_state(id);
  if (made_state_dir_) ::rmdir(opt_.state_dir.c_str());
  close_fd(sigfd_);
  close_fd(epfd_);
  close_fd(reserve_fd_);
}

}  // namespace

int run(const Options& options) {
  if (options.ping_ms <= 0 || options.expiry_poll_ms <= 0 || options.stop_grace_ms < 0 ||
      options.expires_at < 0) {
    std::fprintf(stderr, "sbx-agent: intervals must be positive, the expiry not negative\n");
    return 1;
  }
  std::optional<Identity> entry_user;
  if (!options.user.empty()) {
    std::string error;
    entry_user = resolve_user_spec(options.etc_dir, options.user, error);
    if (!entry_user) {
      std::fprintf(stderr, "sbx-agent: --user %s: %s\n", options.user.c_str(), error.c_str());
      return 2;
    }
  }
  Server server(options, std::move(entry_user));
  if (const int code = server.start(); code != 0) return code;
  server.loop();
  return server.exit_code();
}

}  // namespace sbx::agent
