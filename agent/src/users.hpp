// Users and groups of the root the agent runs in, read from its /etc/passwd and /etc/group (never
// through NSS: the agent is static and must work in any image). Pure file reading; reentrant.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace sbx::agent {

/// Who a command runs as: a value type, owned by the command being started.
struct Identity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  ///< supplementary groups (the primary group included)
  std::string name;           ///< the passwd name, empty when the uid has no entry
  std::string home = "/";     ///< the passwd home directory, "/" without an entry
};

/// Resolves `user` (a name, or a decimal uid) against `etc_dir`/passwd and `etc_dir`/group. A uid
/// without a passwd entry runs with gid 0 and no other groups (as Docker's `--user N` does); a
/// name without an entry is an error (nullopt, `error` says why). Reads the files on each call;
/// reentrant, owns nothing.
std::optional<Identity> resolve_user(const std::string& etc_dir, const std::string& user,
                                     std::string& error);

/// Resolves a numeric `uid` and optional `gid` (execd's fields): the passwd entry's name, home and
/// groups when it has one; `gid` replaces the primary group. Never fails. Reentrant.
Identity resolve_uid(const std::string& etc_dir, uid_t uid, std::optional<gid_t> gid);

/// Resolves `group` (a name, or a decimal gid) against `etc_dir`/group: a gid is taken as given
/// (with or without an entry); a name without an entry is an error (nullopt, `error` says why).
/// Reads the file on each call; reentrant, owns nothing.
std::optional<gid_t> resolve_group(const std::string& etc_dir, const std::string& group,
                                   std::string& error);

}  // namespace sbx::agent
