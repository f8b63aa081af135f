// `sbx serve --watch` (docs/hot-swap.md): a change to the config file, to a plugin file the config
// names, or to a `.so` in a plugin directory starts a reload, as SIGHUP does.
//
// inotify (the descriptor made by the server's constructor), read on the server's io_context on a
// strand of its own (no thread). Each path is watched through its directory, so that a file
// replaced by a rename (how a deploy should replace a plugin) is seen: IN_CLOSE_WRITE (written in
// place) and IN_MOVED_TO (renamed over). A burst of changes (a copy, then a rename; several files)
// settles for Watcher::kSettle before the one reload it starts. After every reload put in service
// (from any source) the watches are updated from Admin::watched, in place: a directory still
// wanted keeps its watch, so no event queued meanwhile is lost.

#include "state.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <utility>

namespace sbx::serve {

namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

class Watcher : public std::enable_shared_from_this<Watcher> {
 public:
  static constexpr std::chrono::milliseconds kSettle{300};

  Watcher(std::shared_ptr<Server::State> state, int fd)
      : state_(std::move(state)),
        strand_(asio::make_strand(state_->ioc)),
        fd_(strand_, fd),
        settle_(strand_) {}

  asio::strand<asio::io_context::executor_type> executor() const { return strand_; }

  // Everything below runs on the watcher's strand.
  void start() {
    arm();
    read();
  }

  // Watches the directory of every path Admin::watched gives; drops the watches no longer wanted.
  // inotify_add_watch on a directory watched already returns its descriptor again.
  void arm() {
    std::map<fs::path, Dir> wanted;
    std::error_code ec;
    const fs::path temp = fs::temp_directory_path(ec);
    for (const fs::path& path : state_->options.admin->watched()) {
      const bool is_dir = fs::is_directory(path, ec);
      if (!is_dir && !fs::is_directory(path.parent_path(), ec)) continue;  // nothing to watch yet
      const fs::path dir_path = is_dir ? path : path.parent_path();
      Dir& dir = wanted[dir_path];
      dir.path = dir_path;
      if (!is_dir) {
        dir.names.insert(path.filename().string());
      } else if (dir_path != temp) {  // a reload copies plugins there: they must not count
        dir.any_plugin = true;
      }
    }
    std::map<int, Dir> next;
    std::string list;
    for (auto& [path, dir] : wanted) {
      const int wd = inotify_add_watch(fd_.native_handle(), path.c_str(),
                                       IN_CLOSE_WRITE | IN_MOVED_TO | IN_ONLYDIR);
      if (wd < 0) {
        spdlog::warn("sbx serve: --watch: cannot watch {}: {}", path.string(),
                     std::strerror(errno));
        continue;
      }
      list += (list.empty() ? "" : ", ") + path.string();
      next[wd] = std::move(dir);
    }
    for (const auto& [wd, dir] : dirs_)
      if (!next.count(wd)) inotify_rm_watch(fd_.native_handle(), wd);
    dirs_ = std::move(next);
    spdlog::info("sbx serve: --watch: watching {}", list.empty() ? "nothing" : list);
  }

 private:
  struct Dir {
    fs::path path;
    bool any_plugin = false;      // a plugin directory: any *.so counts
    std::set<std::string> names;  // files named in it
  };

  bool relevant(int wd, std::string_view name) const {
    const auto it = dirs_.find(wd);
    if (it == dirs_.end()) return false;
    return it->second.names.count(std::string(name)) ||
           (it->second.any_plugin && name.ends_with(".so"));
  }

  void read() {
    fd_.async_read_some(asio::buffer(buffer_),
                        [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                          if (ec) {
                            if (ec != asio::error::operation_aborted) {
                              spdlog::error("sbx serve: --watch stopped: {}", ec.message());
                            }
                            return;
                          }
                          self->on_events(n);
                          self->read();
                        });
  }

  void on_events(std::size_t n) {
    std::string changed;
    for (std::size_t at = 0; at + sizeof(inotify_event) <= n;) {
      inotify_event event;
      std::memcpy(&event, buffer_ + at, sizeof event);
      const std::string_view name(buffer_ + at + sizeof event,
                                  ::strnlen(buffer_ + at + sizeof event, event.len));
      if (event.mask & IN_Q_OVERFLOW) changed = "(events lost)";
      if (event.len > 0 && relevant(event.wd, name)) {
        changed = (dirs_.at(event.wd).path / std::string(name)).string();
      }
      at += sizeof event + event.len;
    }
    if (changed.empty()) return;
    spdlog::info("sbx serve: --watch: {} changed; reloading in {} ms unless more changes come",
                 changed, kSettle.count());
    settle_.expires_after(kSettle);
    settle_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return;  // a later change moved the reload on
      if (self->state_->gate.stopping()) return;
      start_reload(self->state_, std::nullopt, nullptr);
    });
  }

  std::shared_ptr<Server::State> state_;
  asio::strand<asio::io_context::executor_type> strand_;
  asio::posix::stream_descriptor fd_;
  asio::steady_timer settle_;
  std::map<int, Dir> dirs_;  // by watch descriptor
  alignas(inotify_event) char buffer_[16 * 1024];
};

}  // namespace

void start_watch(const std::shared_ptr<Server::State>& state) {
  auto watcher = std::make_shared<Watcher>(state, std::exchange(state->watch_fd, -1));
  {
    // Every reload put in service updates the watches (a reload may name other files). The hook
    // holds the watcher weakly: it goes with the io_context's handlers.
    std::lock_guard lock(state->admin_queue.mutex);
    state->admin_queue.on_reloaded = [weak = std::weak_ptr<Watcher>(watcher)] {
      if (auto w = weak.lock()) asio::post(w->executor(), [w] { w->arm(); });
    };
  }
  asio::post(watcher->executor(), [watcher] { watcher->start(); });
}

}  // namespace sbx::serve
