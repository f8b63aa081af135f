// The TTL reaper: one container per Docker daemon, named sbx-reaper, that lives as long as the
// daemon does (restart policy unless-stopped) and force-removes every sandbox whose sbx.expires_at
// has passed, in any state. The in-container TTL watchdog cannot end a container that never
// started (its host died between create and start), and AutoRemove never fires for one; the reaper
// does. Its program (reaper/sbx_reaper.cpp) is embedded in this plugin and imported as the image
// sbx-local-docker-reaper:<content hash>, with no network.
#pragma once

#include "config.hpp"
#include "docker_api.hpp"

#include <sbx/sdk/cancel.hpp>
#include <sbx/sdk/log.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>

namespace sbx::local_docker {

inline constexpr std::string_view kReaperContainer = "sbx-reaper";
// Label of the reaper container: the content hash of its program. Not sbx.sandbox: the reaper is
// not a sandbox (list/reap and leak counts ignore it).
inline constexpr std::string_view kReaperLabel = "sbx.reaper";
inline constexpr std::string_view kReaperRepository = "sbx-local-docker-reaper";

// The embedded program's bytes and its content hash (16 hex digits of its SHA-256).
std::string_view reaper_program() noexcept;
std::string_view reaper_hash() noexcept;

// Makes sure the reaper runs, once per provider instance.
// THREADING: thread-safe. The first caller does the work on its own thread (each request bounded
// by the request timeout); concurrent callers wait for it (cancellably) and then return; later
// calls return at once.
class Reaper {
 public:
  // `socket` is the daemon's socket on this host; it is bind-mounted into the reaper. `api` and
  // `log` must outlive the Reaper.
  Reaper(DockerApi& api, ReaperConfig config, std::string socket, const sdk::Logger& log);

  // Ensures the image and a running reaper container of this plugin's hash: imports the image when
  // missing, creates and starts the container, starts a stopped one, replaces a reaper of another
  // hash, and copes with other processes doing the same at the same time (409 on create). Throws
  // only Error::cancelled. Any other failure is logged once as a warning and ends the attempts of
  // this instance, except an unreachable daemon (the caller's own request fails too), which is
  // tried again by the next call.
  void ensure(const sdk::CancelToken& cancel);

 private:
  enum class State { idle, busy, done };

  void ensure_image(const sdk::CancelToken& cancel);
  void ensure_container(const sdk::CancelToken& cancel);
  void finish(State state);

  DockerApi& api_;
  ReaperConfig config_;
  std::string socket_;
  const sdk::Logger& log_;
  std::string image_;  // sbx-local-docker-reaper:<hash>
  std::atomic<bool> done_{false};
  std::atomic<bool> warned_{false};
  std::mutex mutex_;
  std::condition_variable_any changed_;
  State state_ = State::idle;  // guarded by mutex_
};

}  // namespace sbx::local_docker
