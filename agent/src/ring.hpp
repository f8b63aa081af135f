// The output a PTY session keeps for replay: the last `capacity` bytes of a stream, addressed by
// absolute offsets (bytes since the session started). A value type owned by its session; used on
// the loop's thread. Header-only; pure.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sbx::agent {

class Ring {
 public:
  explicit Ring(std::size_t capacity) : cap_(capacity) {}

  /// Appends `data`; beyond the capacity the oldest bytes are dropped.
  void append(std::string_view data) {
    total_ += data.size();
    if (data.size() >= cap_) {
      buf_.assign(data.substr(data.size() - cap_));
      head_ = 0;
      return;
    }
    if (buf_.size() < cap_) {  // still filling: plain appends, then wrap
      const std::size_t take = std::min(cap_ - buf_.size(), data.size());
      buf_.append(data.substr(0, take));
      data.remove_prefix(take);
    }
    while (!data.empty()) {  // full: overwrite the oldest from head_
      const std::size_t take = std::min(cap_ - head_, data.size());
      buf_.replace(head_, take, data.substr(0, take));
      head_ = (head_ + take) % cap_;
      data.remove_prefix(take);
    }
  }

  /// Every byte ever appended (the next byte's offset).
  uint64_t end() const { return total_; }
  /// The offset of the oldest byte kept.
  uint64_t begin() const { return total_ - buf_.size(); }

  /// The kept bytes from offset `from` (clamped to begin()) to end(), at most `max` of them.
  std::string read(uint64_t from, std::size_t max) const {
    from = std::max(from, begin());
    if (from >= total_) return {};
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(total_ - from, max));
    // Index of `from` in buf_: the oldest byte is at head_ once the buffer is full.
    const std::size_t rel = static_cast<std::size_t>(from - begin());
    const std::size_t start = buf_.size() < cap_ ? rel : (head_ + rel) % cap_;
    std::string out;
    out.reserve(n);
    const std::size_t first = std::min(n, buf_.size() - start);
    out.append(buf_, start, first);
    out.append(buf_, 0, n - first);
    return out;
  }

 private:
  std::size_t cap_;
  std::string buf_;
  std::size_t head_ = 0;  // when full: where the oldest byte is (and the next write goes)
  uint64_t total_ = 0;
};

}  // namespace sbx::agent
