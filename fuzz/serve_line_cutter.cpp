// Fuzz target: sbx serve's line mode of a download (serve/line_cutter.hpp), over a file's bytes as
// a sandbox streams them. The input's first two bytes choose the slice (offset 1..16, a limit of
// 0..15 lines or none), the third how the rest is split into pieces; the lines cut piece by piece
// must be the lines a whole-file reading selects.
#include "line_cutter.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace {

// The slice's lines of `file`, read whole.
std::string reference(std::string_view file, const sbx::serve::LineSlice& slice) {
  std::string out;
  uint64_t line = 1;
  for (std::size_t at = 0; at < file.size();) {
    const auto nl = file.find('\n', at);
    const std::size_t end = nl == std::string_view::npos ? file.size() : nl + 1;
    const bool wanted =
        line >= slice.offset && (!slice.limit || line < slice.offset + *slice.limit);
    if (wanted) out.append(file.substr(at, end - at));
    at = end;
    ++line;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  sbx::serve::LineSlice slice;
  slice.offset = 1 + data[0] % 16;
  if (data[1] & 0x80) slice.limit = data[1] % 16;
  const std::size_t piece = 1 + data[2] % 64;
  const std::string_view file(reinterpret_cast<const char*>(data) + 3, size - 3);

  sbx::serve::LineCutter cutter(slice);
  std::string got;
  for (std::size_t at = 0; at < file.size() && !cutter.done(); at += piece) {
    const std::string_view bytes = file.substr(at, piece);
    const std::string_view part = cutter.cut(bytes);
    // A view into the piece given, never past it.
    if (!part.empty() &&
        (part.data() < bytes.data() || part.data() + part.size() > bytes.data() + bytes.size()))
      __builtin_trap();
    got.append(part);
  }
  if (got != reference(file, slice)) __builtin_trap();
  return 0;
}
