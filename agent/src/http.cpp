#include "http.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

namespace sbx::agent::http {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// Whether a comma-separated header value lists `token` (case-insensitive).
bool lists_token(std::string_view value, std::string_view token) {
  std::size_t pos = 0;
  while (pos <= value.size()) {
    std::size_t comma = value.find(',', pos);
    if (comma == std::string_view::npos) comma = value.size();
    if (lower(trim(value.substr(pos, comma - pos))) == token) return true;
    pos = comma + 1;
  }
  return false;
}

}  // namespace

const std::string* Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

const std::string* Request::query_value(std::string_view name) const {
  for (const auto& [k, v] : query)
    if (k == name) return &v;
  return nullptr;
}

std::optional<std::string> percent_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '+' && plus_is_space) {
      out += ' ';
    } else if (c == '%') {
      if (i + 2 >= s.size()) return std::nullopt;
      unsigned value = 0;
      const auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, value, 16);
      if (ec != std::errc() || p != s.data() + i + 3) return std::nullopt;
      out += static_cast<char>(value);
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<HeadError> parse_head(std::string_view head, Request& out) {
  const std::size_t line_end = head.find("\r\n");
  if (line_end == std::string_view::npos) return HeadError{400, "malformed request line"};
  const std::string_view line = head.substr(0, line_end);
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp1 == sp2) return HeadError{400, "malformed request line"};
  out.method = std::string(line.substr(0, sp1));
  out.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  const std::string_view version = line.substr(sp2 + 1);
  if (out.method.empty() || out.target.empty() || out.target[0] != '/')
    return HeadError{400, "malformed request line"};
  for (char c : out.method)
    if (!is_token_char(c)) return HeadError{400, "malformed request method"};
  if (version == "HTTP/1.1") {
    out.minor_version = 1;
  } else if (version == "HTTP/1.0") {
    out.minor_version = 0;
  } else {
    return HeadError{505, "only HTTP/1.0 and HTTP/1.1 are served"};
  }

  const std::size_t qmark = out.target.find('?');
  const std::string_view raw_path = std::string_view(out.target).substr(0, qmark);
  auto path = percent_decode(raw_path, false);
  if (!path) return HeadError{400, "bad percent-encoding in the path"};
  out.path = std::move(*path);
  // The real OpenSandbox server hands out a direct endpoint `HOST:PORT/proxy/44772` and execd
  // serves its routes under that prefix too: `/proxy/44772/ping` is `/ping`.
  constexpr std::string_view kSelf = "/proxy/44772";
  if (out.path.starts_with(kSelf) &&
      (out.path.size() == kSelf.size() || out.path[kSelf.size()] == '/')) {
    out.path.erase(0, kSelf.size());
    if (out.path.empty()) out.path = "/";
  }
  if (qmark != std::string::npos) {
    std::string_view q = std::string_view(out.target).substr(qmark + 1);
    while (!q.empty()) {
      const std::size_t amp = q.find('&');
      const std::string_view pair = q.substr(0, amp);
      if (!pair.empty()) {
        const std::size_t eq = pair.find('=');
        auto k = percent_decode(pair.substr(0, eq), true);
        auto v = percent_decode(eq == std::string_view::npos ? "" : pair.substr(eq + 1), true);
        if (!k || !v) return HeadError{400, "bad percent-encoding in the query"};
        out.query.emplace_back(std::move(*k), std::move(*v));
      }
      if (amp == std::string_view::npos) break;
      q.remove_prefix(amp + 1);
    }
  }

  std::size_t pos = line_end + 2;
  bool have_length = false;
  while (pos < head.size()) {
    const std::size_t end = head.find("\r\n", pos);
    if (end == std::string_view::npos) return HeadError{400, "malformed header"};
    if (end == pos) break;  // the blank line
    const std::string_view field = head.substr(pos, end - pos);
    pos = end + 2;
    if (field[0] == ' ' || field[0] == '\t') return HeadError{400, "obsolete header folding"};
    const std::size_t colon = field.find(':');
    if (colon == std::string_view::npos || colon == 0) return HeadError{400, "malformed header"};
    for (char c : field.substr(0, colon))
      if (!is_token_char(c)) return HeadError{400, "malformed header name"};
    out.headers.emplace_back(lower(field.substr(0, colon)),
                             std::string(trim(field.substr(colon + 1))));
  }

  out.keep_alive = out.minor_version == 1;
  for (const auto& [name, value] : out.headers) {
    if (name == "content-length") {
      std::size_t n = 0;
      const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || p != value.data() + value.size() || value.empty())
        return HeadError{400, "bad Content-Length"};
      if (have_length && n != out.content_length)
        return HeadError{400, "conflicting Content-Length"};
      have_length = true;
      out.content_length = n;
    } else if (name == "transfer-encoding") {
      if (lower(value) != "chunked") return HeadError{501, "only the chunked transfer coding"};
      out.chunked = true;
    } else if (name == "connection") {
      if (lists_token(value, "close")) out.keep_alive = false;
      if (lists_token(value, "keep-alive")) out.keep_alive = true;
    } else if (name == "expect") {
      if (lower(value) != "100-continue") return HeadError{417, "only Expect: 100-continue"};
      out.expect_continue = true;
    }
  }
  if (out.chunked && have_length) {
    return HeadError{400, "both Transfer-Encoding and Content-Length"};
  }
  return std::nullopt;
}

std::size_t ChunkedDecoder::feed(std::string_view in,
                                 const std::function<void(std::string_view)>& data) {
  constexpr std::size_t kMaxLine = 4096;  // a size line or a trailer field
  std::size_t at = 0;
  auto bad = [&](const char* why) {
    state_ = State::bad;
    error_ = why;
    return at;
  };
  while (at < in.size() && state_ != State::done && state_ != State::bad) {
    switch (state_) {
      case State::size: {
        const std::size_t eol = in.find("\r\n", at);
        if (eol == std::string_view::npos) {
          return in.size() - at > kMaxLine ? bad("a chunk size line is too long") : at;
        }
        const std::string_view line = in.substr(at, eol - at);
        unsigned long long n = 0;
        const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), n, 16);
        const std::string_view rest = line.substr(static_cast<std::size_t>(end - line.data()));
        if (ec != std::errc() || end == line.data() ||
            (!rest.empty() && rest[0] != ';' && rest[0] != ' ' && rest[0] != '\t')) {
          return bad("a malformed chunk size");
        }
        at = eol + 2;
        left_ = n;
        state_ = n == 0 ? State::trailer : State::data;
        break;
      }
      case State::data: {
        const std::size_t take =
            static_cast<std::size_t>(std::min<unsigned long long>(left_, in.size() - at));
        if (take > 0) data(in.substr(at, take));
        at += take;
        left_ -= take;
        if (left_ == 0) state_ = State::data_end;
        break;
      }
      case State::data_end:
        if (in.size() - at < 2) return at;
        if (in.substr(at, 2) != "\r\n") return bad("a chunk's data does not end with CRLF");
        at += 2;
        state_ = State::size;
        break;
      case State::trailer: {
        const std::size_t eol = in.find("\r\n", at);
        if (eol == std::string_view::npos) {
          return in.size() - at > kMaxLine ? bad("a trailer field is too long") : at;
        }
        state_ = eol == at ? State::done : State::trailer;
        at = eol + 2;
        break;
      }
      case State::done:
      case State::bad:
        break;
    }
  }
  return at;
}

const char* reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 206:
      return "Partial Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 410:
      return "Gone";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 416:
      return "Range Not Satisfiable";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string head(int status, std::string_view content_type, std::size_t content_length,
                 bool keep_alive, const std::vector<std::string>& extra) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
  if (!content_type.empty()) {
    out += "Content-Type: ";
    out += content_type;
    out += "\r\n";
  }
  out += "Content-Length: " + std::to_string(content_length) + "\r\n";
  for (const auto& line : extra) {
    out += line;
    out += "\r\n";
  }
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  return out;
}

std::string response(int status, std::string_view content_type, std::string_view body,
                     bool keep_alive, const std::vector<std::string>& extra) {
  std::string out = head(status, content_type, body.size(), keep_alive, extra);
  out += body;
  return out;
}

std::string stream_head(std::string_view content_type) {
  return "HTTP/1.1 200 OK\r\n"
         "Cache-Control: no-cache\r\n"
         "Content-Type: " +
         std::string(content_type) +
         "\r\n"
         "X-Accel-Buffering: no\r\n"
         "Transfer-Encoding: chunked\r\n\r\n";
}

std::string chunk(std::string_view data) {
  if (data.empty()) return {};
  char size[20];
  const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out;
  out.reserve(static_cast<std::size_t>(n) + data.size() + 2);
  out.append(size, static_cast<std::size_t>(n));
  out += data;
  out += "\r\n";
  return out;
}

}  // namespace sbx::agent::http
