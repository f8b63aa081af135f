// The registry's lookups and the TTL (state.hpp): a sandbox whose expiry has passed is answered
// as unknown and closed in the background, as the real server's TTL timer kills and removes the
// container. The sweep (server.cpp runs retire_expired every second) closes those nobody asks for.

#include "state.hpp"

#include <spdlog/spdlog.h>

namespace sbx::serve {

void retire(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
            const char* why) {
  {
    std::lock_guard lock(state->mutex);
    const auto it = state->sandboxes.find(entry->id);
    if (it == state->sandboxes.end() || it->second != entry) return;  // someone else took it
    state->sandboxes.erase(it);
    ++state->closing;
  }
  spdlog::info("sbx serve: closing sandbox {} ({})", entry->id, why);
  store_remove(*state, *entry);
  begin_close(state, entry, [](std::exception_ptr) {});
}

std::shared_ptr<Entry> find_live(const std::shared_ptr<Server::State>& state,
                                 const std::string& id) {
  std::shared_ptr<Entry> entry;
  bool expired = false;
  {
    std::lock_guard lock(state->mutex);
    const auto it = state->sandboxes.find(id);
    if (it == state->sandboxes.end()) return nullptr;
    entry = it->second;
    expired = entry->expires_at && *entry->expires_at <= std::chrono::system_clock::now();
  }
  if (!expired) return entry;
  retire(state, entry, "its TTL passed");
  return nullptr;
}

void retire_expired(const std::shared_ptr<Server::State>& state) {
  std::vector<std::shared_ptr<Entry>> expired;
  {
    std::lock_guard lock(state->mutex);
    if (state->stopping) return;
    const auto now = std::chrono::system_clock::now();
    for (const auto& [id, entry] : state->sandboxes) {
      if (entry->expires_at && *entry->expires_at <= now) expired.push_back(entry);
    }
  }
  for (const auto& entry : expired)
    retire(state, entry, "its TTL passed");
}

}  // namespace sbx::serve
