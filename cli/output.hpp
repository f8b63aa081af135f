// What `sbx` writes: a command's streamed output (run, exec), the exit status of its result, and
// text on stdout that must not be lost silently (docs/decisions.md, 41 and 43).
#pragma once

#include "stop.hpp"

#include <sbx/sbx.hpp>

#include <functional>
#include <string_view>

namespace sbx::cli {

// Writes all of `bytes` to a file descriptor (stdout/stderr of this process). Returns 0, or the
// errno of the write that failed (EPIPE when the reader has gone: SIGPIPE is ignored, see main).
int write_all(int fd, std::string_view bytes);

// An ExecOptions::on_output that writes the command's stdout and stderr to this process's as they
// arrive. The first write that fails stops the command through `interrupts`: EPIPE (nobody reads
// any more) with 141, any other error (a full disk) with 74 and a message. `interrupts` must
// outlive the exec.
std::function<void(sbx::OutputStream, std::string_view)> stream_output(Interrupts& interrupts);

// The exit status of an exec's result: its return code, or 125 with a message for one no exit
// status can carry; prints why the sandbox could not run the command (timeout, sandbox error).
int exit_status_of(const sbx::ExecResult& result);

}  // namespace sbx::cli
