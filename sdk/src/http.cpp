#include <sbx/sdk/http.hpp>

#include <sbx/sdk/time.hpp>
#include <sbx/sdk/unix_socket.hpp>

#include <curl/curl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <system_error>
#include <thread>
#include <unordered_map>

namespace sbx::sdk::http {
namespace {

using Clock = std::chrono::steady_clock;

// The loop wakes at least this often even when libcurl has no timer due (it is woken for new
// requests and cancellations anyway); it only bounds the cost of a missed wakeup.
constexpr int kMaxPollMs = 1000;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      throw Error::internal("http: curl_global_init failed");
    }
  });
}

template <typename T>
void set(CURL* easy, CURLoption option, T value) {
  if (CURLcode code = curl_easy_setopt(easy, option, value); code != CURLE_OK) {
    throw Error::internal(std::string("http: curl_easy_setopt: ") + curl_easy_strerror(code));
  }
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view text) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!text.empty() && space(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && space(text.back()))
    text.remove_suffix(1);
  return text;
}

Error to_error(const std::exception_ptr& exception) {
  try {
    std::rethrow_exception(exception);
  } catch (const Error& error) {
    return error;
  } catch (const std::exception& error) {
    return Error::internal(error.what());
  } catch (...) {
    return Error::internal("http: unknown exception in a request callback");
  }
}

}  // namespace

namespace detail {

struct Shared;

// What a Call shares with the loop: the outcome, and the way back to the loop for cancel().
struct CallState {
  std::shared_ptr<Shared> shared;
  std::mutex mutex;
  std::condition_variable finished;  // also signalled when pulled body bytes arrive
  bool done = false;
  std::string body;        // pulled body bytes not yet read (Request::pull_body_limit)
  bool paused = false;     // the transfer waits for read_body to make room
  bool recv_held = false;  // Call::hold_receive: a streamed body waits
  std::optional<Response> response;
  std::optional<Error> error;
  // Pushed request body (Request::push_body): bytes from push_at on wait for the read callback.
  std::string push_buffer;
  size_t push_at = 0;
  size_t push_limit = 0;
  bool push_finished = false;
  std::optional<Error> push_error;
  bool push_paused = false;  // the transfer waits for write_body to bring bytes

  size_t push_queued() const { return push_buffer.size() - push_at; }

  void wait() {
    std::unique_lock lock(mutex);
    finished.wait(lock, [&] { return done; });
  }
};

// One request while the loop owns it. Only the loop thread touches it once it is queued.
struct Transfer {
  Request request;
  std::function<void(Response*, const Error*)> on_complete;
  std::shared_ptr<CallState> state;
  std::string url;
  std::string endpoint;  // what "cannot connect to ..." names: the unix socket or the URL
  std::optional<Clock::time_point> deadline;

  CURL* easy = nullptr;
  curl_slist* header_list = nullptr;
  char error_buffer[CURL_ERROR_SIZE] = {};
  Response response;
  long block_status = 0;  // the header block being read (1xx blocks are dropped)
  Headers block_headers;
  size_t header_bytes = 0;  // of every head so far, against kMaxHeaderBytes
  // A unix socket reached without following links (ClientOptions::unix_socket_follow_links):
  // the socket file while its connection is made, and why it could not be reached.
  UniqueFd route;
  std::optional<Error> route_error;
  bool headers_done = false;
  std::exception_ptr callback_error;  // what a request callback threw; it ends the request

  bool idempotent = false;
  int attempts = 0;            // times the request was about to go out (prereq callback)
  bool retry_refused = false;  // libcurl wanted to resend it and we said no
  bool recv_paused = false;    // paused by us: the pulled body waits for its reader
  bool send_paused = false;    // paused by us: the pushed body waits for its writer
  Clock::time_point last_activity;

  ~Transfer() {
    if (easy) curl_easy_cleanup(easy);
    curl_slist_free_all(header_list);
  }
};

// The part of the loop other threads touch, under `mutex`. Calls keep it alive, so cancel() is
// safe even after the Client is gone.
struct Shared {
  std::mutex mutex;
  CURLM* multi = nullptr;
  bool stopping = false;  // the Client is being destroyed
  bool closed = false;    // the loop has taken its last requests; later ones fail at once
  std::vector<std::unique_ptr<Transfer>> incoming;
  std::vector<std::shared_ptr<CallState>> cancels;
  std::vector<std::shared_ptr<CallState>> resumes;  // paused transfers whose reader/writer acted
  std::multimap<Clock::time_point, std::function<void()>> timers;  // Client::after, by due time
};

}  // namespace detail

using detail::CallState;
using detail::Shared;
using detail::Transfer;

namespace {

// Ends a request exactly once: runs the completion callback, then publishes the outcome.
void complete(Transfer& transfer, const Error* error) {
  if (transfer.on_complete) {
    try {
      transfer.on_complete(error ? nullptr : &transfer.response, error);
    } catch (...) {  // nowhere to report it; the outcome below still stands
    }
  }
  CallState& state = *transfer.state;
  std::lock_guard lock(state.mutex);
  if (error) {
    state.error = *error;
  } else {
    state.response = std::move(transfer.response);
  }
  state.done = true;
  state.finished.notify_all();
}

std::string describe(const Transfer& t);

std::optional<uint64_t> parse_number(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

std::string range_text(const ByteRange& range) {
  return "bytes=" + std::to_string(range.start) + "-" +
         (range.end ? std::to_string(*range.end) : std::string());
}

// Checks a 2xx answer to a Request::range before its body is delivered.
void check_range(const Transfer& t) {
  const ByteRange& range = *t.request.range;
  const long status = t.response.status;
  if (status < 200 || status > 299) return;
  const std::string asked = describe(t) + " (Range: " + range_text(range) + ")";
  if (status != 206) {
    throw Error::internal(asked + ": the server ignored the range and answered " +
                          std::to_string(status) + " with the whole resource, not 206");
  }
  const std::string header = t.response.header("Content-Range");
  auto bad = [&](const std::string& why) {
    return Error::internal(asked + ": 206 with Content-Range '" + header + "': " + why);
  };
  // "bytes first-last/total", total may be "*".
  std::string_view text = trim(header);
  if (!text.starts_with("bytes ")) throw bad("not a byte range");
  text.remove_prefix(6);
  const size_t dash = text.find('-');
  const size_t slash = text.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) {
    throw bad("not of the form 'bytes first-last/total'");
  }
  const auto first = parse_number(text.substr(0, dash));
  const auto last = parse_number(text.substr(dash + 1, slash - dash - 1));
  const std::string_view total_text = text.substr(slash + 1);
  const bool total_known = total_text != "*";
  const uint64_t total = total_known ? parse_number(total_text).value_or(0) : 0;
  if (!first || !last || *last < *first || (total_known && !parse_number(total_text))) {
    throw bad("not of the form 'bytes first-last/total'");
  }
  if (*first != range.start) {
    throw bad("it starts at " + std::to_string(*first) + ", not at " + std::to_string(range.start));
  }
  if (range.end && *last > *range.end) {
    throw bad("it ends at " + std::to_string(*last) + ", after " + std::to_string(*range.end));
  }
  if (range.end && *last < *range.end && !(total_known && *last + 1 == total)) {
    throw bad("it ends at " + std::to_string(*last) + ", before " + std::to_string(*range.end) +
              " and before the end of the resource");
  }
  if (range.total && total_known && total != *range.total) {
    throw bad("the resource is " + std::to_string(total) + " bytes, not " +
              std::to_string(*range.total));
  }
}

void deliver_headers(Transfer& transfer) {
  transfer.headers_done = true;
  transfer.response.status = transfer.block_status;
  transfer.response.headers = std::move(transfer.block_headers);
  if (transfer.request.range) check_range(transfer);
  if (transfer.request.on_headers) {
    transfer.request.on_headers(transfer.response.status, transfer.response.headers);
  }
}

// ---- libcurl callbacks: each catches what user code throws and makes libcurl abort ----------

size_t on_header_line(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  transfer.last_activity = Clock::now();
  try {
    transfer.header_bytes += bytes;
    if (transfer.header_bytes > kMaxHeaderBytes) {
      throw Error::resource_exhausted(describe(transfer) +
                                      ": the answer's head (or its trailers) " + "is larger than " +
                                      std::to_string(kMaxHeaderBytes) + " bytes");
    }
    if (transfer.headers_done) return bytes;  // trailers of a chunked response
    std::string_view line = trim({data, bytes});
    if (line.empty()) {
      // End of a header block. 1xx responses are interim; the real one follows.
      if (transfer.block_status >= 200 || transfer.block_status < 100) {
        deliver_headers(transfer);
      } else {
        transfer.block_headers.clear();
      }
    } else if (line.starts_with("HTTP/")) {
      size_t space = line.find(' ');
      transfer.block_status =
          space == std::string_view::npos
              ? 0
              : std::strtol(std::string(line.substr(space + 1, 3)).c_str(), nullptr, 10);
      transfer.block_headers.clear();
    } else if (size_t colon = line.find(':'); colon != std::string_view::npos) {
      transfer.block_headers.emplace_back(trim(line.substr(0, colon)),
                                          trim(line.substr(colon + 1)));
    }
    return bytes;
  } catch (...) {
    transfer.callback_error = std::current_exception();
    return 0;
  }
}

size_t on_body_bytes(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  try {
    if (!transfer.headers_done) deliver_headers(transfer);
    if (transfer.request.pull_body_limit > 0 && !transfer.request.on_body) {
      CallState& state = *transfer.state;
      std::lock_guard lock(state.mutex);
      if (!state.body.empty() && state.body.size() + bytes > transfer.request.pull_body_limit) {
        state.paused = true;  // libcurl hands the same bytes again after the resume
        transfer.recv_paused = true;
        return CURL_WRITEFUNC_PAUSE;
      }
      transfer.last_activity = Clock::now();
      state.body.append(data, bytes);
      state.finished.notify_all();
    } else if (transfer.request.on_body) {
      {
        CallState& state = *transfer.state;
        std::lock_guard lock(state.mutex);
        if (state.recv_held) {  // libcurl hands the same bytes again after the release
          transfer.recv_paused = true;
          return CURL_WRITEFUNC_PAUSE;
        }
      }
      transfer.last_activity = Clock::now();
      transfer.request.on_body({data, bytes});
    } else {
      const size_t limit = transfer.request.max_body_bytes;
      if (limit > 0 && transfer.response.body.size() + bytes > limit) {
        throw Error::resource_exhausted(describe(transfer) + ": the response body is larger than " +
                                        std::to_string(limit) + " bytes (Request::max_body_bytes)");
      }
      transfer.last_activity = Clock::now();
      transfer.response.body.append(data, bytes);
    }
    return bytes;
  } catch (...) {
    transfer.callback_error = std::current_exception();
    return CURL_WRITEFUNC_ERROR;
  }
}

size_t on_body_source(char* buffer, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const size_t capacity = size * count;
  try {
    size_t filled = transfer.request.body_source(buffer, capacity);
    if (filled > capacity) throw Error::internal("http: body_source overfilled its buffer");
    if (filled > 0) transfer.last_activity = Clock::now();
    return filled;
  } catch (...) {
    transfer.callback_error = std::current_exception();
    return CURL_READFUNC_ABORT;
  }
}

// The read callback of a pushed body: hands out what write_body queued, pauses when nothing is.
size_t on_push_source(char* buffer, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const size_t capacity = size * count;
  CallState& state = *transfer.state;
  std::lock_guard lock(state.mutex);
  if (state.push_error) {
    transfer.callback_error = std::make_exception_ptr(*state.push_error);
    return CURL_READFUNC_ABORT;
  }
  if (const size_t queued = state.push_queued(); queued > 0) {
    const size_t n = std::min(capacity, queued);
    std::memcpy(buffer, state.push_buffer.data() + state.push_at, n);
    state.push_at += n;
    if (state.push_at == state.push_buffer.size()) {
      state.push_buffer.clear();
      state.push_at = 0;
    } else if (state.push_at > state.push_buffer.size() / 2) {
      state.push_buffer.erase(0, state.push_at);
      state.push_at = 0;
    }
    state.finished.notify_all();  // a writer may wait for room
    transfer.last_activity = Clock::now();
    return n;
  }
  if (state.push_finished) return 0;
  state.push_paused = true;
  transfer.send_paused = true;
  return CURL_READFUNC_PAUSE;
}

// Runs each time the request is about to go out on a connection, new or reused. A second time
// means libcurl is resending it after a reused connection died before any answer: allowed once
// for an idempotent request, never for another (it may have run).
int on_prereq(void* user, char*, char*, int, int) {
  auto& transfer = *static_cast<Transfer*>(user);
  transfer.last_activity = Clock::now();
  transfer.route = UniqueFd();  // connected: the socket file's descriptor is no longer needed
  if (++transfer.attempts > (transfer.idempotent ? 2 : 1)) {
    transfer.retry_refused = true;
    return CURL_PREREQFUNC_ABORT;
  }
  return CURL_PREREQFUNC_OK;
}

// Opens the socket of a connection to a unix socket reached without following links: the socket
// file is opened component by component (sbx/sdk/unix_socket.hpp) and the address libcurl is
// about to connect to is made "/proc/self/fd/N" of it, so the connection reaches that very file.
// libcurl keeps the address in storage sized for a sockaddr_un and connects right after this;
// the descriptor is closed once the connection is up (on_prereq) or with the transfer.
curl_socket_t open_unix_socket_nofollow(void* user, curlsocktype, curl_sockaddr* address) {
  auto& transfer = *static_cast<Transfer*>(user);
  if (address->family != AF_UNIX) return CURL_SOCKET_BAD;
  try {
    transfer.route = open_socket_file(transfer.endpoint);
    const std::string by_fd = fd_path(transfer.route.get());
    auto* un = reinterpret_cast<sockaddr_un*>(&address->addr);
    std::memcpy(un->sun_path, by_fd.c_str(), by_fd.size() + 1);
    address->addrlen =
        static_cast<unsigned int>(offsetof(sockaddr_un, sun_path) + by_fd.size() + 1);
  } catch (const Error& error) {
    transfer.route_error = error;
    return CURL_SOCKET_BAD;
  }
  const int fd = ::socket(AF_UNIX, address->socktype | SOCK_CLOEXEC, address->protocol);
  return fd < 0 ? CURL_SOCKET_BAD : fd;
}

// ---- Request setup ----------------------------------------------------------------------------

void add_header(Transfer& t, const std::string& line) {
  curl_slist* list = curl_slist_append(t.header_list, line.c_str());
  if (!list) throw Error::internal("http: out of memory building headers");
  t.header_list = list;
}

void set_body(Transfer& t) {
  const Request& request = t.request;
  if (request.body_source || request.push_body) {
    // An "upload" streams through the read callback; CUSTOMREQUEST below keeps the method
    // (libcurl would say PUT). Without a size the body goes chunked. No seek function: libcurl
    // cannot rewind such a body, so it never resends one whose bytes went out.
    set(t.easy, CURLOPT_UPLOAD, 1L);
    if (request.push_body) {
      set(t.easy, CURLOPT_READFUNCTION, &on_push_source);
    } else {
      set(t.easy, CURLOPT_READFUNCTION, &on_body_source);
    }
    set(t.easy, CURLOPT_READDATA, &t);
    // Large bodies move in larger pieces (libcurl's default is 64 KiB): fewer callbacks, chunks
    // and socket writes per byte.
    set(t.easy, CURLOPT_UPLOAD_BUFFERSIZE, 512L * 1024);
    if (request.body_size >= 0) {
      set(t.easy, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body_size));
    } else {
      add_header(t, "Transfer-Encoding: chunked");
    }
  } else if (!request.body.empty() || request.method == "POST" || request.method == "PUT" ||
             request.method == "PATCH") {
    set(t.easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    set(t.easy, CURLOPT_POSTFIELDS, request.body.data());
  } else if (request.method == "HEAD") {
    set(t.easy, CURLOPT_NOBODY, 1L);  // do not wait for the body its Content-Length announces
  }
  set(t.easy, CURLOPT_CUSTOMREQUEST, request.method.c_str());
}

void set_headers(Transfer& t, const ClientOptions& options) {
  auto send_header = [&t](const std::string& name, const std::string& value) {
    // "Name;" is libcurl's way to send a header with an empty value.
    add_header(t, value.empty() ? name + ";" : name + ": " + value);
  };
  auto requested = [&t](std::string_view name) {
    return std::any_of(t.request.headers.begin(), t.request.headers.end(),
                       [&](const auto& header) { return iequals(header.first, name); });
  };
  for (const auto& [name, value] : options.default_headers) {
    if (!requested(name)) send_header(name, value);
  }
  for (const auto& [name, value] : t.request.headers)
    send_header(name, value);
  if (t.request.range && !requested("Range")) send_header("Range", range_text(*t.request.range));
  // libcurl would otherwise wait for a "100 Continue" before sending larger bodies.
  add_header(t, "Expect:");
  set(t.easy, CURLOPT_HTTPHEADER, t.header_list);
}

void set_up(Transfer& t, const ClientOptions& options) {
  t.easy = curl_easy_init();
  if (!t.easy) throw Error::internal("http: curl_easy_init failed");
  set(t.easy, CURLOPT_PRIVATE, static_cast<void*>(&t));
  set(t.easy, CURLOPT_URL, t.url.c_str());
  set(t.easy, CURLOPT_PROTOCOLS_STR, "http,https");
  set(t.easy, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  set(t.easy, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);  // a proxy's CONNECT reply is not the response
  set(t.easy, CURLOPT_NOSIGNAL, 1L);
  set(t.easy, CURLOPT_ERRORBUFFER, t.error_buffer);
  set(t.easy, CURLOPT_USERAGENT, options.user_agent.c_str());
  set(t.easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.connect_timeout.count()));
  // Idle connections: libcurl drops a pooled one idle for more than MAXAGE whole seconds
  // (it compares integer seconds), so MAXAGE = N - 1 reuses only those idle for less than N s.
  if (options.keepalive_expiry.count() <= 0) {
    set(t.easy, CURLOPT_FORBID_REUSE, 1L);
  } else {
    const auto whole = std::chrono::floor<std::chrono::seconds>(options.keepalive_expiry).count();
    set(t.easy, CURLOPT_MAXAGE_CONN, static_cast<long>(std::max<int64_t>(whole, 1) - 1));
  }
  set(t.easy, CURLOPT_PREREQFUNCTION, &on_prereq);
  set(t.easy, CURLOPT_PREREQDATA, static_cast<void*>(&t));
  // Proxy policy (ClientOptions::proxy): "" disables every proxy, the environment's included.
  const std::string& unix_socket =
      t.request.unix_socket.empty() ? options.unix_socket : t.request.unix_socket;
  if (!unix_socket.empty() || (options.proxy.empty() && !options.use_env_proxy)) {
    set(t.easy, CURLOPT_PROXY, "");
  } else if (!options.proxy.empty()) {
    set(t.easy, CURLOPT_PROXY, options.proxy.c_str());
    set(t.easy, CURLOPT_NOPROXY, "");
  }
  // TLS: verification is libcurl's default too; set explicitly so nothing else can turn it off.
  set(t.easy, CURLOPT_SSL_VERIFYPEER, options.insecure_skip_verify ? 0L : 1L);
  set(t.easy, CURLOPT_SSL_VERIFYHOST, options.insecure_skip_verify ? 0L : 2L);
  if (!options.ca_bundle.empty()) set(t.easy, CURLOPT_CAINFO, options.ca_bundle.c_str());
  if (!options.client_cert.empty()) set(t.easy, CURLOPT_SSLCERT, options.client_cert.c_str());
  if (!options.client_key.empty()) set(t.easy, CURLOPT_SSLKEY, options.client_key.c_str());
  if (!unix_socket.empty()) {
    sockaddr_un address{};
    if (unix_socket.size() >= sizeof address.sun_path) {
      throw Error::invalid_argument(
          "the unix socket path " + unix_socket + " is " + std::to_string(unix_socket.size()) +
          " bytes; a socket address holds at most " + std::to_string(sizeof address.sun_path - 1));
    }
    set(t.easy, CURLOPT_UNIX_SOCKET_PATH, unix_socket.c_str());
    if (!options.unix_socket_follow_links) {
      set(t.easy, CURLOPT_OPENSOCKETFUNCTION, &open_unix_socket_nofollow);
      set(t.easy, CURLOPT_OPENSOCKETDATA, static_cast<void*>(&t));
    }
  } else {
    // Notice peers that vanished (a rebooted host) on idle pooled and long-streaming connections.
    set(t.easy, CURLOPT_TCP_KEEPALIVE, 1L);
    set(t.easy, CURLOPT_TCP_KEEPIDLE, 60L);
    set(t.easy, CURLOPT_TCP_KEEPINTVL, 20L);
  }
  if (t.deadline) {
    // Rounded up; libcurl may still fire a little early (see curl_error).
    auto left = std::chrono::ceil<std::chrono::milliseconds>(*t.deadline - Clock::now());
    set(t.easy, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max<int64_t>(left.count(), 1)));
  }
  set(t.easy, CURLOPT_HEADERFUNCTION, &on_header_line);
  set(t.easy, CURLOPT_HEADERDATA, &t);
  set(t.easy, CURLOPT_WRITEFUNCTION, &on_body_bytes);
  set(t.easy, CURLOPT_WRITEDATA, &t);
  set_body(t);
  set_headers(t, options);
}

std::string describe(const Transfer& t) {
  return t.request.method + " " + t.url;
}

// What a failure after the request went out is, by idempotency: a retryable loss, or for a
// request that must not run twice, "may have run" (never retryable).
Error lost(const Transfer& t, sbx_status status, const std::string& message) {
  if (t.idempotent || t.attempts == 0) {
    return Error(status, message, ErrorDetails{.retryable = status != SBX_STATUS_INTERNAL});
  }
  return Error(status,
               message + "; " + t.request.method +
                   " is not idempotent and the request may have run, so it is not retryable",
               ErrorDetails{.retryable = false, .may_have_run = true});
}

std::string tls_hint(const ClientOptions& options) {
  return options.ca_bundle.empty() ? " (set ca_bundle to the server's CA certificate)"
                                   : " (against ca_bundle " + options.ca_bundle + ")";
}

Error curl_error(const Transfer& t, CURLcode code, const ClientOptions& options) {
  std::string message = t.error_buffer[0] ? t.error_buffer : curl_easy_strerror(code);
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY: {
      if (t.route_error) return *t.route_error;
      // libcurl's own text names "localhost port 80" even for a unix socket; the errno says
      // what matters there (no such file, permission denied, refused).
      long os_errno = 0;
      curl_easy_getinfo(t.easy, CURLINFO_OS_ERRNO, &os_errno);
      std::string reason = code == CURLE_COULDNT_RESOLVE_PROXY ? message : curl_easy_strerror(code);
      if (os_errno != 0) {
        reason += " (" + std::generic_category().message(static_cast<int>(os_errno)) + ")";
      }
      return Error::unavailable("cannot connect to " + t.endpoint + ": " + reason);
    }
    case CURLE_OPERATION_TIMEDOUT: {
      // Once connected, only the request timer can fire. Before that it was the connect timeout,
      // unless the request's own time ran out while connecting. libcurl's clock may fire its
      // request timer a little before our deadline, hence the margin.
      curl_off_t connect_us = 0;
      curl_easy_getinfo(t.easy, CURLINFO_CONNECT_TIME_T, &connect_us);
      const bool connected = connect_us > 0 || t.attempts > 0;
      if (t.deadline &&
          (connected || Clock::now() + std::chrono::milliseconds(20) >= *t.deadline)) {
        return lost(t, SBX_STATUS_TIMEOUT,
                    describe(t) + ": deadline of " + std::to_string(t.request.timeout.count()) +
                        " ms exceeded (" + message + ")");
      }
      return Error::unavailable("cannot connect to " + t.endpoint + ": " + message);
    }
    case CURLE_ABORTED_BY_CALLBACK:
      if (t.retry_refused) {
        return lost(t, SBX_STATUS_UNAVAILABLE,
                    describe(t) + ": connection lost before any answer" +
                        (t.idempotent ? ", also when sent again on a new connection"
                                      : " on a reused connection"));
      }
      break;
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
      // TLS 1.3 servers refuse a client certificate (or its absence) after the handshake, with an
      // alert the first read meets: the request never reached the application.
      if (t.block_status == 0 && !t.headers_done && message.find("SSL") != std::string::npos &&
          message.find(" alert ") != std::string::npos) {
        return Error::unavailable("TLS: " + t.endpoint + " refused this client: " + message +
                                      " (does it require a client certificate? set client_cert "
                                      "and client_key)",
                                  false);
      }
      [[fallthrough]];
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SEND_FAIL_REWIND:
      // The peer dropped the connection mid-request: transient from the client's point of view,
      // unless the request must not run twice.
      return lost(t, SBX_STATUS_UNAVAILABLE, describe(t) + ": connection lost (" + message + ")");
    case CURLE_PEER_FAILED_VERIFICATION:
      return Error::unavailable("TLS: the certificate of " + t.endpoint + " did not verify" +
                                    tls_hint(options) + ": " + message,
                                false);
    case CURLE_SSL_CONNECT_ERROR:
      return Error::unavailable(
          "TLS handshake with " + t.endpoint + " failed (does it speak TLS?): " + message, false);
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CRL_BADFILE:
      return Error::invalid_argument("TLS: a certificate or key file cannot be used for " +
                                     t.endpoint + ": " + message);
    default:
      break;
  }
  return lost(t, SBX_STATUS_INTERNAL,
              describe(t) + ": " + message + " (curl error " +
                  std::to_string(static_cast<int>(code)) + ")");
}

bool idempotent_method(std::string_view method) {
  for (std::string_view m : {"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"}) {
    if (iequals(method, m)) return true;
  }
  return false;
}

}  // namespace

// ---- The loop ---------------------------------------------------------------------------------

struct Client::Loop {
  explicit Loop(const ClientOptions& options) : options(options) {
    global_init();
    shared->multi = curl_multi_init();
    if (!shared->multi) throw Error::internal("http: curl_multi_init failed");
    curl_multi_setopt(shared->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, options.max_connections);
    curl_multi_setopt(
        shared->multi, CURLMOPT_MAXCONNECTS,
        options.max_idle_connections >= 0 ? options.max_idle_connections : options.max_connections);
    thread = std::thread([this] { run(); });
  }

  ~Loop() {
    {
      std::lock_guard lock(shared->mutex);
      shared->stopping = true;
      curl_multi_wakeup(shared->multi);
    }
    thread.join();
    std::lock_guard lock(shared->mutex);
    curl_multi_cleanup(shared->multi);
    shared->multi = nullptr;
  }

  std::shared_ptr<CallState> start(Request request,
                                   std::function<void(Response*, const Error*)> on_complete) {
    auto state = std::make_shared<CallState>();
    state->shared = shared;
    state->push_limit = std::max<size_t>(request.push_buffer_limit, 1);
    auto transfer = std::make_unique<Transfer>();
    transfer->idempotent = request.idempotent.value_or(idempotent_method(request.method));
    if (request.timeout.count() > 0) transfer->deadline = deadline_after(request.timeout);
    transfer->url = options.base_url + request.target;
    const std::string& socket =
        request.unix_socket.empty() ? options.unix_socket : request.unix_socket;
    transfer->endpoint = socket.empty() ? transfer->url : socket;
    transfer->request = std::move(request);
    transfer->on_complete = std::move(on_complete);
    transfer->state = state;
    {
      std::lock_guard lock(shared->mutex);
      if (!shared->closed) {
        shared->incoming.push_back(std::move(transfer));
        curl_multi_wakeup(shared->multi);
        return state;
      }
    }
    Error cancelled = Error::cancelled("http: client is shutting down");
    complete(*transfer, &cancelled);
    return state;
  }

  void after(std::chrono::milliseconds delay, std::function<void()> fn) {
    {
      std::lock_guard lock(shared->mutex);
      if (!shared->closed) {
        shared->timers.emplace(deadline_after(delay), std::move(fn));
        curl_multi_wakeup(shared->multi);
        return;
      }
    }
    run_timer(fn);
  }

  void run() {
    pthread_setname_np(pthread_self(), "sbx-http");
    while (take_commands()) {
      int running = 0;
      curl_multi_perform(shared->multi, &running);
      collect_finished();
      const int wait_ms = std::min(expire_idle(), run_due_timers());
      curl_multi_poll(shared->multi, nullptr, 0, wait_ms, nullptr);
    }
    shut_down();
  }

  static void run_timer(const std::function<void()>& fn) {
    try {
      fn();
    } catch (...) {  // nowhere to report it
    }
  }

  // Runs the Client::after functions that are due; returns how long the loop may wait before the
  // next one is.
  int run_due_timers() {
    for (;;) {
      std::function<void()> fn;
      {
        std::lock_guard lock(shared->mutex);
        if (shared->timers.empty()) return kMaxPollMs;
        const auto first = shared->timers.begin();
        const auto left = first->first - Clock::now();
        if (left > Clock::duration::zero()) {
          return static_cast<int>(std::min<int64_t>(
              kMaxPollMs, std::chrono::ceil<std::chrono::milliseconds>(left).count()));
        }
        fn = std::move(first->second);
        shared->timers.erase(first);
      }
      run_timer(fn);
    }
  }

  // Adds new requests and applies cancellations; false once the Client is being destroyed.
  bool take_commands() {
    std::vector<std::unique_ptr<Transfer>> incoming;
    std::vector<std::shared_ptr<CallState>> cancels;
    std::vector<std::shared_ptr<CallState>> resumes;
    {
      std::lock_guard lock(shared->mutex);
      if (shared->stopping) return false;
      incoming.swap(shared->incoming);
      cancels.swap(shared->cancels);
      resumes.swap(shared->resumes);
    }
    for (auto& transfer : incoming)
      add(std::move(transfer));
    for (auto& state : cancels)
      abort(state.get());
    for (auto& state : resumes) {
      // May call on_body_bytes at once, with the bytes it held back, or the read callback.
      if (auto it = active.find(state.get()); it != active.end()) {
        Transfer& transfer = *it->second;
        transfer.recv_paused = transfer.send_paused = false;
        transfer.last_activity = Clock::now();  // paused time is not idle time
        curl_easy_pause(transfer.easy, CURLPAUSE_CONT);
      }
    }
    return true;
  }

  // Fails the transfers whose Request::idle_timeout passed; returns how long the loop may wait
  // before the next one could.
  int expire_idle() {
    const auto now = Clock::now();
    auto wait = std::chrono::milliseconds(kMaxPollMs);
    std::vector<CallState*> expired;
    for (const auto& [key, transfer] : active) {
      const auto limit = transfer->request.idle_timeout;
      if (limit.count() <= 0 || transfer->attempts == 0 || transfer->recv_paused ||
          transfer->send_paused) {
        continue;
      }
      const auto left = transfer->last_activity + limit - now;
      if (left <= Clock::duration::zero()) {
        expired.push_back(key);
      } else {
        wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(left));
      }
    }
    for (CallState* key : expired) {
      if (auto transfer = release(key)) {
        const Error error = lost(*transfer, SBX_STATUS_TIMEOUT,
                                 describe(*transfer) + ": nothing received or sent for " +
                                     std::to_string(transfer->request.idle_timeout.count()) +
                                     " ms (Request::idle_timeout)");
        complete(*transfer, &error);
      }
    }
    return static_cast<int>(wait.count());
  }

  void add(std::unique_ptr<Transfer> transfer) {
    try {
      set_up(*transfer, options);
      if (CURLMcode code = curl_multi_add_handle(shared->multi, transfer->easy); code != CURLM_OK) {
        throw Error::internal(std::string("http: curl_multi_add_handle: ") +
                              curl_multi_strerror(code));
      }
    } catch (...) {
      const Error error = sdk::detail::current_exception_to_error();
      complete(*transfer, &error);
      return;
    }
    CallState* key = transfer->state.get();
    active.emplace(key, std::move(transfer));
  }

  std::unique_ptr<Transfer> release(CallState* key) {
    auto it = active.find(key);
    if (it == active.end()) return nullptr;
    std::unique_ptr<Transfer> transfer = std::move(it->second);
    active.erase(it);
    curl_multi_remove_handle(shared->multi, transfer->easy);
    return transfer;
  }

  // Cancels one transfer, if it is still running.
  void abort(CallState* key, const char* why = "cancelled") {
    if (auto transfer = release(key)) {
      const Error cancelled = Error::cancelled(describe(*transfer) + ": " + why);
      complete(*transfer, &cancelled);
    }
  }

  void collect_finished() {
    int queued = 0;
    while (CURLMsg* message = curl_multi_info_read(shared->multi, &queued)) {
      if (message->msg != CURLMSG_DONE) continue;
      const CURLcode code = message->data.result;  // `message` dies with remove_handle
      void* user = nullptr;
      curl_easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, &user);
      if (auto transfer = release(static_cast<Transfer*>(user)->state.get())) {
        finish(*transfer, code);
      }
    }
  }

  void finish(Transfer& transfer, CURLcode code) {
    std::optional<Error> error;
    if (transfer.callback_error) {
      error = to_error(transfer.callback_error);
    } else if (code != CURLE_OK) {
      error = curl_error(transfer, code, options);
    } else if (!transfer.headers_done) {
      try {  // a response that ended without a blank line after its headers
        curl_easy_getinfo(transfer.easy, CURLINFO_RESPONSE_CODE, &transfer.block_status);
        deliver_headers(transfer);
      } catch (...) {
        error = to_error(std::current_exception());
      }
    }
    complete(transfer, error ? &*error : nullptr);
  }

  // Fails what is in flight, then what is queued, including requests that those completions
  // start, until the queue stays empty; after that start() fails new requests by itself.
  void shut_down() {
    while (!active.empty())
      abort(active.begin()->first, "cancelled, client destroyed");
    const Error cancelled = Error::cancelled("http: cancelled, client destroyed");
    for (;;) {
      std::vector<std::unique_ptr<Transfer>> incoming;
      std::multimap<Clock::time_point, std::function<void()>> timers;
      {
        std::lock_guard lock(shared->mutex);
        shared->cancels.clear();
        if (shared->incoming.empty() && shared->timers.empty()) {
          shared->closed = true;
          return;
        }
        incoming.swap(shared->incoming);
        timers.swap(shared->timers);
      }
      for (const auto& [due, fn] : timers)
        run_timer(fn);
      for (auto& transfer : incoming)
        complete(*transfer, &cancelled);
    }
  }

  const ClientOptions& options;
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::unordered_map<CallState*, std::unique_ptr<Transfer>> active;  // loop thread only
  std::thread thread;
};

// ---- Public API -------------------------------------------------------------------------------

std::string Response::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (iequals(key, name)) return value;
  }
  return "";
}

void Call::cancel() const {
  if (!state_) return;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->done) return;
  }
  Shared& shared = *state_->shared;
  std::lock_guard lock(shared.mutex);
  if (shared.closed) return;
  shared.cancels.push_back(state_);
  curl_multi_wakeup(shared.multi);
}

bool Call::done() const {
  if (!state_) return false;
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

bool Call::wait_until(std::chrono::steady_clock::time_point deadline) const {
  if (!state_) return false;
  std::unique_lock lock(state_->mutex);
  return state_->finished.wait_until(lock, deadline, [&] { return state_->done; });
}

namespace {
void queue_resume(const std::shared_ptr<CallState>& state) {
  Shared& shared = *state->shared;
  std::lock_guard lock(shared.mutex);
  if (!shared.closed) {
    shared.resumes.push_back(state);
    curl_multi_wakeup(shared.multi);
  }
}
}  // namespace

size_t Call::write_body(std::string_view bytes,
                        std::chrono::steady_clock::time_point deadline) const {
  if (!state_) return 0;
  size_t written = 0;
  while (written < bytes.size()) {
    bool resume = false;
    {
      std::unique_lock lock(state_->mutex);
      state_->finished.wait_until(lock, deadline, [&] {
        return state_->done || state_->push_finished || state_->push_error ||
               state_->push_queued() < state_->push_limit;
      });
      if (state_->done || state_->push_finished || state_->push_error ||
          state_->push_queued() >= state_->push_limit) {
        return written;  // ended, or the deadline passed with the buffer still full
      }
      const size_t n = std::min(bytes.size() - written, state_->push_limit - state_->push_queued());
      state_->push_buffer.append(bytes.data() + written, n);
      written += n;
      resume = std::exchange(state_->push_paused, false);
    }
    if (resume) queue_resume(state_);
  }
  return written;
}

void Call::finish_body() const {
  if (!state_) return;
  bool resume;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->done) return;
    state_->push_finished = true;
    state_->finished.notify_all();  // a write_body waiting for room returns: the body has ended
    resume = std::exchange(state_->push_paused, false);
  }
  if (resume) queue_resume(state_);
}

void Call::fail_body(Error error) const {
  if (!state_) return;
  bool resume;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->done || state_->push_error) return;
    state_->push_error = std::move(error);
    state_->finished.notify_all();
    resume = std::exchange(state_->push_paused, false);
  }
  if (resume) queue_resume(state_);
}

void Call::hold_receive(bool hold) const {
  if (!state_) return;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->recv_held == hold || state_->done) return;
    state_->recv_held = hold;
  }
  if (!hold) queue_resume(state_);  // a paused transfer reads again
}

bool Call::read_body(std::string& out, std::chrono::steady_clock::time_point deadline) const {
  out.clear();
  if (!state_) return true;
  bool done, resume;
  {
    std::unique_lock lock(state_->mutex);
    state_->finished.wait_until(lock, deadline,
                                [&] { return state_->done || !state_->body.empty(); });
    out.swap(state_->body);
    done = state_->done;
    resume = std::exchange(state_->paused, false);
  }
  if (resume) queue_resume(state_);
  return done;
}

Response Call::get() const {
  if (!state_) throw Error::internal("http: get() on an empty Call");
  state_->wait();
  std::lock_guard lock(state_->mutex);
  if (state_->error) throw *state_->error;
  return *state_->response;
}

Client::Client(ClientOptions options)
    : options_(std::move(options)), loop_(std::make_unique<Loop>(options_)) {}

Client::~Client() = default;

Call Client::start(Request request,
                   std::function<void(Response* response, const Error* error)> on_complete) {
  return Call(loop_->start(std::move(request), std::move(on_complete)));
}

void Client::after(std::chrono::milliseconds delay, std::function<void()> fn) {
  loop_->after(delay, std::move(fn));
}

Response Client::send(Request request, const CancelToken& cancel) {
  if (std::this_thread::get_id() == loop_->thread.get_id()) {
    throw Error::internal("http: Client::send() from a request callback would deadlock");
  }
  throw_if_cancelled(cancel);
  if (request.push_body) {
    throw Error::invalid_argument("http: send() cannot take a pushed body; use start() and write");
  }
  auto state = loop_->start(std::move(request), {});
  {
    Call call(state);
    std::stop_callback on_cancel(cancel, [&call] { call.cancel(); });
    state->wait();
  }
  std::lock_guard lock(state->mutex);
  if (state->error) throw *state->error;
  return std::move(*state->response);  // nobody else holds this call
}

// ---- Multipart ---------------------------------------------------------------------------------

namespace {
// A quoted Content-Disposition parameter value: '"', CR and LF percent-encoded, as browsers do.
std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') {
      out += "%22";
    } else if (c == '\r') {
      out += "%0D";
    } else if (c == '\n') {
      out += "%0A";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string part_head(const std::string& boundary, const Multipart::Part& part) {
  std::string head =
      "--" + boundary + "\r\nContent-Disposition: form-data; name=" + quoted(part.name);
  if (!part.filename.empty()) head += "; filename=" + quoted(part.filename);
  head += "\r\n";
  if (!part.content_type.empty()) head += "Content-Type: " + part.content_type + "\r\n";
  return head + "\r\n";
}
}  // namespace

Multipart::Multipart() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device random;
  boundary_ = "sbx-";
  for (int i = 0; i < 32; ++i)
    boundary_ += kHex[random() & 0xF];
}

void Multipart::add(Part part) {
  if (part.source == nullptr) part.size = static_cast<int64_t>(part.bytes.size());
  parts_.push_back(std::move(part));
}

std::string Multipart::content_type() const {
  return "multipart/form-data; boundary=" + boundary_;
}

int64_t Multipart::size() const {
  int64_t total = static_cast<int64_t>(boundary_.size()) + 6;  // "--" boundary "--\r\n"
  for (const Part& part : parts_) {
    if (part.size < 0) return -1;
    total += static_cast<int64_t>(part_head(boundary_, part).size()) + part.size + 2;
  }
  return total;
}

size_t Multipart::read(char* buffer, size_t capacity) {
  size_t out = 0;
  while (out < capacity) {
    if (pending_at_ < pending_.size()) {
      const size_t n = std::min(capacity - out, pending_.size() - pending_at_);
      std::memcpy(buffer + out, pending_.data() + pending_at_, n);
      pending_at_ += n;
      out += n;
      continue;
    }
    pending_.clear();
    pending_at_ = 0;
    if (closed_) break;
    if (index_ == parts_.size()) {
      pending_ = "--" + boundary_ + "--\r\n";
      closed_ = true;
      continue;
    }
    Part& part = parts_[index_];
    if (stage_ == 0) {
      pending_ = part_head(boundary_, part);
      part_read_ = 0;
      stage_ = 1;
    } else if (stage_ == 1) {
      const uint64_t declared = static_cast<uint64_t>(part.size);
      if (part.source) {
        const size_t n = part.source(buffer + out, capacity - out);
        if (n > capacity - out) throw Error::internal("http: a multipart source overfilled");
        part_read_ += n;
        out += n;
        if (part.size >= 0 && part_read_ > declared) {
          throw Error::invalid_argument("multipart part '" + part.name + "' gave more than its " +
                                        std::to_string(part.size) + " bytes");
        }
        if (n == 0) {
          if (part.size >= 0 && part_read_ != declared) {
            throw Error::invalid_argument("multipart part '" + part.name + "' ended after " +
                                          std::to_string(part_read_) + " of its " +
                                          std::to_string(part.size) + " bytes");
          }
          stage_ = 2;
        }
      } else {
        const size_t n = std::min<size_t>(capacity - out, part.bytes.size() - part_read_);
        std::memcpy(buffer + out, part.bytes.data() + part_read_, n);
        part_read_ += n;
        out += n;
        if (part_read_ == part.bytes.size()) stage_ = 2;
      }
    } else {
      pending_ = "\r\n";
      stage_ = 0;
      ++index_;
    }
  }
  return out;
}

void Multipart::attach(Request& request, Multipart multipart) {
  auto body = std::make_shared<Multipart>(std::move(multipart));
  request.headers.emplace_back("Content-Type", body->content_type());
  request.body_size = body->size();
  request.body_source = [body](char* buffer, size_t capacity) {
    return body->read(buffer, capacity);
  };
}

void Multipart::prepare_push(Request& request) const {
  request.headers.emplace_back("Content-Type", content_type());
  request.body_size = size();
  request.push_body = true;
}

bool Multipart::pump(const Call& call) {
  std::string buffer(64 * 1024, '\0');
  try {
    for (;;) {
      const size_t n = read(buffer.data(), buffer.size());
      if (n == 0) break;
      if (call.write_body({buffer.data(), n}) < n) return false;
    }
  } catch (...) {
    call.fail_body(sdk::detail::current_exception_to_error());
    throw;
  }
  call.finish_body();
  return true;
}

std::string url_encode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    }
  }
  return out;
}

}  // namespace sbx::sdk::http
