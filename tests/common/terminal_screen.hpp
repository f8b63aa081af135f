// What a terminal's attachment (sbx.pty/1) has read, for tests: the bytes per stream, whether the
// offsets ran on without a gap, and bounded waits on the output.
#pragma once

#include <doctest/doctest.h>

#include <sbx/sbx.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::testing {

struct Screen {
  std::mutex mutex;
  std::condition_variable changed;
  std::string text;  // stdout (everything, on a TTY)
  std::string err;   // stderr, in pipe mode
  std::optional<uint64_t> first_offset;
  uint64_t next_offset = 0;
  bool in_order = true;

  // The attachment's on_output.
  std::function<void(sbx::OutputStream, uint64_t, std::string_view)> sink() {
    return [this](sbx::OutputStream stream, uint64_t offset, std::string_view bytes) {
      std::lock_guard lock(mutex);
      if (!first_offset)
        first_offset = offset;
      else if (offset != next_offset)
        in_order = false;
      next_offset = offset + bytes.size();
      (stream == sbx::OutputStream::err ? err : text).append(bytes);
      changed.notify_all();
    };
  }
  // True once stdout (or stderr) holds `needle`, within 30 s.
  bool wait_for(const std::string& needle, bool on_stderr = false) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(30), [&] {
      return (on_stderr ? err : text).find(needle) != std::string::npos;
    });
  }
};

// The error an attachment ended with, which must be an E (within 30 s).
template <class E>
E attach_error(sbx::Operation<int32_t>& op) {
  REQUIRE(op.wait_for(std::chrono::seconds(30)));
  try {
    op.get();
  } catch (const E& e) {
    return e;
  }
  FAIL("the attachment did not end with the expected error");
  throw;
}

}  // namespace sbx::testing
