// Line mode of GET /files/download (newer execd's `offset` and `limit`): the lines wanted, cut
// from a file's bytes as they stream from the sandbox. Header-only and without dependencies, so
// that fuzz/serve_line_cutter.cpp builds it alone: the bytes are the sandbox's.
//
// THREADING: a LineCutter is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

namespace sbx::serve {

// `offset` (1-based, default 1) and `limit` (default: to the end) select whole lines; each keeps
// its newline, a last line without one comes as it is.
struct LineSlice {
  uint64_t offset = 1;
  std::optional<uint64_t> limit;
};

// The lines a LineSlice selects, cut from a file's bytes as they pass: each call gives the part of
// `bytes` inside them (a view into `bytes`); done() once the last one wanted has passed. Keeps no
// byte: its memory is three counters, whatever the file.
class LineCutter {
 public:
  explicit LineCutter(const LineSlice& slice)
      : offset_(slice.offset),
        // The first line not wanted; 0: none (no limit, or past uint64: no file has that many).
        stop_(slice.limit && *slice.limit <= std::numeric_limits<uint64_t>::max() - slice.offset
                  ? slice.offset + *slice.limit
                  : 0) {}

  std::string_view cut(std::string_view bytes) {
    std::size_t from = line_ >= offset_ ? 0 : bytes.size();
    std::size_t to = bytes.size();
    for (std::size_t at = 0; !done() && at < bytes.size();) {
      const auto nl = bytes.find('\n', at);
      if (nl == std::string_view::npos) break;
      at = nl + 1;
      ++line_;
      if (line_ == offset_) from = at;
      if (stop_ != 0 && line_ == stop_) to = at;
    }
    if (from >= to) return {};
    return bytes.substr(from, to - from);
  }
  bool done() const { return stop_ != 0 && line_ >= stop_; }

 private:
  uint64_t offset_;
  uint64_t stop_;
  uint64_t line_ = 1;  // the line the next byte belongs to
};

}  // namespace sbx::serve
