// Registry (registry.hpp), and the registry's lookups and the TTL (state.hpp): a sandbox whose
// expiry has passed is answered as unknown and closed in the background, as the real server's TTL
// timer kills and removes the container. The sweep (server.cpp runs retire_expired every second)
// closes those nobody asks for.

#include "registry.hpp"

#include "state.hpp"

#include <spdlog/spdlog.h>

namespace sbx::serve {

namespace {

bool expired_at(const Entry& entry, Registry::TimePoint now) {
  return entry.expires_at && *entry.expires_at <= now;
}

}  // namespace

void Registry::insert(std::shared_ptr<Entry> entry) {
  std::lock_guard lock(mutex_);
  auto& slot = sandboxes_[entry->id];
  slot = std::move(entry);
}

std::shared_ptr<Entry> Registry::find(const std::string& id) const {
  std::lock_guard lock(mutex_);
  const auto it = sandboxes_.find(id);
  return it == sandboxes_.end() ? nullptr : it->second;
}

Registry::Lookup Registry::lookup(const std::string& id, TimePoint now) const {
  std::lock_guard lock(mutex_);
  const auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return {};
  return {it->second, expired_at(*it->second, now)};
}

bool Registry::take(const std::shared_ptr<Entry>& entry) {
  std::lock_guard lock(mutex_);
  const auto it = sandboxes_.find(entry->id);
  if (it == sandboxes_.end() || it->second != entry) return false;
  sandboxes_.erase(it);
  return true;
}

std::shared_ptr<Entry> Registry::take(const std::string& id) {
  std::lock_guard lock(mutex_);
  const auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return nullptr;
  auto entry = std::move(it->second);
  sandboxes_.erase(it);
  return entry;
}

std::vector<std::shared_ptr<Entry>> Registry::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<Entry>> out;
  out.reserve(sandboxes_.size());
  for (const auto& [id, entry] : sandboxes_)
    out.push_back(entry);
  return out;
}

std::vector<std::shared_ptr<Entry>> Registry::expired(TimePoint now) const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<Entry>> out;
  for (const auto& [id, entry] : sandboxes_)
    if (expired_at(*entry, now)) out.push_back(entry);
  return out;
}

std::size_t Registry::count() const {
  std::lock_guard lock(mutex_);
  return sandboxes_.size();
}

bool Registry::set_box_if_held(const std::shared_ptr<Entry>& entry,
                               std::shared_ptr<sbx::Sandbox>& box) {
  std::lock_guard lock(mutex_);
  const auto it = sandboxes_.find(entry->id);
  if (it == sandboxes_.end() || it->second != entry) return false;
  entry->set_box(std::move(box));  // Entry's box mutex, under this one (registry.hpp)
  return true;
}

std::optional<Registry::TimePoint> Registry::expires_at(const Entry& entry) const {
  std::lock_guard lock(mutex_);
  return entry.expires_at;
}

bool Registry::renew(const std::shared_ptr<Entry>& entry, TimePoint expires_at) {
  std::lock_guard lock(mutex_);
  const auto it = sandboxes_.find(entry->id);
  if (it == sandboxes_.end() || it->second != entry) return false;
  entry->expires_at = expires_at;
  return true;
}

std::variant<uint64_t, Registry::Refusal> Registry::begin_create(std::size_t cap) {
  std::lock_guard lock(mutex_);
  if (closed_) return Refusal::closed;
  if (cap != 0 && sandboxes_.size() + creating_.size() >= cap) return Refusal::full;
  const uint64_t ticket = next_ticket_++;
  creating_[ticket];  // counted before it starts: the cap counts it
  return ticket;
}

bool Registry::set_create_op(uint64_t ticket, const sbx::Operation<sbx::Sandbox>& op) {
  std::lock_guard lock(mutex_);
  const auto it = creating_.find(ticket);
  if (it == creating_.end()) return false;
  it->second = op;
  return closed_;  // closed before the operation was known: close() could not cancel it
}

bool Registry::end_create(uint64_t ticket, std::shared_ptr<Entry> entry) {
  std::lock_guard lock(mutex_);
  creating_.erase(ticket);
  if (!entry) return true;
  if (closed_) return false;
  auto& slot = sandboxes_[entry->id];
  slot = std::move(entry);
  return true;
}

std::optional<Registry::Closed> Registry::close(bool keep) {
  std::lock_guard lock(mutex_);
  if (closed_) return std::nullopt;
  closed_ = true;
  Closed out;
  for (auto& [id, entry] : sandboxes_) {
    if (keep) {
      // Left running, its state file kept for the next server; detached once run() returned
      // (~Server), when no request can be using it.
      kept_.push_back(entry);
      ++out.kept;
    } else {
      out.to_close.push_back(entry);
    }
  }
  sandboxes_.clear();
  for (auto& [ticket, op] : creating_)
    if (op.valid()) out.creates.push_back(op);
  return out;
}

std::vector<std::shared_ptr<Entry>> Registry::kept() const {
  std::lock_guard lock(mutex_);
  return kept_;
}

void retire(const std::shared_ptr<Server::State>& state, const std::shared_ptr<Entry>& entry,
            const char* why) {
  // Counted as a close before it leaves the registry, so a stop always finds it in one (state.hpp).
  state->gate.begin_close();
  if (!state->registry.take(entry)) {  // someone else took it
    state->gate.end_close();
    return;
  }
  spdlog::info("sbx serve: closing sandbox {} ({})", entry->id, why);
  store_remove(*state, *entry);
  begin_close(state, entry, [](std::exception_ptr) {});
}

std::shared_ptr<Entry> find_live(const std::shared_ptr<Server::State>& state,
                                 const std::string& id) {
  const auto found = state->registry.lookup(id, std::chrono::system_clock::now());
  if (!found.entry || !found.expired) return found.entry;
  retire(state, found.entry, "its TTL passed");
  return nullptr;
}

void retire_expired(const std::shared_ptr<Server::State>& state) {
  if (state->gate.stopping()) return;
  for (const auto& entry : state->registry.expired(std::chrono::system_clock::now()))
    retire(state, entry, "its TTL passed");
}

}  // namespace sbx::serve
