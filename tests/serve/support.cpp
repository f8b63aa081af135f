// The serve tests' process and HTTP helpers (support.hpp).

#include "support.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <regex>
#include <stdexcept>
#include <utility>

extern char** environ;

namespace serve_test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "sbx-serve-test-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

namespace {

std::vector<std::string> environment_with(const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (!env.count(name)) out.push_back(entry);
  }
  for (const auto& [k, v] : env)
    out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings)
    out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

int wait_status(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -2;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

ServeProcess::ServeProcess(const fs::path& config, const std::string& provider,
                           const fs::path& stderr_path, std::vector<std::string> extra,
                           std::map<std::string, std::string> env) {
  std::vector<std::string> argv{SBX_CLI,      "serve",  "--config",     config.string(),
                                "--provider", provider, "--plugin-dir", SBX_TEST_PLUGIN_DIR};
  bool listen_given = false;
  for (auto& e : extra) {
    listen_given = listen_given || e == "--listen";
    argv.push_back(std::move(e));
  }
  if (!listen_given) {
    argv.push_back("--listen");
    argv.push_back("127.0.0.1:0");
  }
  auto envs = environment_with(env);
  auto argp = pointers(argv);
  auto envp = pointers(envs);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (err < 0) throw std::runtime_error("cannot open " + stderr_path.string());
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(out[1], 1);
    ::dup2(err, 2);
    ::execve(argp[0], argp.data(), envp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err);
  stdout_fd_ = out[0];
  // The first line: "sbx serve: listening on http://127.0.0.1:PORT (...)".
  std::string line;
  char c = 0;
  while (true) {
    const ssize_t n = ::read(stdout_fd_, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    line.push_back(c);
  }
  std::smatch m;
  if (!std::regex_search(line, m,
                         std::regex(R"(listening on (?:http://127\.0\.0\.1:(\d+)|unix:(\S+)) )"
                                    R"(.*sbx\.run=(\S+)\))"))) {
    const int status = stop();
    throw std::runtime_error("sbx serve did not start (exit " + std::to_string(status) + "): '" +
                             line + "'");
  }
  port_ = m[1].matched ? std::stoi(m[1]) : 0;
  unix_socket_ = m[2].matched ? std::string(m[2]) : std::string();
  run_id_ = m[3];
}

int ServeProcess::stop() {
  if (pid_ <= 0) return -3;
  ::kill(pid_, SIGTERM);
  stdout_rest_ = read_all(stdout_fd_);
  const int status = wait_status(pid_);
  pid_ = -1;
  ::close(stdout_fd_);
  stdout_fd_ = -1;
  return status;
}

ServeProcess::~ServeProcess() {
  if (pid_ > 0) stop();
}

namespace {

template <class Socket>
Response read_response(Socket& socket, bool head) {
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.skip(head);
  parser.body_limit(boost::none);  // downloads may be large
  http::read(socket, buffer, parser);
  Response out;
  const auto& res = parser.get();
  out.status = static_cast<int>(res.result_int());
  for (const auto& field : res) {
    std::string name(field.name_string());
    for (auto& ch : name)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    out.headers[name] = std::string(field.value());
  }
  out.body = res.body();
  beast::error_code ignored;
  socket.shutdown(asio::socket_base::shutdown_both, ignored);
  return out;
}

// A request that closes its connection: `body` as JSON when given, then `headers`.
http::request<http::string_body> one_request(const std::string& method, const std::string& target,
                                             const std::string& host,
                                             const std::optional<std::string>& body,
                                             const std::map<std::string, std::string>& headers) {
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, host);
  req.keep_alive(false);
  if (body) {
    req.set(http::field::content_type, "application/json");
    req.body() = *body;
    req.prepare_payload();
  }
  for (const auto& [k, v] : headers)
    req.set(k, v);
  return req;
}

}  // namespace

Response request(int port, const std::string& method, const std::string& target,
                 const std::optional<std::string>& body,
                 const std::map<std::string, std::string>& headers) {
  asio::io_context ioc;
  asio::ip::tcp::socket socket(ioc);
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  http::write(socket,
              one_request(method, target, "127.0.0.1:" + std::to_string(port), body, headers));
  return read_response(socket, method == "HEAD");
}

Response unix_request(const fs::path& socket_path, const std::string& method,
                      const std::string& target, const std::optional<std::string>& body,
                      const std::map<std::string, std::string>& headers) {
  asio::io_context ioc;
  asio::local::stream_protocol::socket socket(ioc);
  socket.connect(asio::local::stream_protocol::endpoint(socket_path.string()));
  http::write(socket, one_request(method, target, "localhost", body, headers));
  return read_response(socket, method == "HEAD");
}

Response raw_request(int port, const std::string& text) {
  asio::io_context ioc;
  asio::ip::tcp::socket socket(ioc);
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  asio::write(socket, asio::buffer(text));
  return read_response(socket, false);
}

int run_to_exit(const std::vector<std::string>& args, std::string& output) {
  std::vector<std::string> argv = args;
  auto argp = pointers(argv);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::execv(argp[0], argp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  output = read_all(out[0]);
  ::close(out[0]);
  return wait_status(pid);
}

boost::json::object admin_providers(int port, const std::map<std::string, std::string>& headers) {
  const Response r = request(port, "GET", "/admin/providers", std::nullopt, headers);
  if (r.status != 200) {
    throw std::runtime_error("GET /admin/providers: " + std::to_string(r.status) + " " + r.body);
  }
  return r.json().as_object();
}

std::vector<std::string> labelled_ids(const fs::path& config, const std::string& provider,
                                      const std::string& label) {
  std::string output;
  int status = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    output.clear();
    status = run_to_exit({SBX_CLI, "list", "--config", config.string(), "--provider", provider,
                          "--label", label, "--json"},
                         output);
    // Under ASan, LeakSanitizer's own tracer may crash at the exit of a busy machine's process
    // ("LeakSanitizer has encountered a fatal error": no leak was found, none was looked for):
    // the listing is asked again. A leak report is no such line, and fails below.
    if (status == 0 ||
        output.find("LeakSanitizer has encountered a fatal error") == std::string::npos) {
      break;
    }
  }
  if (status != 0) {
    throw std::runtime_error("sbx list exited " + std::to_string(status) + ": " + output);
  }
  std::vector<std::string> ids;
  const boost::json::value list = boost::json::parse(output);
  for (const auto& s : list.as_array())
    ids.emplace_back(s.at("id").as_string());
  return ids;
}

long long parse_time_us(const std::string& text) {
  std::tm tm{};
  int us = 0;
  char next = 0;
  // With a fraction ("...:53.073818Z"), or without one when it is zero ("...:00Z"), as pydantic.
  const int n = std::sscanf(text.c_str(), "%d-%d-%dT%d:%d:%d%c", &tm.tm_year, &tm.tm_mon,
                            &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &next);
  if (n != 7 ||
      (next == '.' && (std::sscanf(text.c_str() + text.find('.'), ".%6dZ", &us) != 1 ||
                       text.size() != text.find('.') + 8)) ||
      (next != '.' && (next != 'Z' || text.size() != 20))) {
    throw std::runtime_error("not a time: " + text);
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<long long>(::timegm(&tm)) * 1000000 + us;
}

struct StreamClient::Impl {
  asio::io_context ioc;
  asio::ip::tcp::socket socket{ioc};
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  char chunk[16384];
};

StreamClient::StreamClient(int port, const std::string& method, const std::string& target,
                           const std::optional<std::string>& body,
                           const std::map<std::string, std::string>& headers, int read_timeout_s)
    : impl_(std::make_unique<Impl>()) {
  impl_->socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  timeval tv{read_timeout_s, 0};
  ::setsockopt(impl_->socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, "127.0.0.1:" + std::to_string(port));
  if (body) {
    req.set(http::field::content_type, "application/json");
    req.body() = *body;
    req.prepare_payload();
  }
  for (const auto& [k, v] : headers)
    req.set(k, v);
  http::write(impl_->socket, req);
  impl_->parser.body_limit(boost::none);
  http::read_header(impl_->socket, impl_->buffer, impl_->parser);
  const auto& res = impl_->parser.get();
  status_ = static_cast<int>(res.result_int());
  for (const auto& field : res) {
    std::string name(field.name_string());
    for (auto& ch : name)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    headers_[name] = std::string(field.value());
  }
}

StreamClient::~StreamClient() {
  beast::error_code ignored;
  impl_->socket.close(ignored);
}

bool StreamClient::fill() {
  if (done_ || impl_->parser.is_done()) {
    done_ = true;
    return false;
  }
  impl_->parser.get().body().data = impl_->chunk;
  impl_->parser.get().body().size = sizeof impl_->chunk;
  beast::error_code ec;
  http::read_some(impl_->socket, impl_->buffer, impl_->parser, ec);
  if (ec == http::error::need_buffer) ec = {};
  if (ec == http::error::end_of_stream || ec == asio::error::eof) {
    done_ = true;
    return false;
  }
  if (ec) throw std::runtime_error("reading the stream: " + ec.message());
  pending_.append(impl_->chunk, sizeof impl_->chunk - impl_->parser.get().body().size);
  return true;
}

std::optional<boost::json::object> StreamClient::next_event() {
  while (true) {
    const auto end = pending_.find("\n\n");
    if (end != std::string::npos) {
      std::string text = pending_.substr(0, end);
      pending_.erase(0, end + 2);
      raw_.push_back(text);
      return boost::json::parse(text).as_object();
    }
    if (!fill()) {
      if (pending_.find_first_not_of("\n") != std::string::npos) {
        throw std::runtime_error("the stream ended inside an event: '" + pending_ + "'");
      }
      return std::nullopt;
    }
  }
}

std::vector<boost::json::object> StreamClient::rest() {
  std::vector<boost::json::object> out;
  while (auto e = next_event())
    out.push_back(std::move(*e));
  return out;
}

std::optional<std::string> StreamClient::next_line() {
  while (true) {
    const auto end = pending_.find('\n');
    if (end != std::string::npos) {
      std::string line = pending_.substr(0, end);
      pending_.erase(0, end + 1);
      return line;
    }
    if (!fill()) return std::nullopt;
  }
}

std::string StreamClient::body() {
  while (fill()) {
  }
  return std::exchange(pending_, std::string());
}

void StreamClient::disconnect() {
  ::linger l{1, 0};
  ::setsockopt(impl_->socket.native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
  beast::error_code ignored;
  impl_->socket.close(ignored);
  done_ = true;
}

boost::json::object ProcessesServer::processes_block(boost::json::object config) const {
  config["root"] = root.string();
  return boost::json::object{{"plugin", "test_processes"}, {"config", std::move(config)}};
}

void ProcessesServer::write_config(boost::json::object provider, boost::json::object top) const {
  top["providers"] = boost::json::object{{"p", std::move(provider)}};
  std::ofstream(config) << boost::json::serialize(top);
}

void ProcessesServer::start(std::vector<std::string> extra,
                            std::map<std::string, std::string> env) {
  server.emplace(config, "p", log, std::move(extra), std::move(env));
}

size_t ProcessesServer::sandboxes_on_disk() const {
  return static_cast<size_t>(std::distance(fs::directory_iterator(root), fs::directory_iterator()));
}

std::string ProcessesServer::log_text() const {
  std::ifstream in(log);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string rfc3339(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace serve_test
