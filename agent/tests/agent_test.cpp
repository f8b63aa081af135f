// sbx-agent as a host process: the real binary on a unix socket in a temporary directory, spoken
// to over real HTTP/1.1. Every command it runs stays inside that directory (or reads only).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.hpp"

namespace fs = std::filesystem;
namespace json = sbx::agent::json;

namespace {

// A directory of this test, removed with its contents at the end (it made all of them).
struct TempDir {
  std::string path;
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "sbx-agent-test-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void nap_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000};
  ::nanosleep(&ts, nullptr);
}

int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// The agent as a child process of the test, stopped with SIGTERM at the end unless it exited.
struct Agent {
  pid_t pid = -1;
  std::string socket;
  int exit_status = -1;
  int out = -1;  // with `capture`: the read ends of the agent's stdout and stderr
  int err = -1;

  Agent(const TempDir& dir, std::vector<std::string> extra = {},
        std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin"},
        bool capture = false) {
    socket = dir.path + "/agent.sock";
    std::vector<std::string> args{SBX_AGENT_BIN, "--listen", "unix:" + socket};
    args.insert(args.end(), extra.begin(), extra.end());
    int pipes[2][2] = {{-1, -1}, {-1, -1}};
    if (capture) {
      REQUIRE(::pipe2(pipes[0], O_CLOEXEC) == 0);
      REQUIRE(::pipe2(pipes[1], O_CLOEXEC) == 0);
    }
    pid = spawn(args, env, pipes[0][1], pipes[1][1]);
    if (capture) {
      ::close(pipes[0][1]);
      ::close(pipes[1][1]);
      out = pipes[0][0];
      err = pipes[1][0];
    }
    // Ready when the socket accepts (there is no event to wait on from outside the process).
    for (int i = 0; i < 10000; ++i) {
      const int fd = try_connect(socket);
      if (fd >= 0) {
        ::close(fd);
        return;
      }
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        FAIL("sbx-agent exited at start, status " << status);
      }
      nap_ms(1);
    }
    FAIL("sbx-agent did not listen on " << socket);
  }
  // A clean exit on SIGTERM (under ASan, also: no leak reported at exit). An agent that exited
  // by itself, or was stopped by the test, was checked by the test.
  ~Agent() {
    if (pid > 0) {
      const int status = stop();
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
    if (out >= 0) ::close(out);
    if (err >= 0) ::close(err);
  }

  // Waits (on a pidfd) at most `timeout_ms` for the agent to exit by itself: its wait status, or
  // nullopt when it still runs.
  std::optional<int> wait_exit(int timeout_ms) {
    REQUIRE(pid > 0);
    const int fd = pidfd_open(pid);
    REQUIRE(fd >= 0);
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    ::close(fd);
    if (ready != 1) return std::nullopt;
    REQUIRE(::waitpid(pid, &exit_status, 0) == pid);
    pid = -1;
    return exit_status;
  }

  // `out_fd`/`err_fd`, when not -1, become the child's stdout/stderr.
  static pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
                     int out_fd = -1, int err_fd = -1) {
    std::vector<char*> argv, envp;
    for (auto& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (auto& e : env)
      envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (out_fd >= 0) ::dup2(out_fd, 1);
      if (err_fd >= 0) ::dup2(err_fd, 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    return pid;
  }

  static int try_connect(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    ::close(fd);
    return -1;
  }

  int stop() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, &exit_status, 0);
      pid = -1;
    }
    return exit_status;
  }
};

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// A blocking HTTP/1.1 client over one unix socket connection (keep-alive).
class Client {
 public:
  explicit Client(const std::string& socket) {
    fd_ = Agent::try_connect(socket);
    REQUIRE(fd_ >= 0);
    timeval tv{60, 0};  // a guard against a hung test, not a timed assertion
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~Client() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void send_raw(const std::string& data) {
    std::size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      off += static_cast<std::size_t>(n);
    }
  }

  void send_request(const std::string& method, const std::string& target,
                    const std::string& body = "", const std::vector<std::string>& headers = {}) {
    std::string r = method + " " + target + " HTTP/1.1\r\nHost: agent\r\n";
    for (const auto& h : headers)
      r += h + "\r\n";
    if (!body.empty() || method == "POST")
      r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n";
    r += "\r\n" + body;
    send_raw(r);
  }

  // The status line and headers of the next response.
  Response read_head() {
    Response r;
    std::size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos)
      REQUIRE(read_more());
    const std::string head = buf_.substr(0, end + 2);
    buf_.erase(0, end + 4);
    r.status = std::stoi(head.substr(9, 3));
    std::size_t pos = head.find("\r\n") + 2;
    while (pos < head.size()) {
      const std::size_t e = head.find("\r\n", pos);
      const std::string line = head.substr(pos, e - pos);
      const std::size_t colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (char& c : name)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value[0] == ' ')
        value.erase(0, 1);
      r.headers[name] = value;
      pos = e + 2;
    }
    decoded_.clear();
    chunks_done_ = false;
    return r;
  }

  Response request(const std::string& method, const std::string& target,
                   const std::string& body = "", const std::vector<std::string>& headers = {}) {
    send_request(method, target, body, headers);
    return read_response();
  }

  Response read_response() {
    Response r = read_head();
    if (r.headers.count("transfer-encoding")) {
      while (!chunks_done_)
        next_chunk();
      r.body = decoded_;
      decoded_.clear();
    } else {
      const std::size_t n = std::stoul(r.headers["content-length"]);
      while (buf_.size() < n)
        REQUIRE(read_more());
      r.body = buf_.substr(0, n);
      buf_.erase(0, n);
    }
    return r;
  }

  // The next event of an event stream whose head was read; nullopt at the end of the stream.
  std::optional<json::Value> next_event() {
    std::size_t end;
    while ((end = decoded_.find("\n\n")) == std::string::npos) {
      if (chunks_done_) {
        REQUIRE(decoded_.empty());
        return std::nullopt;
      }
      next_chunk();
    }
    const std::string text = decoded_.substr(0, end);
    decoded_.erase(0, end + 2);
    json::Value v;
    std::string error;
    REQUIRE_MESSAGE(json::parse(text, v, error), error << ": " << text);
    return v;
  }

  // Whether the peer closed the connection (reads until EOF).
  bool at_eof() {
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, 0);
    return n == 0 && buf_.empty();
  }

  int fd() const { return fd_; }

 private:
  bool read_more() {
    char tmp[65536];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<std::size_t>(n));
    return true;
  }
  void next_chunk() {
    std::size_t eol;
    while ((eol = buf_.find("\r\n")) == std::string::npos)
      REQUIRE(read_more());
    const std::size_t size = std::stoul(buf_.substr(0, eol), nullptr, 16);
    while (buf_.size() < eol + 2 + size + 2)
      REQUIRE(read_more());
    REQUIRE(buf_.substr(eol + 2 + size, 2) == "\r\n");
    decoded_ += buf_.substr(eol + 2, size);
    buf_.erase(0, eol + 2 + size + 2);
    if (size == 0) chunks_done_ = true;
  }

  int fd_ = -1;
  std::string buf_;
  std::string decoded_;
  bool chunks_done_ = false;
};

std::string type_of(const json::Value& e) {
  const json::Value* t = e.find("type");
  return t ? t->text : "";
}

std::string text_of(const json::Value& e) {
  const json::Value* t = e.find("text");
  return t ? t->text : "";
}

std::string evalue_of(const json::Value& e) {
  const json::Value* err = e.find("error");
  const json::Value* v = err ? err->find("evalue") : nullptr;
  return v ? v->text : "";
}

std::string command_body(const std::string& command, const std::string& more = "") {
  return "{\"command\":" + json::quote(command) + more + "}";
}

// POSTs `body` to `target` (an event stream) and reads the head, init and first ping; returns
// init's text.
std::string start_stream(Client& client, const std::string& target, const std::string& body) {
  client.send_request("POST", target, body);
  const Response head = client.read_head();
  REQUIRE(head.status == 200);
  CHECK(head.headers.at("content-type") == "text/event-stream");
  const auto init = client.next_event();
  REQUIRE(init);
  REQUIRE(type_of(*init) == "init");
  const auto ping = client.next_event();
  REQUIRE(ping);
  CHECK(type_of(*ping) == "ping");
  return text_of(*init);
}

// Starts a command on `client` (start_stream); returns the command id.
std::string start(Client& client, const std::string& body) {
  std::string id = start_stream(client, "/command", body);
  REQUIRE(id.size() == 32);
  return id;
}

// The rest of a stream's events.
std::vector<json::Value> rest(Client& client) {
  std::vector<json::Value> out;
  while (auto e = client.next_event())
    out.push_back(std::move(*e));
  return out;
}

std::vector<std::string> texts(const std::vector<json::Value>& events, const std::string& type) {
  std::vector<std::string> out;
  for (const auto& e : events)
    if (type_of(e) == type) out.push_back(text_of(e));
  return out;
}

json::Value parse(const std::string& text) {
  json::Value v;
  std::string error;
  REQUIRE_MESSAGE(json::parse(text, v, error), error << ": " << text);
  return v;
}

// Waits (on the pidfd, an event) until the process exited, then checks no live process is left.
void expect_dies(int pidfd, pid_t pid) {
  REQUIRE(pidfd >= 0);
  pollfd p{pidfd, POLLIN, 0};
  CHECK(::poll(&p, 1, 60000) == 1);
  ::close(pidfd);
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return;  // reaped
  char state = '?';
  const int read = std::fscanf(f, "%*d %*s %c", &state);
  std::fclose(f);
  if (read != 1) return;  // reaped between the open and the read
  CHECK(state == 'Z');    // exited, not yet reaped
}

int count_fds(pid_t pid) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

// Children of `pid` (any state, zombies included).
int count_children(pid_t pid) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    FILE* f = std::fopen((e.path() / "stat").c_str(), "r");
    if (!f) continue;
    char buf[1024];
    const std::size_t len = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[len] = '\0';
    const char* close_paren = std::strrchr(buf, ')');
    int ppid = 0;
    char state = 0;
    if (close_paren && std::sscanf(close_paren + 2, "%c %d", &state, &ppid) == 2 && ppid == pid)
      ++n;
  }
  return n;
}

// Polls the agent (there is no event for a background command's progress) until `pred` holds.
template <typename Pred>
void wait_until(Pred pred) {
  for (int i = 0; i < 30000; ++i) {
    if (pred()) return;
    nap_ms(1);
  }
  FAIL("condition never held");
}

}  // namespace

TEST_CASE("GET /ping answers 200 with an empty body; unknown routes are 404") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  const Response r = client.request("GET", "/ping");
  CHECK(r.status == 200);
  CHECK(r.body.empty());
  CHECK(client.request("GET", "/nope").status == 404);
  CHECK(client.request("PUT", "/command").status == 405);
  // Under the real server's direct-endpoint prefix, the same routes (as execd serves them).
  CHECK(client.request("GET", "/proxy/44772/ping").status == 200);
  CHECK(client.request("GET", "/proxy/44772").status == 404);  // "/": no route
  CHECK(client.request("GET", "/proxy/447721/ping").status == 404);
  CHECK(client.request("GET", "/proxy/8080/ping").status == 404);
  struct stat st {};
  REQUIRE(::stat(agent.socket.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(agent.stop() == 0);
  CHECK(::access(agent.socket.c_str(), F_OK) != 0);  // removed at exit
}

TEST_CASE("a foreground command's events: init, output, then error with the exit code") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  const std::string id = start(client, command_body("echo out; echo err >&2; exit 3"));
  const auto events = rest(client);
  REQUIRE(!events.empty());
  CHECK(texts(events, "stdout") == std::vector<std::string>{"out"});
  CHECK(texts(events, "stderr") == std::vector<std::string>{"err"});
  const json::Value& last = events.back();
  CHECK(type_of(last) == "error");
  CHECK(evalue_of(last) == "3");
  CHECK(last.find("error")->find("traceback")->items.at(0).text == "exit status 3");
  CHECK(last.find("timestamp")->integer_ok);

  const json::Value status = parse(client.request("GET", "/command/status/" + id).body);
  CHECK(status.find("running")->boolean == false);
  CHECK(status.find("exit_code")->integer == 3);
  CHECK(status.find("content")->text == "echo out; echo err >&2; exit 3");
  CHECK(status.find("finished_at") != nullptr);

  // Success: execution_complete with the time taken; the connection is kept alive.
  start(client, command_body("echo a; echo b"));
  const auto ok = rest(client);
  CHECK(texts(ok, "stdout") == std::vector<std::string>{"a", "b"});
  CHECK(type_of(ok.back()) == "execution_complete");
  CHECK(ok.back().find("execution_time")->integer_ok);
}

TEST_CASE("output is split into whole lines; a partial last line and a 100 KiB line arrive whole") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  start(client,
        command_body("printf 'a\\nb\\r\\nc\\rd\\n\\n'; head -c 102400 /dev/zero | tr '\\0' x;"
                     " echo; printf partial"));
  const auto events = rest(client);
  const std::vector<std::string> expected{"a",      "b", "c", "d", "\n", std::string(102400, 'x'),
                                          "partial"};
  CHECK(texts(events, "stdout") == expected);
  CHECK(type_of(events.back()) == "execution_complete");

  // Output that is not UTF-8 still gives valid JSON (U+FFFD).
  start(client, command_body("printf 'bad\\377byte\\n'"));
  CHECK(texts(rest(client), "stdout") == std::vector<std::string>{"bad\xEF\xBF\xBD"
                                                                  "byte"});
}

TEST_CASE("env and cwd: the request's envs over the agent's, in the requested directory") {
  TempDir dir;
  fs::create_directory(dir.path + "/work");
  Agent agent(dir, {}, {"PATH=/usr/bin:/bin", "KEPT=from-agent", "SBX_AGENT_TOKEN="});
  Client client(agent.socket);
  start(client, command_body("echo \"$FOO\"; pwd; echo \"$PATH\"; echo \"$KEPT\"",
                             ",\"cwd\":" + json::quote(dir.path + "/work") +
                                 ",\"envs\":{\"FOO\":\"bar baz\",\"KEPT\":\"over\"}"));
  const auto events = rest(client);
  CHECK(texts(events, "stdout") ==
        std::vector<std::string>{"bar baz", fs::canonical(dir.path + "/work").string(),
                                 "/usr/bin:/bin", "over"});

  const Response bad = client.request(
      "POST", "/command", command_body("true", ",\"cwd\":" + json::quote(dir.path + "/missing")));
  CHECK(bad.status == 400);
  CHECK(parse(bad.body).find("code")->text == "INVALID_REQUEST_BODY");
  CHECK(client.request("POST", "/command", "{not json").status == 400);
  CHECK(client.request("POST", "/command", "{\"command\":\"\"}").status == 400);
  CHECK(client.request("POST", "/command", command_body("true", ",\"timeout\":-1")).status == 400);
}

TEST_CASE("EXECD_ENVS: the file's lines under the request's envs, read for every command") {
  TempDir dir;
  const std::string file = dir.path + "/envs";
  {
    std::ofstream out(file);
    out << "# a comment\nFROM_FILE=file\nEXPANDED=$BASE_DIR/bin:${BASE_DIR}\nMALFORMED\n"
           "EMPTY=\nQUOTED=\"a b\"\nOVERRIDE=file\n=nokey\nODD=a$/b$1x${}y${z\n"
           // What the SDKs' set_env writes: single quotes literal, double quotes with escapes.
           "LITERAL='a $BASE_DIR  \\n'\nESCAPED=\"it's \\\"q\\\" \\$BASE_DIR $BASE_DIR\\tx\"\n";
  }
  Agent agent(
      dir, {},
      {"PATH=/usr/bin:/bin", "BASE_DIR=/opt/base", "EXECD_ENVS=" + file, "SBX_AGENT_TOKEN="});
  Client client(agent.socket);
  start(client, command_body("echo \"$FROM_FILE|$EXPANDED|${EMPTY-unset}|$QUOTED|$OVERRIDE|"
                             "${MALFORMED-unset}|$ODD\"",
                             ",\"envs\":{\"OVERRIDE\":\"request\"}"));
  CHECK(texts(rest(client), "stdout") ==
        std::vector<std::string>{"file|/opt/base/bin:/opt/base||a b|request|unset|a$/bxyz"});
  start(client, command_body("printf '%s|%s' \"$LITERAL\" \"$ESCAPED\""));
  CHECK(texts(rest(client), "stdout") ==
        std::vector<std::string>{"a $BASE_DIR  \\n|it's \"q\" $BASE_DIR /opt/base\tx"});
  // A command writes the file; the next one sees it.
  start(client, command_body("echo 'FROM_FILE=again' > \"$EXECD_ENVS\""));
  rest(client);
  start(client, command_body("echo \"$FROM_FILE\""));
  CHECK(texts(rest(client), "stdout") == std::vector<std::string>{"again"});
}

TEST_CASE("without PATH in its environment the agent gives commands a default one") {
  TempDir dir;
  Agent agent(dir, {}, {});
  Client client(agent.socket);
  start(client, command_body("echo \"$PATH\""));
  CHECK(texts(rest(client), "stdout") ==
        std::vector<std::string>{"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"});
}

TEST_CASE("a timeout kills the whole process group, and what left it (the SBX_EXEC_ID tag)") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  // The second child runs in a session of its own, out of the group: its tag finds it.
  start(client, command_body("sleep 30 & echo $!; setsid sleep 30 & echo $!; echo $$; wait",
                             ",\"timeout\":500"));
  std::vector<std::pair<int, pid_t>> watched;
  std::vector<json::Value> events;
  while (auto e = client.next_event()) {
    if (type_of(*e) == "stdout") {
      const pid_t pid = std::stoi(text_of(*e));
      watched.emplace_back(pidfd_open(pid), pid);
    }
    events.push_back(std::move(*e));
  }
  REQUIRE(watched.size() == 3);
  CHECK(type_of(events.back()) == "error");
  CHECK(evalue_of(events.back()) == "-1");
  CHECK(events.back().find("error")->find("traceback")->items.at(0).text == "signal: killed");
  for (auto [fd, pid] : watched)
    expect_dies(fd, pid);
}

TEST_CASE("a client that disconnects mid-stream gets its command killed") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  start(client, command_body("sleep 30 & echo $!; wait"));
  const auto e = client.next_event();
  REQUIRE(e);
  REQUIRE(type_of(*e) == "stdout");
  const pid_t pid = std::stoi(text_of(*e));
  const int pidfd = pidfd_open(pid);
  client.close();
  expect_dies(pidfd, pid);
}

TEST_CASE("DELETE /command?id= kills a running command; its stream ends with error -1") {
  TempDir dir;
  Agent agent(dir);
  Client streaming(agent.socket);
  Client control(agent.socket);
  const std::string id = start(streaming, command_body("sleep 30 & echo $!; wait"));
  const auto e = streaming.next_event();
  REQUIRE(e);
  const pid_t pid = std::stoi(text_of(*e));
  const int pidfd = pidfd_open(pid);
  const Response del = control.request("DELETE", "/command?id=" + id);
  CHECK(del.status == 200);
  CHECK(del.body.empty());
  const auto events = rest(streaming);
  REQUIRE(!events.empty());
  CHECK(type_of(events.back()) == "error");
  CHECK(evalue_of(events.back()) == "-1");
  expect_dies(pidfd, pid);
  CHECK(control.request("DELETE", "/command?id=" + id).status == 500);  // no longer running
  CHECK(control.request("DELETE", "/command?id=unknown").status == 500);
  CHECK(control.request("DELETE", "/command").status == 400);
}

TEST_CASE("background commands: init and execution_complete at once, then status and logs") {
  TempDir dir;
  const std::string fifo = dir.path + "/go";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Agent agent(dir);
  Client client(agent.socket);
  const std::string id = start(
      client, command_body("echo bg; cat " + fifo + "; echo done >&2", ",\"background\":true"));
  const auto events = rest(client);
  REQUIRE(events.size() == 1);
  CHECK(type_of(events[0]) == "execution_complete");

  auto logs = [&](const std::string& cursor) {
    return client.request("GET", "/command/" + id + "/logs?cursor=" + cursor);
  };
  wait_until([&] { return logs("0").body == "bg\n"; });
  json::Value status = parse(client.request("GET", "/command/status/" + id).body);
  CHECK(status.find("running")->boolean == true);
  CHECK(status.find("exit_code") == nullptr);

  {
    const int fd = ::open(fifo.c_str(), O_WRONLY);  // waits for `cat` to open it
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, "x\n", 2) == 2);
    ::close(fd);
  }
  wait_until([&] {
    return !parse(client.request("GET", "/command/status/" + id).body).find("running")->boolean;
  });
  status = parse(client.request("GET", "/command/status/" + id).body);
  CHECK(status.find("exit_code")->integer == 0);
  const Response tail = logs("3");
  CHECK(tail.status == 200);
  CHECK(tail.body == "x\ndone\n");
  CHECK(tail.headers.at("execd-commands-tail-cursor") == "10");
  CHECK(tail.headers.at("content-type") == "text/plain; charset=utf-8");
  const Response end = logs("10");
  CHECK(end.body.empty());
  CHECK(end.headers.at("execd-commands-tail-cursor") == "10");
  CHECK(logs("x").status == 400);

  const Response unknown = client.request("GET", "/command/status/nope");
  CHECK(unknown.status == 404);
  CHECK(parse(unknown.body).find("message")->text == "command not found: nope");
  const std::string fg = start(client, command_body("true"));
  rest(client);
  CHECK(client.request("GET", "/command/" + fg + "/logs").status == 400);
}

TEST_CASE("with a token, every request but GET /ping needs X-EXECD-ACCESS-TOKEN") {
  TempDir dir;
  const std::string token_file = dir.path + "/token";
  {
    FILE* f = std::fopen(token_file.c_str(), "w");
    std::fputs("s3cret\n", f);
    std::fclose(f);
  }
  Agent agent(dir, {"--token-file", token_file}, {"PATH=/usr/bin:/bin", "SBX_AGENT_TOKEN=other"});
  Client client(agent.socket);
  CHECK(client.request("GET", "/ping").status == 200);
  const Response missing = client.request("GET", "/command/status/x");
  CHECK(missing.status == 401);
  CHECK(parse(missing.body).find("error")->text ==
        "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN");
  CHECK(client.request("GET", "/command/status/x", "", {"X-EXECD-ACCESS-TOKEN: s3cre"}).status ==
        401);
  CHECK(client.request("POST", "/command", command_body("true")).status == 401);
  client.send_request("POST", "/command", command_body("echo \"${SBX_AGENT_TOKEN:-unset}\""),
                      {"X-EXECD-ACCESS-TOKEN: s3cret"});
  CHECK(client.read_head().status == 200);
  const auto events = rest(client);
  CHECK(texts(events, "stdout") == std::vector<std::string>{"unset"});  // not passed on
}

TEST_CASE("200 commands in a row leave no zombie and no fd behind") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  start(client, command_body("true"));
  rest(client);
  const int fds_before = count_fds(agent.pid);
  for (int i = 0; i < 200; ++i) {
    start(client, command_body("echo " + std::to_string(i) + (i % 2 ? "; exit 1" : "")));
    const auto events = rest(client);
    REQUIRE(texts(events, "stdout") == std::vector<std::string>{std::to_string(i)});
    REQUIRE(type_of(events.back()) == (i % 2 ? "error" : "execution_complete"));
  }
  CHECK(count_fds(agent.pid) == fds_before);
  CHECK(count_children(agent.pid) == 0);
}

TEST_CASE("pings every --ping-ms of silence while a command runs") {
  TempDir dir;
  const std::string fifo = dir.path + "/go";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Agent agent(dir, {"--ping-ms", "20"});
  Client client(agent.socket);
  start(client, command_body("cat " + fifo));
  const auto e = client.next_event();  // nothing else can come before the fifo is written
  REQUIRE(e);
  CHECK(type_of(*e) == "ping");
  const int fd = ::open(fifo.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "hi\n", 3) == 3);
  ::close(fd);
  const auto events = rest(client);
  CHECK(texts(events, "stdout") == std::vector<std::string>{"hi"});
  CHECK(type_of(events.back()) == "execution_complete");
}

TEST_CASE("without a shell a command fails with an error event that says so") {
  TempDir dir;
  Agent agent(dir, {"--shell", dir.path + "/no-sh"});
  Client client(agent.socket);
  start(client, command_body("true"));
  const auto events = rest(client);
  REQUIRE(events.size() == 1);
  CHECK(type_of(events[0]) == "error");
  CHECK(evalue_of(events[0]).find("a shell is needed") != std::string::npos);
}

TEST_CASE("users by name or uid, from the root's /etc/passwd and /etc/group") {
  if (::geteuid() != 0) return;  // switching users needs root
  TempDir dir;
  fs::create_directory(dir.path + "/etc");
  {
    FILE* f = std::fopen((dir.path + "/etc/passwd").c_str(), "w");
    std::fputs("root:x:0:0:root:/root:/bin/sh\ntester:x:4242:4343::/home/tester:/bin/sh\n", f);
    std::fclose(f);
    f = std::fopen((dir.path + "/etc/group").c_str(), "w");
    std::fputs("root:x:0:\nmain:x:4343:\nextra:x:5555:someone,tester\n", f);
    std::fclose(f);
  }
  Agent agent(dir, {"--etc-dir", dir.path + "/etc"});
  Client client(agent.socket);
  const std::string probe = "id -u; id -g; id -G; echo \"$HOME\"";
  start(client, command_body(probe, ",\"user\":\"tester\",\"cwd\":\"/\""));
  const std::vector<std::string> expected{"4242", "4343", "4343 5555", "/home/tester"};
  CHECK(texts(rest(client), "stdout") == expected);
  start(client, command_body(probe, ",\"uid\":4242,\"cwd\":\"/\""));
  CHECK(texts(rest(client), "stdout") == expected);
  start(client, command_body("id -u; id -g", ",\"uid\":777,\"gid\":778,\"cwd\":\"/\""));
  CHECK(texts(rest(client), "stdout") == std::vector<std::string>{"777", "778"});
  CHECK(client.request("POST", "/command", command_body("true", ",\"user\":\"nobody-here\""))
            .status == 400);
  CHECK(client.request("POST", "/command", command_body("true", ",\"gid\":5")).status == 400);
  // A directory the user may not enter: the chdir fails in the child, reported as an event.
  start(client, command_body("true", ",\"user\":\"tester\",\"cwd\":" + json::quote(dir.path)));
  const auto events = rest(client);
  CHECK(type_of(events.back()) == "error");
  CHECK(evalue_of(events.back()).find("chdir") != std::string::npos);
}

TEST_CASE("HTTP limits: head, body, chunked bodies, Expect: 100-continue, HTTP/1.0") {
  TempDir dir;
  Agent agent(dir);
  {
    Client client(agent.socket);
    client.send_raw("GET /ping HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
    CHECK(client.read_response().status == 431);
  }
  {
    Client client(agent.socket);
    client.send_raw("POST /command HTTP/1.1\r\nContent-Length: 9000000\r\n\r\n");
    CHECK(client.read_response().status == 413);
  }
  {
    Client client(agent.socket);
    client.send_raw("POST /command HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    CHECK(client.read_response().status == 411);
  }
  {
    Client client(agent.socket);
    const std::string body = command_body("echo hi");
    client.send_raw("POST /command HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n");
    CHECK(client.read_head().status == 100);
    client.send_raw(body);
    CHECK(client.read_head().status == 200);
    CHECK(texts(rest(client), "stdout") == std::vector<std::string>{"hi"});
  }
  {
    Client client(agent.socket);
    client.send_raw("GET /ping HTTP/1.0\r\n\r\n");
    CHECK(client.read_response().status == 200);
    CHECK(client.at_eof());
  }
  {
    // A client that half-closes after its request still gets the answer, then the close.
    Client client(agent.socket);
    client.send_raw("GET /ping HTTP/1.1\r\n\r\n");
    ::shutdown(client.fd(), SHUT_WR);
    CHECK(client.read_response().status == 200);
    CHECK(client.at_eof());
  }
  {
    // Two requests in one write: the second is answered after the first's stream.
    Client client(agent.socket);
    const std::string body = command_body("echo one");
    client.send_raw("POST /command HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\n\r\n" + body + "GET /ping HTTP/1.1\r\n\r\n");
    CHECK(client.read_head().status == 200);
    CHECK(texts(rest(client), "stdout") == std::vector<std::string>{"one"});
    CHECK(client.read_response().status == 200);
  }
}

TEST_CASE("the agent refuses to replace a file that is not a socket") {
  TempDir dir;
  const std::string path = dir.path + "/agent.sock";
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("keep me", f);
    std::fclose(f);
  }
  const pid_t pid = Agent::spawn({SBX_AGENT_BIN, "--listen", "unix:" + path}, {});
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
}

// ---------------------------------------------------------------------------------------------
// Files

namespace {

constexpr const char* kBoundary = "sbx-test-boundary-7f3a";

// A multipart body of (metadata JSON, file content) pairs.
std::string multipart(const std::vector<std::pair<std::string, std::string>>& pairs,
                      bool close = true) {
  std::string b;
  for (const auto& [meta, content] : pairs) {
    b += std::string("--") + kBoundary +
         "\r\nContent-Disposition: form-data; name=\"metadata\"\r\n"
         "Content-Type: application/json\r\n\r\n" +
         meta + "\r\n";
    b += std::string("--") + kBoundary +
         "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"blob\"\r\n"
         "Content-Type: application/octet-stream\r\n\r\n" +
         content + "\r\n";
  }
  if (close) b += std::string("--") + kBoundary + "--\r\n";
  return b;
}

std::string upload_head(std::size_t length, const std::vector<std::string>& extra = {}) {
  std::string h =
      "POST /files/upload HTTP/1.1\r\nHost: agent\r\n"
      "Content-Type: multipart/form-data; boundary=" +
      std::string(kBoundary) + "\r\nContent-Length: " + std::to_string(length) + "\r\n";
  for (const auto& e : extra)
    h += e + "\r\n";
  return h + "\r\n";
}

Response upload(Client& client, const std::string& body) {
  client.send_raw(upload_head(body.size()) + body);
  return client.read_response();
}

std::string meta(const std::string& path, const std::string& more = "") {
  return "{\"path\":" + json::quote(path) + more + "}";
}

std::string read_file(const std::string& path) {
  std::string out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "<missing>";
  char buf[65536];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
    out.append(buf, n);
  std::fclose(f);
  return out;
}

void write_file(const std::string& path, const std::string& content) {
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f);
  std::fwrite(content.data(), 1, content.size(), f);
  std::fclose(f);
}

// Temp files of uploads left anywhere under `dir`.
int upload_temps(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().starts_with(".sbx-upload-")) ++n;
  return n;
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

ino_t inode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_ino;
}

// Bytes that do not repeat (so a misplaced piece shows), from a fixed seed.
std::string pseudo_random(std::size_t size) {
  std::string out(size, '\0');
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (std::size_t i = 0; i < size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, std::min<std::size_t>(8, size - i));
  }
  return out;
}

// The agent's peak resident memory (VmHWM), in KiB.
long peak_rss_kib(pid_t pid) {
  const std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
  const std::size_t at = status.find("VmHWM:");
  REQUIRE(at != std::string::npos);
  return std::strtol(status.c_str() + at + 6, nullptr, 10);
}

// Waits (inotify, an event) for an entry of `dir` named with `prefix` to see `mask` happen.
struct DirWatch {
  int fd = -1;
  explicit DirWatch(const std::string& dir, uint32_t mask) {
    fd = ::inotify_init1(IN_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::inotify_add_watch(fd, dir.c_str(), mask) >= 0);
  }
  ~DirWatch() { ::close(fd); }
  std::string wait(const std::string& prefix) {
    alignas(inotify_event) char buf[4096];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      REQUIRE(::poll(&p, 1, 60000) == 1);  // a guard against a hung test, not a timed assertion
      const ssize_t n = ::read(fd, buf, sizeof buf);
      REQUIRE(n > 0);
      for (ssize_t off = 0; off < n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(buf + off);
        const std::string name = e->len ? e->name : "";
        if (name.starts_with(prefix)) return name;
        off += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      }
    }
  }
};

std::string code_of(const Response& r) {
  const json::Value v = parse(r.body);
  const json::Value* code = v.find("code");
  return code ? code->text : "";
}

}  // namespace

TEST_CASE("upload: several pairs with modes, parents made, a relative path under --workdir") {
  TempDir dir;
  Agent agent(dir, {"--workdir", dir.path + "/wd"});
  fs::create_directory(dir.path + "/wd");
  Client client(agent.socket);
  const std::string a = dir.path + "/up/a/b/c.txt";
  const std::string x = dir.path + "/up/x.sh";
  const Response r = upload(client, multipart({{meta(a, ",\"mode\":600"), "first\r\n--not-it"},
                                               {meta(x, ",\"mode\":755"), "#!/bin/sh\n"},
                                               {meta("rel/y.bin"), std::string("\0\r\n\0", 4)},
                                               {meta(dir.path + "/up/empty"), ""}}));
  CHECK(r.status == 200);
  CHECK(r.body.empty());
  CHECK(read_file(a) == "first\r\n--not-it");
  CHECK(mode_of(a) == 0600);
  CHECK(read_file(x) == "#!/bin/sh\n");
  CHECK(mode_of(x) == 0755);
  CHECK(read_file(dir.path + "/wd/rel/y.bin") == std::string("\0\r\n\0", 4));
  CHECK(mode_of(dir.path + "/wd/rel/y.bin") == 0644);
  CHECK(read_file(dir.path + "/up/empty").empty());
  CHECK(upload_temps(dir.path) == 0);

  // Expect: 100-continue is answered before the body is sent.
  const std::string body = multipart({{meta(a, ",\"mode\":640"), "second"}});
  client.send_raw(upload_head(body.size(), {"Expect: 100-continue"}));
  CHECK(client.read_head().status == 100);
  client.send_raw(body);
  CHECK(client.read_response().status == 200);
  CHECK(read_file(a) == "second");
  CHECK(mode_of(a) == 0640);
}

TEST_CASE("upload errors answer as serve does and change nothing") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  const std::string kept = dir.path + "/kept";
  write_file(kept, "old");
  auto expect = [&](const std::string& body, int status, const std::string& code) {
    const Response r = upload(client, body);
    CHECK(r.status == status);
    CHECK(code_of(r) == code);
  };
  // The first pair is good, the second is not: neither is written.
  expect(multipart({{meta(kept), "new"}, {"{not json", "x"}}), 400, "INVALID_FILE_METADATA");
  expect(multipart({{meta(kept), "new"}, {"{\"mode\":644}", "x"}}), 400, "INVALID_FILE_METADATA");
  expect(multipart({{meta(kept, ",\"mode\":999"), "x"}}), 400, "INVALID_FILE_METADATA");
  expect(multipart({{meta(kept, ",\"owner\":\"no-such-user-here\""), "x"}}), 400,
         "INVALID_FILE_METADATA");
  expect(multipart({{meta(kept), "new"}}, false), 400, "INVALID_FILE_CONTENT");
  expect(multipart({{meta(dir.path), "x"}}), 400, "INVALID_FILE");  // a directory
  expect(multipart({{meta(kept + "/below"), "x"}}), 400, "INVALID_FILE");
  expect(std::string("--") + kBoundary + "--\r\n", 400, "INVALID_FILE");  // no file
  // A file part before any metadata; a metadata part without its file.
  expect(std::string("--") + kBoundary +
             "\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx\r\n--" + kBoundary +
             "--\r\n",
         400, "INVALID_FILE_METADATA");
  expect(std::string("--") + kBoundary + "\r\nContent-Disposition: form-data; name=\"metadata\"" +
             "\r\n\r\n" + meta(kept) + "\r\n--" + kBoundary + "--\r\n",
         400, "INVALID_FILE");
  CHECK(read_file(kept) == "old");
  CHECK(upload_temps(dir.path) == 0);
  CHECK(!fs::exists(dir.path + "/below"));
  // The connection stayed usable after each of them.
  CHECK(client.request("GET", "/ping").status == 200);
  // Not multipart: refused from the head, and the connection closed (its body was not read).
  client.send_raw(
      "POST /files/upload HTTP/1.1\r\nContent-Type: text/plain\r\n"
      "Content-Length: 3\r\n\r\nabc");
  const Response plain = client.read_response();
  CHECK(plain.status == 400);
  CHECK(code_of(plain) == "INVALID_FILE");
  CHECK(client.at_eof());
  // The body limit of other routes does not apply, and GET is 405.
  Client other(agent.socket);
  CHECK(other.request("GET", "/files/upload").status == 405);
}

TEST_CASE("upload replaces the destination atomically: a reader never sees a partial file") {
  TempDir dir;
  Agent agent(dir);
  const std::string dest = dir.path + "/data.txt";
  const std::string old_content(300000, 'o');
  write_file(dest, old_content);
  const ino_t old_inode = inode_of(dest);
  const int old_fd = ::open(dest.c_str(), O_RDONLY);  // a reader of the old file
  REQUIRE(old_fd >= 0);

  const std::string content = pseudo_random(3 * 1024 * 1024);
  const std::string body = multipart({{meta(dest, ",\"mode\":644"), content}});
  DirWatch created(dir.path, IN_CREATE);
  Client client(agent.socket);
  client.send_raw(upload_head(body.size()) + body.substr(0, body.size() / 2));
  const std::string temp = dir.path + "/" + created.wait(".sbx-upload-");
  // Half the body is in: the destination is the old file, whole; the new one is a 0600 temp file.
  CHECK(mode_of(temp) == 0600);
  CHECK(inode_of(dest) == old_inode);
  CHECK(read_file(dest) == old_content);
  client.send_raw(body.substr(body.size() / 2));
  CHECK(client.read_response().status == 200);
  CHECK(inode_of(dest) != old_inode);
  CHECK(read_file(dest) == content);
  CHECK(mode_of(dest) == 0644);
  CHECK(!fs::exists(temp));
  std::string seen(old_content.size() + 1, '\0');
  CHECK(::pread(old_fd, seen.data(), seen.size(), 0) == static_cast<ssize_t>(old_content.size()));
  seen.resize(old_content.size());
  CHECK(seen == old_content);
  ::close(old_fd);
}

TEST_CASE("a truncated upload (the client gone) leaves no temp file, no file, no new directory") {
  TempDir dir;
  Agent agent(dir);
  const std::string body = multipart({{meta(dir.path + "/made/sub/f"), std::string(200000, 'z')}});
  {
    DirWatch deleted(dir.path, IN_DELETE | IN_ONLYDIR);
    Client client(agent.socket);
    client.send_raw(upload_head(body.size()) + body.substr(0, body.size() - 100));
    client.close();
    deleted.wait("made");  // the last thing removed: the directories it made
  }
  CHECK(!fs::exists(dir.path + "/made"));
  CHECK(upload_temps(dir.path) == 0);

  // Whole pairs in, the closing boundary not: the written pair goes too.
  const std::string dest = dir.path + "/g";
  const std::string two = multipart({{meta(dest), "complete"}}, false);
  {
    DirWatch deleted(dir.path, IN_DELETE);
    Client client(agent.socket);
    client.send_raw(upload_head(two.size() + 50) + two);
    client.close();
    deleted.wait(".sbx-upload-");
  }
  CHECK(!fs::exists(dest));
  CHECK(upload_temps(dir.path) == 0);
}

// `body` as a chunked body in chunks of `piece` bytes (with an extension on the first), ended
// with the last chunk and a trailer field when `end`.
std::string chunked(const std::string& body, std::size_t piece, bool end = true) {
  std::string out;
  char size[32];
  for (std::size_t at = 0; at < body.size(); at += piece) {
    const std::size_t n = std::min(piece, body.size() - at);
    std::snprintf(size, sizeof size, "%zx", n);
    out += std::string(size) + (at == 0 ? ";ext=1" : "") + "\r\n" + body.substr(at, n) + "\r\n";
  }
  if (end) out += "0\r\nX-Trailer: t\r\n\r\n";
  return out;
}

std::string chunked_upload_head() {
  return "POST /files/upload HTTP/1.1\r\nHost: agent\r\n"
         "Content-Type: multipart/form-data; boundary=" +
         std::string(kBoundary) + "\r\nTransfer-Encoding: chunked\r\n\r\n";
}

TEST_CASE("a chunked upload: whole, ended early (answered once its temp file is gone), malformed") {
  TempDir dir;
  Agent agent(dir);
  const std::string dest = dir.path + "/c/file.bin";
  const std::string content = pseudo_random(300000);
  {
    Client client(agent.socket);
    client.send_raw(chunked_upload_head() + chunked(multipart({{meta(dest), content}}), 7777));
    CHECK(client.read_response().status == 200);
    CHECK(read_file(dest) == content);
    // The connection is still in step: the next request on it is answered.
    CHECK(client.request("GET", "/ping").status == 200);
  }
  {
    // The body ends before its multipart does (how local_docker abandons an upload): 400, and by
    // the time the answer is read the temp file and the directories it made are gone.
    Client client(agent.socket);
    const std::string part = multipart({{meta(dir.path + "/made/x"), content}}, false);
    client.send_raw(chunked_upload_head() + chunked(part.substr(0, 100000), 4096));
    const Response r = client.read_response();
    CHECK(r.status == 400);
    CHECK(r.body.find("INVALID_FILE_CONTENT") != std::string::npos);
    CHECK(upload_temps(dir.path) == 0);
    CHECK(!fs::exists(dir.path + "/made"));
    CHECK(read_file(dest) == content);  // the earlier file is untouched
  }
  {
    Client client(agent.socket);
    client.send_raw(chunked_upload_head() + "zz\r\nabc\r\n");
    const Response r = client.read_response();
    CHECK(r.status == 400);
    CHECK(r.body.find("malformed chunk") != std::string::npos);
    CHECK(upload_temps(dir.path) == 0);
  }
  {
    Client client(agent.socket);
    client.send_raw(
        "POST /files/upload HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n");
    CHECK(client.read_response().status == 501);
  }
}

TEST_CASE("64 MiB up and down, byte-exact, with the agent's memory bounded") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  const std::string dest = dir.path + "/big.bin";
  const std::string content = pseudo_random(64 * 1024 * 1024);
  CHECK(upload(client, multipart({{meta(dest), content}})).status == 200);
  CHECK(fs::file_size(dest) == content.size());
  CHECK(read_file(dest) == content);
  const long after_upload = peak_rss_kib(agent.pid);
  const Response r = client.request("GET", "/files/download?path=" + dest);
  CHECK(r.status == 200);
  CHECK(r.headers.at("content-length") == std::to_string(content.size()));
  CHECK(r.body.size() == content.size());
  CHECK(r.body == content);
  const long after_download = peak_rss_kib(agent.pid);
  MESSAGE("agent peak RSS: " << after_upload << " KiB after the upload, " << after_download
                             << " KiB after the download");
#if SBX_AGENT_STATIC  // the sanitizers' runtimes keep memory of their own
  CHECK(after_upload < 16 * 1024);
  CHECK(after_download < 16 * 1024);
#endif
  CHECK(client.request("GET", "/ping").status == 200);  // kept alive after the stream
}

TEST_CASE("download: whole, Range, 416, 404, 400, not a regular file") {
  TempDir dir;
  Agent agent(dir, {"--workdir", dir.path});
  Client client(agent.socket);
  const std::string hello = dir.path + "/hello.txt";
  write_file(hello, "hello file\n");
  const Response whole = client.request("GET", "/files/download?path=" + hello);
  CHECK(whole.status == 200);
  CHECK(whole.body == "hello file\n");
  CHECK(whole.headers.at("content-type") == "application/octet-stream");
  CHECK(whole.headers.at("accept-ranges") == "bytes");
  CHECK(whole.headers.at("content-disposition") == "attachment; filename=\"hello.txt\"");
  CHECK(whole.headers.at("last-modified").ends_with(" GMT"));
  CHECK(client.request("GET", "/files/download?path=hello.txt").body == "hello file\n");

  const Response part =
      client.request("GET", "/files/download?path=" + hello, "", {"Range: bytes=6-"});
  CHECK(part.status == 206);
  CHECK(part.body == "file\n");
  CHECK(part.headers.at("content-range") == "bytes 6-10/11");
  CHECK(client.request("GET", "/files/download?path=" + hello, "", {"Range: bytes=-3"}).body ==
        "le\n");
  CHECK(client.request("GET", "/files/download?path=" + hello, "", {"Range: bytes=1-2"}).body ==
        "el");
  // Not one byte range: ignored, the whole file.
  CHECK(
      client.request("GET", "/files/download?path=" + hello, "", {"Range: bytes=0-1,3-4"}).status ==
      200);
  const Response beyond =
      client.request("GET", "/files/download?path=" + hello, "", {"Range: bytes=11-"});
  CHECK(beyond.status == 416);
  CHECK(beyond.headers.at("content-range") == "bytes */11");
  CHECK(code_of(beyond) == "INVALID_FILE");

  const std::string nope = dir.path + "/nope.txt";
  const Response missing = client.request("GET", "/files/download?path=" + nope);
  CHECK(missing.status == 404);
  CHECK(missing.headers.at("content-type") == "application/json; charset=utf-8");
  CHECK(missing.body == "{\"code\":\"FILE_NOT_FOUND\",\"message\":\"file not found. open " + nope +
                            ": no such file or directory\"}");
  const Response no_path = client.request("GET", "/files/download");
  CHECK(no_path.status == 400);
  CHECK(code_of(no_path) == "MISSING_QUERY");
  const Response directory = client.request("GET", "/files/download?path=" + dir.path);
  CHECK(directory.status == 400);
  CHECK(parse(directory.body).find("message")->text ==
        dir.path + " is not a regular file (a directory)");
  fs::create_symlink(hello, dir.path + "/link");
  const Response link = client.request("GET", "/files/download?path=" + dir.path + "/link");
  CHECK(link.status == 400);
  CHECK(parse(link.body).find("message")->text.ends_with("(a symbolic link)"));

  const std::string empty = dir.path + "/empty";
  write_file(empty, "");
  const Response nothing = client.request("GET", "/files/download?path=" + empty);
  CHECK(nothing.status == 200);
  CHECK(nothing.body.empty());

  // Pipelined behind a download: answered after it, in order.
  client.send_raw("GET /files/download?path=" + hello +
                  " HTTP/1.1\r\n\r\nGET /ping HTTP/1.1\r\n\r\n");
  CHECK(client.read_response().body == "hello file\n");
  CHECK(client.read_response().status == 200);
  // HTTP/1.0: the download, then the close.
  Client once(agent.socket);
  once.send_raw("GET /files/download?path=" + hello + " HTTP/1.0\r\n\r\n");
  CHECK(once.read_response().body == "hello file\n");
  CHECK(once.at_eof());
}

TEST_CASE("GET /files/info: a file, a directory, several paths, a missing one") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  const std::string file = dir.path + "/hello.txt";
  write_file(file, "hello file\n");
  ::chmod(file.c_str(), 0644);
  ::chmod(dir.path.c_str(), 0750);
  const Response r = client.request("GET", "/files/info?path=" + file + "&path=" + dir.path);
  CHECK(r.status == 200);
  CHECK(r.headers.at("content-type") == "application/json; charset=utf-8");
  const json::Value v = parse(r.body);
  const json::Value* f = v.find(file);
  REQUIRE(f);
  CHECK(f->find("path")->text == file);
  CHECK(f->find("type")->text == "file");
  CHECK(f->find("size")->integer == 11);
  CHECK(f->find("mode")->integer == 644);
  CHECK(f->find("owner")->text == std::to_string(::geteuid()));
  CHECK(f->find("group")->text == std::to_string(::getegid()));
  CHECK(f->find("modified_at")->text.size() == 30);  // 2026-11-30T23:18:17.296973512Z
  CHECK(f->find("created_at")->text.ends_with("Z"));
  const json::Value* d = v.find(dir.path);
  REQUIRE(d);
  CHECK(d->find("type")->text == "directory");
  CHECK(d->find("mode")->integer == 750);

  const Response missing = client.request("GET", "/files/info?path=" + dir.path + "/nope");
  CHECK(missing.status == 404);
  CHECK(parse(missing.body).find("message")->text ==
        "file not found. stat " + dir.path + "/nope: no such file or directory");
  CHECK(client.request("GET", "/files/info").status == 400);
}

TEST_CASE("with a token, an upload without it is refused before anything is written") {
  TempDir dir;
  Agent agent(dir, {}, {"PATH=/usr/bin:/bin", "SBX_AGENT_TOKEN=s3cret"});
  const std::string dest = dir.path + "/f";
  const std::string body = multipart({{meta(dest), "x"}});
  {
    Client client(agent.socket);
    CHECK(upload(client, body).status == 401);
  }
  CHECK(!fs::exists(dest));
  Client client(agent.socket);
  client.send_raw(upload_head(body.size(), {"X-EXECD-ACCESS-TOKEN: s3cret"}) + body);
  CHECK(client.read_response().status == 200);
  CHECK(read_file(dest) == "x");
  CHECK(client.request("GET", "/files/info?path=" + dest).status == 401);
}

TEST_CASE("upload owner and group by name or id, from the root's /etc (as root)") {
  if (::geteuid() != 0) return;  // chown needs root
  TempDir dir;
  fs::create_directory(dir.path + "/etc");
  write_file(dir.path + "/etc/passwd",
             "root:x:0:0:root:/root:/bin/sh\n"
             "tester:x:4242:4343::/home/tester:/bin/sh\n");
  write_file(dir.path + "/etc/group", "root:x:0:\nmain:x:4343:\nextra:x:5555:tester\n");
  Agent agent(dir, {"--etc-dir", dir.path + "/etc"});
  Client client(agent.socket);
  const std::string a = dir.path + "/a", b = dir.path + "/b", c = dir.path + "/c";
  CHECK(upload(client,
               multipart({{meta(a, ",\"owner\":\"tester\",\"group\":\"extra\",\"mode\":4750"), "a"},
                          {meta(b, ",\"owner\":\"777\",\"group\":\"778\""), "b"},
                          {meta(c, ",\"owner\":\"tester\""), "c"}}))
            .status == 200);
  struct stat st {};
  REQUIRE(::stat(a.c_str(), &st) == 0);
  CHECK(st.st_uid == 4242);
  CHECK(st.st_gid == 5555);
  CHECK((st.st_mode & 07777) == 04750);  // set after the chown, which would clear it
  REQUIRE(::stat(b.c_str(), &st) == 0);
  CHECK(st.st_uid == 777);
  CHECK(st.st_gid == 778);
  REQUIRE(::stat(c.c_str(), &st) == 0);
  CHECK(st.st_uid == 4242);
  CHECK(st.st_gid == 0);  // the group is left as it was made
  const Response bad = upload(client, multipart({{meta(a, ",\"group\":\"nope\""), "x"}}));
  CHECK(bad.status == 400);
  CHECK(code_of(bad) == "INVALID_FILE_METADATA");
}

// sbx frames (Accept: application/vnd.sbx.frames): kind byte, 4-byte big-endian length, payload.
std::vector<std::pair<char, std::string>> frames_of(const std::string& body) {
  std::vector<std::pair<char, std::string>> out;
  std::size_t at = 0;
  while (at < body.size()) {
    REQUIRE(body.size() - at >= 5);
    uint32_t n = 0;
    for (int i = 1; i <= 4; ++i)
      n = (n << 8) | static_cast<unsigned char>(body[at + i]);
    REQUIRE(body.size() - at - 5 >= n);
    out.emplace_back(body[at], body.substr(at + 5, n));
    at += 5 + n;
  }
  return out;
}

TEST_CASE("frames: output byte-exact (no line splitting, binary kept), then the end as JSON") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  const std::vector<std::string> accept = {"Accept: application/vnd.sbx.frames"};
  auto run = [&](const std::string& body) {
    const Response r = client.request("POST", "/command", body, accept);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(r.headers.at("content-type") == "application/vnd.sbx.frames");
    return frames_of(r.body);
  };
  {
    const auto frames =
        run(command_body("printf 'a\\r\\nb\\377'; printf 'no newline' >&2; exit 4"));
    REQUIRE(frames.size() >= 2);
    CHECK(frames.front().first == 'i');
    CHECK(frames.front().second.size() == 32);
    std::string out, err;
    for (const auto& [kind, payload] : frames) {
      if (kind == 'o') out += payload;
      if (kind == 'e') err += payload;
    }
    CHECK(out == "a\r\nb\xff");
    CHECK(err == "no newline");
    CHECK(frames.back() == std::pair<char, std::string>{'x', "{\"exit_code\":4}"});
  }
  {
    const auto frames = run(command_body("sleep 30", ",\"timeout\":200"));
    CHECK(frames.back() == std::pair<char, std::string>{'x', "{\"signal\":9,\"timed_out\":true}"});
  }
  {
    // argv (an sbx extension): no shell; a bare name is looked up in the command's PATH.
    const auto frames = run("{\"argv\":[\"printf\",\"%s|\",\"a b\",\"$HOME\"]}");
    REQUIRE(frames.size() == 3);
    CHECK(frames[1] == std::pair<char, std::string>{'o', "a b|$HOME|"});
    const auto missing = run("{\"argv\":[\"no-such-program-sbx\"]}");
    CHECK(missing.back() ==
          std::pair<char, std::string>{
              'x', "{\"error\":\"exec no-such-program-sbx: executable file not found in $PATH\"}"});
  }
  // A command that cannot start (here: no shell) ends with an error, after the head.
  TempDir shell_dir;
  Agent shell_less(shell_dir, {"--shell", "/nonexistent/sh"});
  Client third(shell_less.socket);
  const Response failed = third.request("POST", "/command", command_body("true"), accept);
  const auto end = frames_of(failed.body).back();
  CHECK(end.first == 'x');
  CHECK(end.second.find("{\"error\":\"/nonexistent/sh: ") == 0);
  // Pings while silent: a frame of kind 'p' with no payload.
  TempDir quick_dir;
  Agent quick(quick_dir, {"--ping-ms", "50"});
  Client other(quick.socket);
  const Response r = other.request("POST", "/command", command_body("sleep 0.3"), accept);
  const auto frames = frames_of(r.body);
  CHECK(std::count_if(frames.begin(), frames.end(),
                      [](const auto& f) { return f.first == 'p' && f.second.empty(); }) >= 2);
  CHECK(frames.back().second == "{\"exit_code\":0}");
}

// ---------------------------------------------------------------------------------------------
// PID-1 duties: the entrypoint, forwarded signals, the expiry

namespace {

int64_t real_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

int64_t mono_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Sleeps until the real-time clock reads `ms` (Unix ms): the expiry is wall-clock time, and a
// test that something still runs at a given time has no event to wait on.
void sleep_until_real(int64_t ms) {
  for (int64_t left = ms - real_ms(); left > 0; left = ms - real_ms())
    nap_ms(static_cast<long>(left));
}

// The exit code of a wait status, or 1000 + the signal that killed the process.
int code_of_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 1000 + WTERMSIG(status) : -1;
}

// The next line on `fd` (without its newline), waited for with poll; nullopt at EOF or after 30 s.
// `pending` keeps what was read beyond it.
std::optional<std::string> read_line(int fd, std::string& pending) {
  const int64_t deadline = mono_ms() + 30000;
  for (;;) {
    if (const std::size_t nl = pending.find('\n'); nl != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      return line;
    }
    pollfd p{fd, POLLIN, 0};
    const int64_t left = deadline - mono_ms();
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) return std::nullopt;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return std::nullopt;
    pending.append(buf, static_cast<std::size_t>(n));
  }
}

// An agent run to its exit, with its stdout and stderr (which its entrypoint inherits) captured.
struct Finished {
  int status = -1;
  std::string out;
  std::string err;
};

Finished run_agent(const TempDir& dir, const std::vector<std::string>& extra,
                   const std::vector<std::string>& env = {"PATH=/usr/local/bin:/usr/bin:/bin"}) {
  std::vector<std::string> args{SBX_AGENT_BIN, "--listen", "unix:" + dir.path + "/agent.sock"};
  args.insert(args.end(), extra.begin(), extra.end());
  int out[2], err[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
  const pid_t pid = Agent::spawn(args, env, out[1], err[1]);
  ::close(out[1]);
  ::close(err[1]);
  Finished f;
  pollfd p[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* text[2] = {&f.out, &f.err};
  const int64_t deadline = mono_ms() + 60000;  // a guard against a hung test
  while ((p[0].fd >= 0 || p[1].fd >= 0) && mono_ms() < deadline) {
    if (::poll(p, 2, 1000) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || !p[i].revents) continue;
      char buf[4096];
      const ssize_t n = ::read(p[i].fd, buf, sizeof buf);
      if (n > 0) {
        text[i]->append(buf, static_cast<std::size_t>(n));
      } else {
        ::close(p[i].fd);
        p[i].fd = -1;
      }
    }
  }
  for (auto& q : p)
    if (q.fd >= 0) ::close(q.fd);
  REQUIRE(::waitpid(pid, &f.status, 0) == pid);
  return f;
}

}  // namespace

TEST_CASE("bad PID-1 arguments exit 2") {
  TempDir dir;
  const std::vector<std::vector<std::string>> bad{
      {"--expires-at", "abc"},   {"--expires-at", "0"},
      {"--expires-at", "-5"},    {"--expires-at", ""},
      {"--expires-at", "12x"},   {"--stop-grace-ms", "x"},
      {"--expiry-poll-ms", "0"}, {"--"},
      {"--user", "root"},        {"--user", "", "--", "true"}};
  for (const auto& args : bad) {
    const Finished f = run_agent(dir, args);
    CHECK_MESSAGE(code_of_status(f.status) == 2, args.front() << " " << args.back());
    CHECK(f.err.starts_with("sbx-agent: "));
  }
  const Finished unknown = run_agent(dir, {"--user", "no-such-user-here", "--", "true"});
  CHECK(code_of_status(unknown.status) == 2);
  CHECK(unknown.err.find("sbx-agent: --user no-such-user-here: unknown user") != std::string::npos);
}

TEST_CASE("the entrypoint's exit code is the agent's; killed by a signal, 128 + the signal") {
  TempDir dir;
  const Finished f = run_agent(dir, {"--", "/bin/sh", "-c", "echo out; echo err >&2; exit 7"});
  CHECK(code_of_status(f.status) == 7);
  CHECK(f.out == "out\n");  // the agent's stdout and stderr, inherited
  CHECK(f.err == "err\n");
  CHECK(::access((dir.path + "/agent.sock").c_str(), F_OK) != 0);
  // PATH is searched for a name without '/'.
  CHECK(code_of_status(run_agent(dir, {"--", "sh", "-c", "kill -KILL $$"}).status) == 128 + 9);
  CHECK(code_of_status(run_agent(dir, {"--", "sh", "-c", "kill -USR1 $$"}).status) ==
        128 + SIGUSR1);
  CHECK(code_of_status(run_agent(dir, {"--", "true"}).status) == 0);
}

TEST_CASE("an entrypoint that cannot run: 127 when not found, 126 when not executable") {
  TempDir dir;
  const std::string missing = dir.path + "/no-such-program";
  Finished f = run_agent(dir, {"--", missing, "arg"});
  CHECK(code_of_status(f.status) == 127);
  CHECK(f.err ==
        "sbx-agent: cannot run the entrypoint " + missing + ": No such file or directory\n");
  CHECK(::access((dir.path + "/agent.sock").c_str(), F_OK) != 0);
  f = run_agent(dir, {"--", "no-such-program-in-path"});
  CHECK(code_of_status(f.status) == 127);
  CHECK(f.err.find("cannot run the entrypoint no-such-program-in-path") != std::string::npos);
  const std::string plain = dir.path + "/plain";
  write_file(plain, "#!/bin/sh\necho should not run\n");
  ::chmod(plain.c_str(), 0644);
  f = run_agent(dir, {"--", plain});
  CHECK(code_of_status(f.status) == 126);
  CHECK(f.err == "sbx-agent: cannot run the entrypoint " + plain + ": Permission denied\n");
}

TEST_CASE("SIGTERM, SIGINT and SIGHUP to the agent are forwarded to the entrypoint") {
  for (const auto& [sig, name] : std::vector<std::pair<int, std::string>>{
           {SIGTERM, "TERM"}, {SIGINT, "INT"}, {SIGHUP, "HUP"}}) {
    CAPTURE(name);
    TempDir dir;
    Agent agent(
        dir,
        {"--", "sh", "-c", "trap 'exit 3' " + name + "; echo ready; while :; do sleep 0.05; done"},
        {"PATH=/usr/local/bin:/usr/bin:/bin"}, true);
    std::string pending;
    REQUIRE(read_line(agent.out, pending) == "ready");  // the trap is set
    ::kill(agent.pid, sig);
    const auto status = agent.wait_exit(30000);
    REQUIRE(status);
    CHECK(code_of_status(*status) == 3);
    CHECK(::access(agent.socket.c_str(), F_OK) != 0);
  }
}

TEST_CASE("while the entrypoint runs: commands work, it has its own group, orphans are reaped") {
  TempDir dir;
  Agent agent(dir,
              {"--", "sh", "-c",
               "echo $$; echo \"${SBX_AGENT_TOKEN:-unset}\"; (sleep 0.2 & echo $!); "
               "exec sleep 30"},
              {"PATH=/usr/local/bin:/usr/bin:/bin", "SBX_AGENT_TOKEN=tok"}, true);
  std::string pending;
  const auto entry = read_line(agent.out, pending);
  REQUIRE(entry);
  CHECK(read_line(agent.out, pending) == "unset");  // the token is not passed on
  const auto orphan = read_line(agent.out, pending);
  REQUIRE(orphan);
  const pid_t entry_pid = std::stoi(*entry);
  CHECK(::getpgid(entry_pid) == entry_pid);
  CHECK(::getpgid(entry_pid) != ::getpgid(agent.pid));

  Client client(agent.socket);
  client.send_request("POST", "/command", command_body("echo hi"), {"X-EXECD-ACCESS-TOKEN: tok"});
  REQUIRE(client.read_head().status == 200);
  CHECK(texts(rest(client), "stdout") == std::vector<std::string>{"hi"});

  // The subshell's `sleep 0.2` became the agent's child when the subshell exited; once it exits
  // the agent reaps it: only the entrypoint is left.
  const pid_t orphan_pid = std::stoi(*orphan);
  const int pidfd = pidfd_open(orphan_pid);
  if (pidfd >= 0) expect_dies(pidfd, orphan_pid);
  wait_until([&] { return count_children(agent.pid) == 1; });

  ::kill(agent.pid, SIGTERM);  // forwarded: `sleep 30` dies of it
  const auto status = agent.wait_exit(30000);
  REQUIRE(status);
  CHECK(code_of_status(*status) == 128 + SIGTERM);
}

TEST_CASE("--user: the entrypoint runs as that user; commands do not (as root)") {
  if (::geteuid() != 0) return;  // switching users needs root
  TempDir dir;
  fs::create_directory(dir.path + "/etc");
  write_file(dir.path + "/etc/passwd",
             "root:x:0:0:root:/root:/bin/sh\ntester:x:4242:4343::/home/tester:/bin/sh\n");
  write_file(dir.path + "/etc/group", "root:x:0:\nmain:x:4343:\nextra:x:5555:tester\n");
  const std::string etc = dir.path + "/etc";
  const std::string probe = "id -u; id -g; id -G; echo \"$HOME\"";
  Finished f = run_agent(dir, {"--etc-dir", etc, "--user", "tester", "--", "sh", "-c", probe});
  CHECK(code_of_status(f.status) == 0);
  CHECK(f.out == "4242\n4343\n4343 5555\n/home/tester\n");
  // With a group, as Docker's --user: that group alone.
  f = run_agent(dir, {"--etc-dir", etc, "--user", "4242:extra", "--", "sh", "-c", probe});
  CHECK(f.out == "4242\n5555\n5555\n/home/tester\n");
  f = run_agent(dir, {"--etc-dir", etc, "--user", "777:778", "--", "sh", "-c", probe});
  CHECK(f.out == "777\n778\n778\n/\n");
  f = run_agent(dir, {"--etc-dir", etc, "--user", "tester:nope", "--", "true"});
  CHECK(code_of_status(f.status) == 2);
  CHECK(f.err.find("unknown group nope") != std::string::npos);

  Agent agent(dir, {"--etc-dir", etc, "--user", "tester", "--", "sleep", "30"});
  Client client(agent.socket);
  start(client, command_body("id -u"));
  CHECK(texts(rest(client), "stdout") == std::vector<std::string>{"0"});
  CHECK(code_of_status(agent.stop()) == 128 + SIGTERM);
}

TEST_CASE("at the expiry an agent without an entrypoint stops: exit 0, socket removed") {
  TempDir dir;
  const int64_t expires = ::time(nullptr) + 2;
  Agent agent(dir, {"--expires-at", std::to_string(expires)});
  CHECK(Client(agent.socket).request("GET", "/ping").status == 200);
  const auto status = agent.wait_exit(10000);
  REQUIRE(status);
  CHECK(code_of_status(*status) == 0);
  CHECK(real_ms() >= expires * 1000);
  CHECK(real_ms() < (expires + 2) * 1000);
  CHECK(::access(agent.socket.c_str(), F_OK) != 0);
}

TEST_CASE("the expiry file overrides --expires-at and is re-read: a renew later or earlier") {
  TempDir dir;
  const std::string file = dir.path + "/expiry";
  {
    const int64_t now = ::time(nullptr);
    write_file(file, std::to_string(now + 3) + "\n");
    Agent agent(dir, {"--expires-at", std::to_string(now + 1), "--expiry-file", file});
    // Past --expires-at, it still serves.
    sleep_until_real((now + 1) * 1000 + 500);
    CHECK(!agent.wait_exit(0));
    CHECK(Client(agent.socket).request("GET", "/ping").status == 200);
    const auto status = agent.wait_exit(10000);
    REQUIRE(status);
    CHECK(code_of_status(*status) == 0);
    CHECK(real_ms() >= (now + 3) * 1000);
    CHECK(real_ms() < (now + 5) * 1000);
  }
  {
    // A renew to an earlier time: seen at the next poll (20 s by default; 200 ms here).
    const int64_t now = ::time(nullptr);
    write_file(file, std::to_string(now + 100));
    Agent agent(dir, {"--expiry-file", file, "--expiry-poll-ms", "200"});
    CHECK(Client(agent.socket).request("GET", "/ping").status == 200);
    CHECK(!agent.wait_exit(300));
    ::unlink(file.c_str());  // as a renew writes it: the old file removed first
    write_file(file, std::to_string(::time(nullptr) + 1) + "\n");
    const int64_t written = mono_ms();
    const auto status = agent.wait_exit(10000);
    REQUIRE(status);
    CHECK(code_of_status(*status) == 0);
    CHECK(mono_ms() - written < 2500);
  }
}

TEST_CASE("an expiry file missing at the expiry is read again twice, a second apart") {
  TempDir dir;
  const std::string file = dir.path + "/expiry";
  {
    // Never there: the last expiry seen counts after the two retries.
    const int64_t expires = ::time(nullptr) + 1;
    Agent agent(dir, {"--expires-at", std::to_string(expires), "--expiry-file", file});
    const auto status = agent.wait_exit(10000);
    REQUIRE(status);
    CHECK(code_of_status(*status) == 0);
    CHECK(real_ms() >= (expires + 2) * 1000);
    CHECK(real_ms() < (expires + 4) * 1000);
  }
  {
    // Written during the retries (a renew between its delete and its write): honoured.
    const int64_t expires = ::time(nullptr) + 1;
    Agent agent(dir, {"--expires-at", std::to_string(expires), "--expiry-file", file});
    sleep_until_real(expires * 1000 + 300);
    write_file(file, std::to_string(expires + 3));
    const auto status = agent.wait_exit(10000);
    REQUIRE(status);
    CHECK(code_of_status(*status) == 0);
    CHECK(real_ms() >= (expires + 3) * 1000);
  }
}

TEST_CASE("at the expiry the entrypoint gets SIGTERM, then SIGKILL after --stop-grace-ms") {
  TempDir dir;
  // +2: at least a second away, so the agent cannot be gone before the test has connected.
  {
    const int64_t expires = ::time(nullptr) + 2;
    Agent agent(dir, {"--expires-at", std::to_string(expires), "--", "sleep", "30"});
    const auto status = agent.wait_exit(10000);
    REQUIRE(status);
    CHECK(code_of_status(*status) == 128 + SIGTERM);
    CHECK(real_ms() >= expires * 1000);
  }
  {
    const int64_t expires = ::time(nullptr) + 2;
    Agent agent(dir, {"--expires-at", std::to_string(expires), "--stop-grace-ms", "300", "--", "sh",
                      "-c", "trap '' TERM; while :; do sleep 0.05; done"});
    const auto status = agent.wait_exit(10000);
    REQUIRE(status);
    CHECK(code_of_status(*status) == 128 + SIGKILL);
    CHECK(real_ms() >= expires * 1000 + 300);
    CHECK(real_ms() < (expires + 3) * 1000);
  }
}

namespace {

// The pid a command wrote (`echo $$ > PATH`), once it has: the command is running.
pid_t pid_in(const std::string& path) {
  std::string text;
  wait_until([&] {
    text = read_file(path);
    return text.ends_with("\n");
  });
  return std::stoi(text);
}

std::vector<std::string> traceback_of(const json::Value& e) {
  std::vector<std::string> out;
  const json::Value* err = e.find("error");
  if (const json::Value* t = err ? err->find("traceback") : nullptr)
    for (const auto& line : t->items)
      out.push_back(line.text);
  return out;
}

}  // namespace

TEST_CASE("at the expiry running commands end at once, saying so; then the agent stops") {
  TempDir dir;
  const int64_t expires = ::time(nullptr) + 2;
  Agent agent(dir, {"--expires-at", std::to_string(expires)});
  // Frames (local_docker's) and execd's events, each with a child outside its process group (its
  // tag finds it), each writing its pids.
  auto command = [&](const std::string& name) {
    return command_body("setsid sleep 30 & echo $! > " + dir.path + "/" + name +
                        ".child; echo $$ > " + dir.path + "/" + name + ".pid; exec sleep 30");
  };
  Client frames(agent.socket);
  frames.send_request("POST", "/command", command("frames"),
                      {"Accept: application/vnd.sbx.frames"});
  Client events(agent.socket);
  start(events, command("events"));
  std::vector<std::pair<int, pid_t>> watched;
  for (const char* name : {"frames", "events"}) {
    for (const char* what : {".pid", ".child"}) {
      const pid_t pid = pid_in(dir.path + "/" + name + what);
      watched.emplace_back(pidfd_open(pid), pid);
    }
  }

  // The end is the killed command's, with the expiry: frames add "sandbox_expired", execd's error
  // event (still valid for its clients: evalue -1, "signal: killed") a second traceback line.
  const Response r = frames.read_response();
  CHECK(r.status == 200);
  const auto got = frames_of(r.body);
  REQUIRE(!got.empty());
  CAPTURE(got.back().first);
  CAPTURE(got.back().second);
  CHECK(got.back() == std::pair<char, std::string>{'x', "{\"signal\":9,\"sandbox_expired\":" +
                                                            std::to_string(expires) + "}"});
  const auto rest_events = rest(events);
  REQUIRE(!rest_events.empty());
  CHECK(type_of(rest_events.back()) == "error");
  CHECK(evalue_of(rest_events.back()) == "-1");
  CHECK(traceback_of(rest_events.back()) ==
        std::vector<std::string>{
            "signal: killed",
            "the sandbox expired at " + std::to_string(expires) + " (Unix seconds)"});
  CHECK(real_ms() >= expires * 1000);
  CHECK(real_ms() < (expires + 2) * 1000);  // at the expiry, not at the command's end
  for (auto [fd, pid] : watched)
    expect_dies(fd, pid);
  const auto status = agent.wait_exit(10000);
  REQUIRE(status);
  CHECK(code_of_status(*status) == 0);
  CHECK(::access(agent.socket.c_str(), F_OK) != 0);
}

TEST_CASE("after the expiry, in the entrypoint's grace: 410 but for /ping, transfers cut") {
  TempDir dir;
  const int64_t expires = ::time(nullptr) + 2;
  Agent agent(dir, {"--expires-at", std::to_string(expires), "--stop-grace-ms", "3000", "--", "sh",
                    "-c", "trap '' TERM; while :; do sleep 0.05; done"});
  Client running(agent.socket);
  running.send_request("POST", "/command", command_body("sleep 30"),
                       {"Accept: application/vnd.sbx.frames"});
  // An upload whose body has not all arrived: its temp file is there.
  const std::string body = multipart({{meta(dir.path + "/up"), std::string(200000, 'u')}});
  Client uploading(agent.socket);
  uploading.send_raw(upload_head(body.size()) + body.substr(0, body.size() / 2));
  wait_until([&] { return upload_temps(dir.path) == 1; });

  const Response r = running.read_response();  // at the expiry, not at the grace's end
  CHECK(real_ms() < (expires + 2) * 1000);
  REQUIRE(!frames_of(r.body).empty());
  CHECK(frames_of(r.body).back() ==
        std::pair<char, std::string>{
            'x', "{\"signal\":9,\"sandbox_expired\":" + std::to_string(expires) + "}"});
  // The entrypoint ignores SIGTERM: the agent still serves, but the sandbox is gone.
  CHECK(!agent.wait_exit(0));
  CHECK(uploading.at_eof());
  CHECK(upload_temps(dir.path) == 0);
  CHECK(!fs::exists(dir.path + "/up"));
  Client late(agent.socket);
  CHECK(late.request("GET", "/ping").status == 200);
  const Response refused = late.request("POST", "/command", command_body("echo late"));
  CHECK(refused.status == 410);
  const json::Value answer = parse(refused.body);
  REQUIRE(answer.find("code"));
  CHECK(answer.find("code")->text == "SANDBOX_EXPIRED");
  CHECK(answer.find("message")->text ==
        "the sandbox expired at " + std::to_string(expires) + " (Unix seconds)");
  CHECK(late.request("GET", "/files/info?path=/").status == 410);
  CHECK(late.request("POST", "/session", "{}").status == 410);
  CHECK(upload(late, multipart({{meta(dir.path + "/late"), "x"}})).status == 410);
  CHECK(!fs::exists(dir.path + "/late"));
  const auto status = agent.wait_exit(10000);
  REQUIRE(status);
  CHECK(code_of_status(*status) == 128 + SIGKILL);
}

// In every preset: the binary local_docker puts into containers is never the sanitized one.
TEST_CASE("sbx-agent is one static executable") {
  FILE* p = ::popen("file -L " SBX_AGENT_STATIC_BIN, "r");
  REQUIRE(p);
  char buf[1024] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, p);
  ::pclose(p);
  const std::string out(buf, n);
  CHECK_MESSAGE(out.find("statically linked") != std::string::npos, out);
}

// ---------------------------------------------------------------------------------------------
// Bash sessions: POST /session, POST /session/{id}/run, DELETE /session/{id}.

namespace {

std::string new_session(Client& client, const std::string& body = "") {
  const Response r = client.request("POST", "/session", body);
  REQUIRE(r.status == 200);
  const std::string id = parse(r.body).find("session_id")->text;
  CHECK(id.size() == 32);
  CHECK(id.find_first_not_of("0123456789abcdef") == std::string::npos);
  return id;
}

// Starts a run of session `id` (start_stream): its init carries the session's id.
void start_run(Client& client, const std::string& id, const std::string& body) {
  CHECK(start_stream(client, "/session/" + id + "/run", body) == id);
}

// A whole run: its events after init and ping.
std::vector<json::Value> run_in(Client& client, const std::string& id, const std::string& body) {
  start_run(client, id, body);
  return rest(client);
}

// "complete", or the error's evalue.
std::string outcome(const std::vector<json::Value>& events) {
  REQUIRE(!events.empty());
  if (type_of(events.back()) == "execution_complete") return "complete";
  REQUIRE(type_of(events.back()) == "error");
  return evalue_of(events.back());
}

std::string error_code(const Response& r) {
  const json::Value v = parse(r.body);
  const json::Value* code = v.find("code");
  return code ? code->text : "";
}

// Names in `dir` that start with `prefix`.
std::vector<std::string> names_with(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(prefix)) out.push_back(name);
  }
  return out;
}

}  // namespace

TEST_CASE("bash sessions: cd and export carry; a run's cwd starts it; each run's exit code") {
  TempDir dir;
  const std::string state = dir.path + "/state";
  REQUIRE(::mkdir((dir.path + "/a").c_str(), 0755) == 0);
  REQUIRE(::mkdir((dir.path + "/b").c_str(), 0755) == 0);
  Agent agent(dir, {"--state-dir", state});
  Client client(agent.socket);
  const std::string id = new_session(client, "{\"cwd\":" + json::quote(dir.path) + "}");

  auto events = run_in(client, id, command_body("pwd; cd a; export FOO='bar baz'; LOCAL=1"));
  CHECK(texts(events, "stdout") == std::vector<std::string>{dir.path});
  CHECK(outcome(events) == "complete");
  // The state is the agent's file, the agent's user's alone.
  const std::string state_file = state + "/bash-session-" + id;
  CHECK(mode_of(state_file) == 0600);

  events = run_in(client, id, command_body("pwd; echo \"$FOO\"; echo \"${LOCAL:-unset}\""));
  CHECK(texts(events, "stdout") ==
        std::vector<std::string>{dir.path + "/a", "bar baz", "unset"});  // exported only
  CHECK(outcome(events) == "complete");

  // A run's own cwd is where that run starts; where it ends is where the next starts (execd's
  // sessions save the run's final directory).
  events =
      run_in(client, id,
             command_body("pwd; echo \"$FOO\"; cd ..", ",\"cwd\":" + json::quote(dir.path + "/b")));
  CHECK(texts(events, "stdout") == std::vector<std::string>{dir.path + "/b", "bar baz"});
  events = run_in(client, id, command_body("pwd; cd a"));
  CHECK(texts(events, "stdout") == std::vector<std::string>{dir.path});

  // Each run's exit code is its own.
  CHECK(outcome(run_in(client, id, command_body("false"))) == "1");
  CHECK(outcome(run_in(client, id, command_body("true"))) == "complete");
  // `exit 3` ends that run with 3; the session goes on with the state it had.
  events = run_in(client, id, command_body("export FOO=changed; cd /; echo before; exit 3"));
  CHECK(texts(events, "stdout") == std::vector<std::string>{"before"});
  CHECK(outcome(events) == "3");
  events = run_in(client, id, command_body("echo \"$FOO\"; pwd"));
  CHECK(texts(events, "stdout") == std::vector<std::string>{"bar baz", dir.path + "/a"});
  CHECK(outcome(events) == "complete");

  // A second session starts afresh.
  const std::string other = new_session(client);
  events = run_in(client, other,
                  command_body("echo \"${FOO:-unset}\"", ",\"cwd\":" + json::quote(dir.path)));
  CHECK(texts(events, "stdout") == std::vector<std::string>{"unset"});

  // DELETE removes the session and its state file.
  CHECK(client.request("DELETE", "/session/" + id).status == 200);
  CHECK(::access(state_file.c_str(), F_OK) != 0);
  CHECK(names_with(state, "bash-session-" + id).empty());
  CHECK(names_with(state, "bash-session-" + other).size() == 1);
}

TEST_CASE("bash sessions: a background service outlives its run, the next run and DELETE") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  const std::string id = new_session(client);
  auto events = run_in(client, id, command_body("sleep 60 > /dev/null 2>&1 & echo $!"));
  CHECK(outcome(events) == "complete");
  const auto out = texts(events, "stdout");
  REQUIRE(out.size() == 1);
  const pid_t pid = std::stoi(out[0]);
  const int pidfd = pidfd_open(pid);
  REQUIRE(pidfd >= 0);
  auto alive = [&] {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  };
  CHECK(alive());

  events = run_in(client, id, command_body("kill -0 " + out[0] + " && echo alive"));
  CHECK(texts(events, "stdout") == std::vector<std::string>{"alive"});
  CHECK(outcome(events) == "complete");

  CHECK(client.request("DELETE", "/session/" + id).status == 200);
  // A command after the DELETE (the agent's loop has moved on), then the sleep is still there.
  start(client, command_body("kill -0 " + out[0] + " && echo alive"));
  events = rest(client);
  CHECK(texts(events, "stdout") == std::vector<std::string>{"alive"});
  CHECK(alive());

  REQUIRE(::kill(pid, SIGKILL) == 0);  // ours to end: the test started it
  expect_dies(pidfd, pid);
}

TEST_CASE("bash sessions: a run's timeout kills it (error -1); the session's state is kept") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  const std::string id = new_session(client);
  CHECK(outcome(run_in(client, id, command_body("export A=1; cd " + dir.path))) == "complete");

  start_run(client, id,
            command_body("export A=2; cd /; sleep 30 & echo $!; wait", ",\"timeout\":300"));
  std::vector<json::Value> events;
  std::optional<std::pair<int, pid_t>> sleeper;
  while (auto e = client.next_event()) {
    if (type_of(*e) == "stdout") {
      const pid_t pid = std::stoi(text_of(*e));
      sleeper.emplace(pidfd_open(pid), pid);
    }
    events.push_back(std::move(*e));
  }
  REQUIRE(sleeper);
  CHECK(outcome(events) == "-1");
  CHECK(events.back().find("error")->find("traceback")->items.at(0).text == "signal: killed");
  expect_dies(sleeper->first, sleeper->second);

  events = run_in(client, id, command_body("echo $A; pwd"));
  CHECK(texts(events, "stdout") == std::vector<std::string>{"1", dir.path});
  CHECK(outcome(events) == "complete");
}

TEST_CASE("bash sessions: DELETE while a run goes ends its stream with -1; then the id is 404") {
  TempDir dir;
  const std::string state = dir.path + "/state";
  Agent agent(dir, {"--state-dir", state});
  Client streaming(agent.socket);
  Client control(agent.socket);
  const std::string id = new_session(control);
  CHECK(outcome(run_in(control, id, command_body("export A=1"))) == "complete");
  CHECK(names_with(state, "bash-session-" + id).size() == 1);

  start_run(streaming, id, command_body("sleep 30 & echo $!; wait"));
  const auto e = streaming.next_event();
  REQUIRE(e);
  REQUIRE(type_of(*e) == "stdout");
  const pid_t pid = std::stoi(text_of(*e));
  const int pidfd = pidfd_open(pid);
  const Response del = control.request("DELETE", "/session/" + id);
  CHECK(del.status == 200);
  CHECK(del.body.empty());
  const auto events = rest(streaming);
  CHECK(outcome(events) == "-1");
  expect_dies(pidfd, pid);
  CHECK(names_with(state, "bash-session-" + id).empty());

  const Response run = control.request("POST", "/session/" + id + "/run", command_body("true"));
  CHECK(run.status == 404);
  CHECK(error_code(run) == "CONTEXT_NOT_FOUND");
  const Response again = control.request("DELETE", "/session/" + id);
  CHECK(again.status == 404);
  CHECK(error_code(again) == "CONTEXT_NOT_FOUND");
}

TEST_CASE("bash sessions: unknown ids, bad bodies, methods, the bound of 256 sessions") {
  TempDir dir;
  Agent agent(dir);
  Client client(agent.socket);
  Response r =
      client.request("POST", "/session/0123456789abcdef0123456789abcdef/run", command_body("true"));
  CHECK(r.status == 404);
  CHECK(error_code(r) == "CONTEXT_NOT_FOUND");
  r = client.request("DELETE", "/session/nope");
  CHECK(r.status == 404);
  CHECK(error_code(r) == "CONTEXT_NOT_FOUND");
  CHECK(client.request("GET", "/session").status == 405);
  CHECK(client.request("GET", "/session/nope/run").status == 405);

  r = client.request("POST", "/session", "{not json");
  CHECK(r.status == 400);
  CHECK(error_code(r) == "INVALID_REQUEST_BODY");
  CHECK(client.request("POST", "/session", "{\"cwd\":3}").status == 400);
  const std::string id = new_session(client, "{}");
  r = client.request("POST", "/session/" + id + "/run", "{}");
  CHECK(r.status == 400);
  CHECK(error_code(r) == "INVALID_REQUEST_BODY");
  CHECK(client.request("POST", "/session/" + id + "/run", command_body("true", ",\"timeout\":-1"))
            .status == 400);
  CHECK(client
            .request("POST", "/session/" + id + "/run",
                     command_body("true", ",\"cwd\":" + json::quote(dir.path + "/missing")))
            .status == 400);
  // A session whose cwd is gone: its runs are refused the same way.
  const std::string gone =
      new_session(client, "{\"cwd\":" + json::quote(dir.path + "/missing") + "}");
  CHECK(client.request("POST", "/session/" + gone + "/run", command_body("true")).status == 400);

  for (int i = 2; i < 256; ++i)
    new_session(client);
  r = client.request("POST", "/session");
  CHECK(r.status == 429);
  CHECK(error_code(r) == "TOO_MANY_SESSIONS");
  CHECK(client.request("DELETE", "/session/" + gone).status == 200);
  new_session(client);
}

TEST_CASE("bash sessions: with a token, every session route needs it") {
  TempDir dir;
  const std::string token_file = dir.path + "/token";
  write_file(token_file, "s3cret\n");
  Agent agent(dir, {"--token-file", token_file});
  Client client(agent.socket);
  const std::vector<std::string> token{"X-EXECD-ACCESS-TOKEN: s3cret"};
  CHECK(client.request("POST", "/session").status == 401);
  const Response made = client.request("POST", "/session", "", token);
  REQUIRE(made.status == 200);
  const std::string id = parse(made.body).find("session_id")->text;
  CHECK(client.request("POST", "/session/" + id + "/run", command_body("true")).status == 401);
  CHECK(client.request("DELETE", "/session/" + id).status == 401);
  client.send_request("POST", "/session/" + id + "/run", command_body("echo ok"), token);
  CHECK(client.read_head().status == 200);
  CHECK(texts(rest(client), "stdout") == std::vector<std::string>{"ok"});
  CHECK(client.request("DELETE", "/session/" + id, "", token).status == 200);
}

TEST_CASE("bash sessions: runs at once in one session are allowed; the last to end saves") {
  TempDir dir;
  const std::string fifo = dir.path + "/go";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Agent agent(dir);
  Client first(agent.socket);
  Client second(agent.socket);
  const std::string id = new_session(first);
  // The first run waits on the fifo (opened for reading: it blocks until the test opens it).
  start_run(first, id, command_body("export X=first; echo waiting; cat " + fifo));
  const auto waiting = first.next_event();
  REQUIRE(waiting);
  CHECK(text_of(*waiting) == "waiting");
  auto events = run_in(second, id, command_body("export X=second; echo \"${X}\""));
  CHECK(texts(events, "stdout") == std::vector<std::string>{"second"});
  CHECK(outcome(events) == "complete");
  write_file(fifo, "done\n");
  events = rest(first);
  CHECK(texts(events, "stdout") == std::vector<std::string>{"done"});
  CHECK(outcome(events) == "complete");
  events = run_in(second, id, command_body("echo \"${X}\""));
  CHECK(texts(events, "stdout") == std::vector<std::string>{"first"});
}

TEST_CASE("bash sessions: DELETE kills every run still going, however many; no state comes back") {
  TempDir dir;
  const std::string state = dir.path + "/state";
  const std::string fifo = dir.path + "/hold";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Agent agent(dir, {"--state-dir", state});
  Client control(agent.socket);
  const std::string id = new_session(control);
  // More runs than a "latest N" list would keep: each waits on the fifo, then would save.
  std::vector<std::unique_ptr<Client>> runs;
  for (int i = 0; i < 20; ++i) {
    runs.push_back(std::make_unique<Client>(agent.socket));
    start_run(*runs.back(), id, command_body("echo held; cat " + fifo + "; export SECRET=x"));
    const auto held = runs.back()->next_event();
    REQUIRE(held);
    CHECK(text_of(*held) == "held");
  }
  CHECK(control.request("DELETE", "/session/" + id).status == 200);
  for (auto& run : runs)
    CHECK(outcome(rest(*run)) == "-1");  // killed, the oldest too
  CHECK(names_with(state, "bash-session-" + id).empty());
}
