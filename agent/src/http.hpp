// HTTP/1.1 request heads and responses for the agent: parsing a head already read whole, query
// strings, and writing responses and chunks. No I/O here; every function is pure and reentrant.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::agent::http {

/// One request head, parsed. A value type owned by its connection; used on the loop's thread.
struct Request {
  std::string method;
  std::string target;                                        ///< as sent: path and query
  std::string path;                                          ///< percent-decoded path
  std::vector<std::pair<std::string, std::string>> query;    ///< decoded, in order
  std::vector<std::pair<std::string, std::string>> headers;  ///< names lower-cased
  int minor_version = 1;                                     ///< HTTP/1.x
  std::size_t content_length = 0;
  bool chunked = false;          ///< Transfer-Encoding: chunked (taken by uploads only)
  bool keep_alive = true;        ///< the connection stays open after the response
  bool expect_continue = false;  ///< Expect: 100-continue
  std::string body;              ///< filled by the connection once read whole

  /// The first header named `name` (lower-case), or nullptr. Does not own.
  const std::string* header(std::string_view name) const;
  /// The first query parameter named `name`, or nullptr. Does not own.
  const std::string* query_value(std::string_view name) const;
};

/// Why a head could not be parsed: the status to answer and a message.
struct HeadError {
  int status = 400;
  std::string message;
};

/// Parses `head` (the bytes up to and including the blank line) into `out`. On failure returns the
/// status and message to answer with (the connection is then closed). Pure.
std::optional<HeadError> parse_head(std::string_view head, Request& out);

/// Decodes a chunked request body (RFC 9112, section 7.1) as it arrives; chunk extensions and
/// trailer fields are read and dropped. A value owned by its connection, used on the loop's thread.
class ChunkedDecoder {
 public:
  /// Consumes a prefix of `in`, passing the data it carries to `data` (views into `in`), and
  /// returns how many bytes it consumed; what it leaves is an incomplete size line, chunk end or
  /// trailer (feed it again with more) or what follows the body. Stops at the body's end or at a
  /// malformed chunk.
  std::size_t feed(std::string_view in, const std::function<void(std::string_view)>& data);
  bool done() const noexcept { return state_ == State::done; }
  /// Why the body is malformed, or nullptr while it is not.
  const char* error() const noexcept { return error_; }

 private:
  enum class State { size, data, data_end, trailer, done, bad };
  State state_ = State::size;
  unsigned long long left_ = 0;  // data bytes still due in the current chunk
  const char* error_ = nullptr;
};

/// Percent-decodes `s` (and '+' to a space when `plus_is_space`); nullopt on a bad escape. Pure.
std::optional<std::string> percent_decode(std::string_view s, bool plus_is_space);

/// The reason phrase of `status` ("OK", "Not Found", ...). Pure.
const char* reason(int status);

/// A whole response with a Content-Length body; `extra` lines are "Name: value" without CRLF. Pure.
std::string response(int status, std::string_view content_type, std::string_view body,
                     bool keep_alive, const std::vector<std::string>& extra = {});

/// The head of a response whose body of `content_length` bytes follows separately (a download).
/// Pure.
std::string head(int status, std::string_view content_type, std::size_t content_length,
                 bool keep_alive, const std::vector<std::string>& extra = {});

/// The head of a streamed response (chunked, as execd sends its event stream). Pure.
std::string stream_head(std::string_view content_type = "text/event-stream");

/// `data` framed as one chunk of a chunked body (nothing for empty data). Pure.
std::string chunk(std::string_view data);

/// The last chunk that ends a chunked body. Pure.
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace sbx::agent::http
