#include "users.hpp"

#include "io.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <charconv>

#include <string_view>

namespace sbx::agent {

namespace {

// The lines of a file (empty when it cannot be read).
std::vector<std::string> read_lines(const std::string& path) {
  const std::string text = read_file(path, 64 * 1024 * 1024).value_or("");
  std::vector<std::string> lines;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return lines;
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  for (;;) {
    const std::size_t end = line.find(sep, pos);
    out.push_back(line.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) return out;
    pos = end + 1;
  }
}

std::optional<uint32_t> number(std::string_view s) {
  uint32_t n = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return n;
}

struct PasswdEntry {
  std::string name;
  uid_t uid;
  gid_t gid;
  std::string home;
};

// The first passwd entry matching `name` (when non-empty) or `uid`.
std::optional<PasswdEntry> find_passwd(const std::string& etc_dir, const std::string& name,
                                       uid_t uid) {
  for (const std::string& line : read_lines(etc_dir + "/passwd")) {
    if (line.empty() || line[0] == '#') continue;
    const auto f = split(line, ':');
    if (f.size() < 7) continue;
    const auto u = number(f[2]);
    const auto g = number(f[3]);
    if (!u || !g) continue;
    if (name.empty() ? *u == uid : f[0] == name) return PasswdEntry{f[0], *u, *g, f[5]};
  }
  return std::nullopt;
}

// The groups listing `name` as a member, and `primary`.
std::vector<gid_t> groups_of(const std::string& etc_dir, const std::string& name, gid_t primary) {
  std::vector<gid_t> out{primary};
  if (name.empty()) return out;
  for (const std::string& line : read_lines(etc_dir + "/group")) {
    if (line.empty() || line[0] == '#') continue;
    const auto f = split(line, ':');
    if (f.size() < 4) continue;
    const auto g = number(f[2]);
    if (!g) continue;
    const auto members = split(f[3], ',');
    if (std::find(members.begin(), members.end(), name) != members.end() &&
        std::find(out.begin(), out.end(), *g) == out.end())
      out.push_back(*g);
  }
  return out;
}

Identity from_entry(const std::string& etc_dir, const PasswdEntry& e) {
  Identity id;
  id.uid = e.uid;
  id.gid = e.gid;
  id.name = e.name;
  id.home = e.home.empty() ? "/" : e.home;
  id.groups = groups_of(etc_dir, e.name, e.gid);
  return id;
}

}  // namespace

std::optional<Identity> resolve_user(const std::string& etc_dir, const std::string& user,
                                     std::string& error) {
  if (const auto uid = number(user)) return resolve_uid(etc_dir, *uid, std::nullopt);
  if (user.empty() || user.find(':') != std::string::npos) {
    error = "invalid user: " + user;
    return std::nullopt;
  }
  const auto entry = find_passwd(etc_dir, user, 0);
  if (!entry) {
    error = "unknown user " + user + " (not in " + etc_dir + "/passwd)";
    return std::nullopt;
  }
  return from_entry(etc_dir, *entry);
}

Identity resolve_uid(const std::string& etc_dir, uid_t uid, std::optional<gid_t> gid) {
  Identity id;
  if (const auto entry = find_passwd(etc_dir, "", uid)) {
    id = from_entry(etc_dir, *entry);
  } else {
    id.uid = uid;
    id.gid = 0;
    id.groups = {0};
  }
  if (gid) {
    id.gid = *gid;
    if (std::find(id.groups.begin(), id.groups.end(), *gid) == id.groups.end())
      id.groups.insert(id.groups.begin(), *gid);
  }
  return id;
}

std::optional<gid_t> resolve_group(const std::string& etc_dir, const std::string& group,
                                   std::string& error) {
  if (const auto gid = number(group)) return *gid;
  if (group.empty() || group.find(':') != std::string::npos) {
    error = "invalid group: " + group;
    return std::nullopt;
  }
  for (const std::string& line : read_lines(etc_dir + "/group")) {
    if (line.empty() || line[0] == '#') continue;
    const auto f = split(line, ':');
    if (f.size() < 3 || f[0] != group) continue;
    if (const auto g = number(f[2])) return *g;
  }
  error = "unknown group " + group + " (not in " + etc_dir + "/group)";
  return std::nullopt;
}

}  // namespace sbx::agent
