// sbx-reaper: the program of local_docker's reaper container. It lives as long as the Docker daemon
// does (restart policy unless-stopped) and, every --interval seconds, force-removes the sandboxes
// whose TTL has passed: containers labelled sbx.sandbox=1 whose sbx.expires_at (unix seconds) is
// not in the future, in any state. That covers what the in-container TTL watchdog cannot: a
// container created but never started (its host died during create) never runs the watchdog, and
// AutoRemove never fires for it.
//
// sbx.renew/1 can move a sandbox's expiry past its label (labels cannot change): a container
// labelled sbx.expiry_file=/.sbx/ttl/expires_at has its expiry in force in that file
// (expiry_file.hpp: the host's, mounted read-only), and once its label has passed the reaper
// reads the file (GET /containers/{id}/archive, a small tar; Docker reads the mount it made, not
// what a sandbox put at that path) and leaves the container alone while the file says later. A
// file that cannot be read is looked at once more half a second later, then the label decides.
//
// Built static (no libc, libstdc++ or sanitizer runtime needed in its image, which holds only this
// file) and embedded in local_docker.so. It speaks HTTP/1.0 to the daemon over the bind-mounted
// unix socket with plain POSIX calls: one request per connection, the answer ends with the
// connection. Single-threaded; SIGTERM or SIGINT end it between two requests.
//
// Usage: sbx-reaper [--socket PATH] [--interval SECONDS] [--once]

#include "expiry_file.hpp"

#include <boost/json/src.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace {

namespace json = boost::json;

// Bound on one request (connect, send, the whole answer).
constexpr int kRequestTimeoutS = 30;
// The answers read here are container lists and short errors; a longer one is cut.
constexpr size_t kMaxResponse = 64 * 1024 * 1024;

volatile sig_atomic_t g_stop = 0;

void on_signal(int) {
  g_stop = 1;
}

// One line on stderr (the container's log), with a UTC timestamp.
void log_line(const std::string& text) {
  char stamp[32];
  const time_t now = time(nullptr);
  struct tm tm_utc;
  gmtime_r(&now, &tm_utc);
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
  std::fprintf(stderr, "%s sbx-reaper: %s\n", stamp, text.c_str());
}

struct Response {
  int status = 0;
  std::string body;
};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// Decodes a chunked body (HTTP/1.1 servers may still send one).
std::string dechunk(std::string_view body) {
  std::string out;
  while (!body.empty()) {
    const size_t eol = body.find("\r\n");
    if (eol == std::string_view::npos) throw std::runtime_error("bad chunked body");
    const unsigned long size = std::strtoul(std::string(body.substr(0, eol)).c_str(), nullptr, 16);
    body.remove_prefix(eol + 2);
    if (size == 0) break;
    if (body.size() < size) throw std::runtime_error("truncated chunked body");
    out.append(body.substr(0, size));
    body.remove_prefix(std::min<size_t>(body.size(), size + 2));
  }
  return out;
}

Response request(const std::string& socket_path, const char* method, const std::string& target) {
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throw std::runtime_error(errno_text("socket"));
  const timeval timeout{kRequestTimeoutS, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof address.sun_path)
    throw std::runtime_error("socket path too long");
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    throw std::runtime_error(errno_text(("connect " + socket_path).c_str()));
  }
  const std::string text = std::string(method) + " " + target +
                           " HTTP/1.0\r\nHost: docker\r\nUser-Agent: sbx-reaper\r\n\r\n";
  for (size_t sent = 0; sent < text.size();) {
    const ssize_t n = ::send(fd.get(), text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(errno_text("send"));
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buffer[16384];
  for (;;) {
    const ssize_t n = ::recv(fd.get(), buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(errno_text("recv"));
    if (n == 0) break;
    raw.append(buffer, static_cast<size_t>(n));
    if (raw.size() > kMaxResponse) throw std::runtime_error("answer too long");
  }
  const size_t header_end = raw.find("\r\n\r\n");
  if (header_end == std::string::npos || raw.compare(0, 5, "HTTP/") != 0) {
    throw std::runtime_error("not an HTTP answer");
  }
  Response response;
  const size_t space = raw.find(' ');
  response.status = std::atoi(raw.c_str() + space + 1);
  std::string headers = raw.substr(0, header_end);
  for (char& c : headers)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  response.body = raw.substr(header_end + 4);
  if (headers.find("\r\ntransfer-encoding: chunked") != std::string::npos) {
    response.body = dechunk(response.body);
  }
  return response;
}

std::string url_encode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

namespace expiry = sbx::local_docker::expiry;

// A label value of unix seconds; nothing unless it is all digits.
bool parse_seconds(std::string_view text, long long& out) {
  const auto value = expiry::parse_seconds(text);
  if (!value) return false;
  out = *value;
  return true;
}

void sleep_for(double seconds);

// The expiry in the container's expiry file at `path`; nothing when it cannot be read or parsed.
std::optional<long long> read_expiry_file(const std::string& socket_path,
                                          const std::string& container_id,
                                          const std::string& path) {
  try {
    const Response file = request(
        socket_path, "GET", "/containers/" + container_id + "/archive?path=" + url_encode(path));
    if (file.status != 200) return std::nullopt;
    const auto value = expiry::parse_archive(file.body);
    if (!value) return std::nullopt;
    return static_cast<long long>(*value);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The expiry in force of a container whose label expiry has passed: its expiry file's when it
// has one (read twice, 0.5 s apart, before giving up on it), else the label's. Only the file of
// expiry::kPath counts, the host's read-only mount: a label naming another path is a sandbox of a
// local_docker before decision 251, whose file its root could rewrite.
long long expiry_in_force(const std::string& socket_path, const std::string& container_id,
                          const json::object& labels, long long label_expiry) {
  const auto* file = labels.if_contains(expiry::kFileLabel);
  if (!file || !file->is_string() || file->get_string() != expiry::kPath) return label_expiry;
  const std::string path(expiry::kPath);
  for (int attempt = 0; attempt < 2 && !g_stop; ++attempt) {
    if (attempt > 0) sleep_for(0.5);
    if (const auto value = read_expiry_file(socket_path, container_id, path)) return *value;
  }
  return label_expiry;
}

std::string message_of(const Response& response) {
  boost::system::error_code ec;
  const json::value value = json::parse(response.body, ec);
  if (!ec && value.is_object()) {
    if (const auto* m = value.get_object().if_contains("message"); m && m->is_string()) {
      return std::string(m->get_string());
    }
  }
  return response.body.substr(0, 300);
}

// One sweep: lists the sandboxes with an expiry and removes the expired ones. Returns how many it
// removed; throws when the daemon cannot be asked.
int sweep(const std::string& socket_path) {
  const std::string filters = R"({"label":["sbx.sandbox=1","sbx.expires_at"]})";
  const Response list =
      request(socket_path, "GET", "/containers/json?all=1&filters=" + url_encode(filters));
  if (list.status != 200) {
    throw std::runtime_error("listing containers: HTTP " + std::to_string(list.status) + ": " +
                             message_of(list));
  }
  const json::value items = json::parse(list.body);
  if (!items.is_array()) throw std::runtime_error("listing containers: not a JSON array");
  const long long now = static_cast<long long>(time(nullptr));
  int removed = 0;
  for (const auto& item : items.get_array()) {
    if (g_stop) break;
    if (!item.is_object()) continue;
    const auto& container = item.get_object();
    const auto* id = container.if_contains("Id");
    const auto* labels = container.if_contains("Labels");
    if (!id || !id->is_string() || !labels || !labels->is_object()) continue;
    const auto* sandbox = labels->get_object().if_contains("sbx.sandbox");
    const auto* expires = labels->get_object().if_contains("sbx.expires_at");
    if (!sandbox || !sandbox->is_string() || sandbox->get_string() != "1") continue;
    long long expires_at = 0;
    if (!expires || !expires->is_string() || !parse_seconds(expires->get_string(), expires_at)) {
      continue;
    }
    if (expires_at > now) continue;
    const std::string container_id(id->get_string());
    expires_at = expiry_in_force(socket_path, container_id, labels->get_object(), expires_at);
    if (expires_at > now) continue;  // renewed
    std::string name = container_id.substr(0, 12);
    if (const auto* names = container.if_contains("Names"); names && names->is_array() &&
                                                            !names->get_array().empty() &&
                                                            names->get_array()[0].is_string()) {
      name = std::string(names->get_array()[0].get_string());
      if (!name.empty() && name.front() == '/') name.erase(0, 1);
    }
    const Response gone =
        request(socket_path, "DELETE", "/containers/" + container_id + "?force=1&v=1");
    if (gone.status < 300 || gone.status == 404) {
      ++removed;
      log_line("removed " + name + " (expired " + std::to_string(now - expires_at) + " s ago)");
    } else if (gone.status != 409) {  // 409: a removal is in progress already
      log_line("could not remove " + name + ": HTTP " + std::to_string(gone.status) + ": " +
               message_of(gone));
    }
  }
  return removed;
}

void sleep_for(double seconds) {
  timespec left{static_cast<time_t>(seconds),
                static_cast<long>((seconds - std::floor(seconds)) * 1e9)};
  while (!g_stop && nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path = "/var/run/docker.sock";
  double interval = 2;
  bool once = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--socket" && i + 1 < argc) {
      socket_path = argv[++i];
    } else if (arg == "--interval" && i + 1 < argc) {
      interval = std::strtod(argv[++i], nullptr);
    } else if (arg == "--once") {
      once = true;
    } else {
      std::fprintf(stderr, "usage: sbx-reaper [--socket PATH] [--interval SECONDS] [--once]\n");
      return 2;
    }
  }
  if (!(interval > 0 && interval <= 86400)) {
    std::fprintf(stderr, "sbx-reaper: --interval must be in (0, 86400]\n");
    return 2;
  }
  // PID 1 of a container gets no default signal actions: without handlers `docker stop` would
  // wait for its SIGKILL.
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::setvbuf(stderr, nullptr, _IOLBF, 0);

  char interval_text[32];
  std::snprintf(interval_text, sizeof interval_text, "%g", interval);
  log_line("watching " + socket_path + " every " + interval_text + " s");
  std::string last_error;  // logged once until it changes, so a long outage does not fill the log
  while (!g_stop) {
    try {
      sweep(socket_path);
      if (!last_error.empty()) log_line("the daemon answers again");
      last_error.clear();
    } catch (const std::exception& e) {
      if (e.what() != last_error) log_line(e.what());
      last_error = e.what();
    }
    if (once) break;
    sleep_for(interval);
  }
  return 0;
}
