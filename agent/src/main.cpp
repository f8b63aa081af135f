// sbx-agent: the command line (agent/README.md). Parses the options and runs the loop.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "agent.hpp"

namespace {

constexpr const char* kUsage =
    "usage: sbx-agent --listen unix:PATH|tcp:HOST:PORT [--listen ...] [--token-file PATH]\n"
    "                 [--state-dir DIR] [--etc-dir DIR] [--shell PATH] [--ping-ms MS]\n"
    "                 [--workdir DIR]\n"
    "Serves the execd API of the OpenSandbox protocol (agent/README.md). The token is read from\n"
    "--token-file, else from the environment variable SBX_AGENT_TOKEN; without one, no check.\n";

bool read_token(const std::string& path, std::string& token) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    token.append(buf, static_cast<std::size_t>(n));
    if (token.size() > 64 * 1024) break;
  }
  ::close(fd);
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
      char* end = nullptr;
      const char* text = value("--ping-ms");
      options.ping_ms = std::strtoll(text, &end, 10);
      if (*end != '\0' || options.ping_ms <= 0) {
        std::fprintf(stderr, "sbx-agent: --ping-ms takes a positive number of milliseconds\n");
        return 2;
      }
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "sbx-agent: unknown argument '%s'\n%s", argv[i], kUsage);
      return 2;
    }
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
