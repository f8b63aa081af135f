// How a sandbox that already exists is named on the command line (docs/decisions.md, 62), for
// the commands that connect to one (exec, cp, status, pause, resume, close):
//
//   {...}    a descriptor, the JSON text `sbx create --json` prints
//   @FILE    a file holding a descriptor; @- reads it from standard input
//   ID       anything else: a sandbox id, handed to the provider as {"sandbox_id": "ID"}
//            (enough for local_docker, which finds the container by its id; a provider that needs
//            more says so when it refuses, and then the descriptor is the way)
//
// and `sbx cp`'s two sides: one of them is SANDBOX:PATH (SANDBOX as above, so `{...}:PATH`,
// `@FILE:PATH` or `ID:PATH`), the other a local path. An argument is a sandbox side when it starts
// with '{' or '@', or holds a ':' and does not start with '/' or '.' (write `./a:b` for a local
// file whose name has a colon), as `docker cp` decides.
#pragma once

#include "args.hpp"

#include <string>

namespace sbx::cli {

// A sandbox named on the command line.
struct SandboxRef {
  std::string descriptor;  // JSON text for Provider::connect
  std::string id;          // the descriptor's sandbox_id, for messages
};

// Reads a sandbox argument (an id, a descriptor or @FILE). Throws UsageError for an empty id, a
// file that cannot be read, or a descriptor that is not a JSON object with a string sandbox_id.
SandboxRef sandbox_ref(const Arg& arg);

// What `sbx cp SOURCE TARGET` copies.
struct CopyPaths {
  bool upload = false;  // true: local file into the sandbox; false: sandbox file out
  std::string local;
  SandboxRef sandbox;
  std::string remote;
};

// Splits cp's arguments. A local target that is a directory gets the remote file's name; a
// remote target ending in '/' gets the local file's name. Throws UsageError when both or neither
// side is in a sandbox, or a sandbox side has no path after its ':'.
CopyPaths copy_paths(const std::string& source, const std::string& target);

}  // namespace sbx::cli
