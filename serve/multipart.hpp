// A multipart/form-data body (RFC 7578, RFC 2046's framing) read as it arrives, for POST
// /files/upload: the parts between the delimiters `\r\n--BOUNDARY`, each as its header block, its
// body in pieces and its end, handed to a Handler. Header-only and without dependencies, so that
// fuzz/serve_multipart.cpp builds it alone: the bytes are a client's.
//
// Bounded: between two calls it keeps at most a delimiter's worth of a part's body (the rest is
// handed on as it comes, a large read without being copied first), kMaxPartHeaders of a header
// block, kMaxPadding of a delimiter line's padding; a longer one is a malformed body.
//
// THREADING: a MultipartReader is used by one thread at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace sbx::serve {

class MultipartReader {
 public:
  static constexpr std::size_t kMaxPartHeaders = 16 * 1024;
  static constexpr std::size_t kMaxPadding = 256;  // after a delimiter, before its line break

  // What the reader finds, in order. Each call returns false to stop the reading.
  class Handler {
   public:
    // A part begins: its header lines, CRLF-separated, without the blank line that ends them.
    virtual bool begin_part(std::string_view headers) = 0;
    // The next bytes of the part's body (never empty).
    virtual bool part_bytes(std::string_view bytes) = 0;
    virtual bool end_part() = 0;

   protected:
    ~Handler() = default;
  };

  explicit MultipartReader(std::string_view boundary) : delimiter_("\r\n--") {
    delimiter_.append(boundary);
    kept_ = "\r\n";  // the first delimiter has no line break before it
  }

  // The body's next bytes. False once a handler said stop or the body is malformed (error() then
  // says why); nothing more is read after that.
  bool feed(std::string_view bytes, Handler& handler) {
    if (stopped_) return false;
    if (!in_body(bytes, handler)) kept_.append(bytes);
    if (!stopped_) parse(handler);
    return !stopped_;
  }

  // Whether the closing delimiter was read (what follows it, the epilogue, is ignored).
  bool ended() const { return phase_ == Phase::end; }
  // Why the body is malformed; empty when it is not.
  const std::string& error() const { return error_; }

 private:
  enum class Phase { preamble, after_delimiter, headers, body, end };

  bool stop() {
    stopped_ = true;
    return false;
  }
  bool malformed(std::string why) {
    error_ = std::move(why);
    return stop();
  }

  // Inside a part's body, a large read goes to the part as it is: only what may begin a delimiter
  // is kept. True when it took `bytes` (parse() then goes on from what it kept); false to leave
  // them all to parse().
  bool in_body(std::string_view bytes, Handler& handler) {
    const std::size_t d = delimiter_.size();
    if (phase_ != Phase::body || bytes.size() < 2 * d) return false;
    // A delimiter that begins in what was kept ends within the first d - 1 bytes.
    seam_.assign(kept_);
    seam_.append(bytes.substr(0, d - 1));
    if (const auto at = seam_.find(delimiter_); at != std::string::npos && at < kept_.size())
      return false;
    if (!kept_.empty() && !handler.part_bytes(kept_)) return stop();
    kept_.clear();
    const auto at = bytes.find(delimiter_);
    if (at == std::string_view::npos) {
      const std::size_t keep = d - 1;
      if (!handler.part_bytes(bytes.substr(0, bytes.size() - keep))) return stop();
      kept_.assign(bytes.substr(bytes.size() - keep));
      return true;
    }
    if (at > 0 && !handler.part_bytes(bytes.substr(0, at))) return stop();
    kept_.assign(bytes.substr(at));  // the delimiter, then the rest
    return true;
  }

  // Consumes what it can of kept_.
  void parse(Handler& handler) {
    while (!stopped_) {
      switch (phase_) {
        case Phase::preamble: {
          const auto at = kept_.find(delimiter_);
          if (at == std::string::npos) {
            if (kept_.size() > delimiter_.size()) kept_.erase(0, kept_.size() - delimiter_.size());
            return;
          }
          kept_.erase(0, at + delimiter_.size());
          phase_ = Phase::after_delimiter;
          break;
        }
        case Phase::after_delimiter: {
          if (kept_.size() < 2) return;
          if (kept_.compare(0, 2, "--") == 0) {
            phase_ = Phase::end;
            kept_.clear();
            return;
          }
          // The bounds hold however the body is cut: a line break seen past them, or none in
          // more than they allow (it could still start in the last byte), is too late.
          const auto eol = kept_.find("\r\n");
          if (eol == std::string::npos ? kept_.size() > kMaxPadding + 1 : eol > kMaxPadding)
            return void(malformed("malformed multipart body"));
          if (eol == std::string::npos) return;
          kept_.erase(0, eol + 2);  // transport padding, then the line break
          phase_ = Phase::headers;
          break;
        }
        case Phase::headers: {
          const auto end = kept_.find("\r\n\r\n");
          const bool none = kept_.compare(0, 2, "\r\n") == 0;
          if (!none && (end == std::string::npos ? kept_.size() > kMaxPartHeaders + 3
                                                 : end > kMaxPartHeaders))
            return void(malformed("a multipart part's headers are too long"));
          if (end == std::string::npos && !none) return;
          const std::string headers = none ? std::string() : kept_.substr(0, end);
          kept_.erase(0, none ? 2 : end + 4);
          if (!handler.begin_part(headers)) return void(stop());
          phase_ = Phase::body;
          break;
        }
        case Phase::body: {
          const auto at = kept_.find(delimiter_);
          if (at == std::string::npos) {
            // Keep what could be the start of a delimiter.
            const std::size_t keep = std::min(kept_.size(), delimiter_.size() - 1);
            const std::size_t give = kept_.size() - keep;
            if (give > 0 && !handler.part_bytes(std::string_view(kept_).substr(0, give)))
              return void(stop());
            kept_.erase(0, give);
            return;
          }
          if (at > 0 && !handler.part_bytes(std::string_view(kept_).substr(0, at)))
            return void(stop());
          kept_.erase(0, at + delimiter_.size());
          if (!handler.end_part()) return void(stop());
          phase_ = Phase::after_delimiter;
          break;
        }
        case Phase::end:
          kept_.clear();
          return;
      }
    }
  }

  std::string delimiter_;  // "\r\n--" BOUNDARY
  std::string kept_;       // bytes not consumed yet
  std::string seam_;       // in_body's scratch (kept_ and the next bytes' head), reused
  Phase phase_ = Phase::preamble;
  bool stopped_ = false;
  std::string error_;
};

}  // namespace sbx::serve
