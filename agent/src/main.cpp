// sbx-agent: the command line (agent/README.md). Parses the options and runs the loop.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "agent.hpp"
#include "io.hpp"

namespace {

constexpr const char* kUsage =
    "usage: sbx-agent --listen unix:PATH|tcp:HOST:PORT [--listen ...] [--token-file PATH]\n"
    "                 [--state-dir DIR] [--etc-dir DIR] [--shell PATH] [--ping-ms MS]\n"
    "                 [--workdir DIR] [--expires-at SECONDS] [--expiry-file PATH]\n"
    "                 [--stop-grace-ms MS] [--user USER[:GROUP]] [-- PROGRAM [ARG...]]\n"
    "Serves the execd API of the OpenSandbox protocol (agent/README.md). The token is read from\n"
    "--token-file, else from the environment variable SBX_AGENT_TOKEN; without one, no check.\n"
    "After --, the entrypoint: started as the agent's child (as --user), sent the signals the\n"
    "agent gets; the agent exits with its exit code. At the expiry (Unix seconds, or what the\n"
    "expiry file holds) the agent stops, or sends the entrypoint SIGTERM, then SIGKILL.\n";

// A whole decimal number (no sign, space or suffix) that fits in int64_t.
bool parse_number(const char* text, int64_t& out) {
  const char* end = text + std::strlen(text);
  if (text == end || *text < '0' || *text > '9') return false;
  const auto [p, ec] = std::from_chars(text, end, out);
  return ec == std::errc() && p == end;
}

bool read_token(const std::string& path, std::string& token) {
  const std::optional<std::string> text = sbx::agent::read_file(path, 64 * 1024);
  if (!text) return false;
  token = *text;
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' '))
    token.pop_back();
  return true;
}

// fds 0, 1 and 2 open, so that no pipe or socket of the agent can take their numbers (the child's
// dup2 onto 1 and 2 relies on that).
void ensure_std_fds() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) continue;
    int n = ::open("/dev/null", O_RDWR);
    if (n < 0) {
      int p[2];
      if (::pipe(p) != 0) continue;
      n = fd == 0 ? p[0] : p[1];
      ::close(fd == 0 ? p[1] : p[0]);
    }
    if (n != fd) {
      ::dup2(n, fd);
      ::close(n);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ensure_std_fds();
  sbx::agent::Options options;
  std::string token_file;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "sbx-agent: %s needs a value\n%s", name, kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--listen") {
      options.listen.emplace_back(value("--listen"));
    } else if (arg == "--token-file") {
      token_file = value("--token-file");
    } else if (arg == "--state-dir") {
      options.state_dir = value("--state-dir");
    } else if (arg == "--etc-dir") {
      options.etc_dir = value("--etc-dir");
    } else if (arg == "--workdir") {
      options.workdir = value("--workdir");
    } else if (arg == "--shell") {
      options.shell = value("--shell");
    } else if (arg == "--ping-ms") {
      if (!parse_number(value("--ping-ms"), options.ping_ms) || options.ping_ms <= 0) {
        std::fprintf(stderr, "sbx-agent: --ping-ms takes a positive number of milliseconds\n");
        return 2;
      }
    } else if (arg == "--expires-at") {
      if (!parse_number(value("--expires-at"), options.expires_at) || options.expires_at <= 0) {
        std::fprintf(stderr, "sbx-agent: --expires-at takes a positive number of Unix seconds\n");
        return 2;
      }
    } else if (arg == "--expiry-file") {
      options.expiry_file = value("--expiry-file");
    } else if (arg == "--expiry-poll-ms") {  // for tests; not in the usage
      if (!parse_number(value("--expiry-poll-ms"), options.expiry_poll_ms) ||
          options.expiry_poll_ms <= 0) {
        std::fprintf(stderr,
                     "sbx-agent: --expiry-poll-ms takes a positive number of milliseconds\n");
        return 2;
      }
    } else if (arg == "--stop-grace-ms") {
      if (!parse_number(value("--stop-grace-ms"), options.stop_grace_ms)) {
        std::fprintf(stderr, "sbx-agent: --stop-grace-ms takes a number of milliseconds\n");
        return 2;
      }
    } else if (arg == "--user") {
      options.user = value("--user");
      if (options.user.empty()) {
        std::fprintf(stderr, "sbx-agent: --user takes USER[:GROUP]\n");
        return 2;
      }
    } else if (arg == "--") {
      options.entrypoint.assign(argv + i + 1, argv + argc);
      if (options.entrypoint.empty()) {
        std::fprintf(stderr, "sbx-agent: -- must be followed by the entrypoint's program\n");
        return 2;
      }
      break;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "sbx-agent: unknown argument '%s'\n%s", argv[i], kUsage);
      return 2;
    }
  }
  if (!options.user.empty() && options.entrypoint.empty()) {
    std::fprintf(stderr, "sbx-agent: --user is who the entrypoint runs as: it needs -- PROGRAM\n");
    return 2;
  }
  if (!token_file.empty()) {
    if (!read_token(token_file, options.token) || options.token.empty()) {
      std::fprintf(stderr, "sbx-agent: cannot read a token from %s: %s\n", token_file.c_str(),
                   errno ? std::strerror(errno) : "empty");
      return 2;
    }
  } else if (const char* env = std::getenv("SBX_AGENT_TOKEN"); env && *env) {
    options.token = env;
  }
  return sbx::agent::run(options);
}
