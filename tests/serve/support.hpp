// What the serve tests share: an `sbx serve` process on 127.0.0.1:0 and a small HTTP client
// (Boost.Beast, synchronous) that speaks to it.
#pragma once

#include <boost/json.hpp>

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace serve_test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed (it alone) when the object goes.
struct TempDir {
  fs::path path;
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// `sbx serve --config <config> --provider <provider> --listen 127.0.0.1:0 <extra...>` (no
// default --listen when `extra` has one, e.g. unix:PATH), its stdout read up to the line giving
// the address; stderr goes to `stderr_path`. `env` is added to the child's
// environment. The destructor sends SIGTERM (if it still runs) and reaps it.
class ServeProcess {
 public:
  ServeProcess(const fs::path& config, const std::string& provider, const fs::path& stderr_path,
               std::vector<std::string> extra = {}, std::map<std::string, std::string> env = {});
  ~ServeProcess();
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }                               // 0 on a unix socket
  const std::string& unix_socket() const { return unix_socket_; }  // "" on TCP
  pid_t pid() const { return pid_; }
  // The `sbx.run` label of the sandboxes it creates, from its first line.
  const std::string& run_id() const { return run_id_; }
  // SIGTERM, then waits for it: its exit status (-1 when a signal killed it), and what it printed
  // on stdout after the port line.
  int stop();
  const std::string& rest_of_stdout() const { return stdout_rest_; }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int port_ = 0;
  std::string unix_socket_;
  std::string run_id_;
  std::string stdout_rest_;
};

// What most serve tests start from: a fresh directory holding a config whose provider "p" is
// test_processes keeping its sandboxes under `root`, and `sbx serve` on it (once start() ran).
struct ProcessesServer {
  TempDir dir;
  fs::path root = dir.path / "root";
  fs::path config = dir.path / "sbx.json";
  fs::path log = dir.path / "serve.log";
  std::optional<ServeProcess> server;

  ProcessesServer() { fs::create_directories(root); }

  // test_processes with `config` besides its root.
  boost::json::object processes_block(boost::json::object config = {}) const;
  // Writes the config: `provider` as provider "p", and the other top-level keys of `top` (e.g.
  // "serve").
  void write_config(boost::json::object provider, boost::json::object top = {}) const;
  void start(std::vector<std::string> extra = {}, std::map<std::string, std::string> env = {});

  int port() const { return server->port(); }
  size_t sandboxes_on_disk() const;
  std::string log_text() const;
};

// `t` as RFC 3339 UTC in whole seconds ("2026-12-01T08:00:00Z").
std::string rfc3339(std::chrono::system_clock::time_point t);

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  bool has_header(const std::string& name) const { return headers.count(name) != 0; }
  boost::json::value json() const { return boost::json::parse(body); }
};

// One request on a new connection. `raw_extra` is added to the header block as is.
Response request(int port, const std::string& method, const std::string& target,
                 const std::optional<std::string>& body = std::nullopt,
                 const std::map<std::string, std::string>& headers = {});

// As request(), on a new connection to the unix socket `socket_path`.
Response unix_request(const fs::path& socket_path, const std::string& method,
                      const std::string& target,
                      const std::optional<std::string>& body = std::nullopt,
                      const std::map<std::string, std::string>& headers = {});

// Sends `text` as is on a new connection and reads one response.
Response raw_request(int port, const std::string& text);

// A request whose answer is read as it arrives (an execd event stream, chunked): the head at once,
// then events one by one. Reads give up after `read_timeout_s` (SO_RCVTIMEO) with an exception.
class StreamClient {
 public:
  StreamClient(int port, const std::string& method, const std::string& target,
               const std::optional<std::string>& body = std::nullopt,
               const std::map<std::string, std::string>& headers = {}, int read_timeout_s = 30);
  ~StreamClient();
  StreamClient(const StreamClient&) = delete;
  StreamClient& operator=(const StreamClient&) = delete;

  int status() const { return status_; }
  const std::map<std::string, std::string>& headers() const { return headers_; }
  // The next event (a JSON object; its text had no "data:" prefix and ended with a blank line),
  // or nullopt once the response ended. Raw event texts are kept in raw_events().
  std::optional<boost::json::object> next_event();
  // Every event up to the end of the response.
  std::vector<boost::json::object> rest();
  // The next line of the body, without its '\n' (GET /metrics/watch), or nullopt once the
  // response ended (a last line without '\n' is not returned).
  std::optional<std::string> next_line();
  // The whole body of an answer that is not a stream (read to its end).
  std::string body();
  const std::vector<std::string>& raw_events() const { return raw_; }
  // Closes the connection (a reset: SO_LINGER 0) without reading further.
  void disconnect();

 private:
  bool fill();  // reads more of the body into pending_; false at its end
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int status_ = 0;
  std::map<std::string, std::string> headers_;
  std::string pending_;
  std::vector<std::string> raw_;
  bool done_ = false;
};

// Runs `argv` to its end with stdout/stderr into `output`; its exit status.
int run_to_exit(const std::vector<std::string>& argv, std::string& output);

// `GET /admin/providers` with `headers` (the API key): the report (throws unless 200).
boost::json::object admin_providers(int port, const std::map<std::string, std::string>& headers);

// `sbx list --config <config> --provider <provider> --label <label> --json`: the ids of the
// provider's sandboxes carrying that label (throws unless it exits 0).
std::vector<std::string> labelled_ids(const fs::path& config, const std::string& provider,
                                      const std::string& label);

// "2026-12-01T04:59:53.073818Z" as microseconds since the epoch.
long long parse_time_us(const std::string& text);

}  // namespace serve_test
