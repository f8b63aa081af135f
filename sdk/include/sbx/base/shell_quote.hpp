// Quoting for POSIX shells (sh, dash, bash, busybox ash): one word a shell reads back unchanged,
// nothing in it expanded. For scripts that carry paths and arguments, and for the command line
// that stands for an argv (sbx_exec_request.command beside its argv, ABI 1.3). Layer-neutral
// (sbx::base). THREADING: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sbx::base {

// `text` in single quotes, a ' inside written as '\''.
inline std::string shell_quote(std::string_view text) {
  std::string out = "'";
  for (const char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// The words of `argv`, each quoted, separated by spaces: a command line that runs that argv.
inline std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& word : argv) {
    if (!out.empty()) out += ' ';
    out += shell_quote(word);
  }
  return out;
}

}  // namespace sbx::base
