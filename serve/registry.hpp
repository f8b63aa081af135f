// The sandboxes the server holds (internal to serve): Registry, the one owner of the id → Entry
// map, of the sandboxes a stop left running (keep_on_stop), of the creates in flight and of the
// entries' expiries.
#pragma once

#include <sbx/core/sandbox.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace sbx::serve {

struct Entry;

// The registry of the sandboxes the server holds: by id, the ones a stop kept running
// (Options::keep_on_stop), the creates in flight (by ticket, with their provider operation) and
// each held entry's `expires_at`.
//
// THREADING: every member is thread-safe; each takes the registry's own mutex for its duration
// and returns copies (entries are shared_ptr: one taken stays usable after it left the registry).
// No member calls out while holding the mutex (no provider call, no callback, no StopGate call).
// Lock order: the mutex may be taken under an Entry's store_mutex (store_save reads the expiry),
// never under StopGate's; under it only an Entry's box mutex is taken (set_box_if_held).
//
// OWNERSHIP: owned by Server::State (one per server); holds the entries (shared with the requests
// using them) and copies of the creates' operations (for the stop to cancel them). What it holds
// is counted here only: the stop's and the closes' counting is StopGate's (state.hpp describes
// how the two are kept consistent).
//
// STOP: close() is the stop's step here, taken once: every held sandbox leaves (to be closed, or
// kept with keep_on_stop), and from then on no sandbox enters (end_create refuses it) and no
// create begins.
class Registry {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  // --- held sandboxes ---------------------------------------------------------------------
  // Adds `entry` under its id (replacing any entry of that id). For the state directory's load,
  // before anything is served; a create's entry enters through end_create.
  void insert(std::shared_ptr<Entry> entry);
  // The entry held under `id`, or nullptr; its expiry is not looked at.
  std::shared_ptr<Entry> find(const std::string& id) const;
  // The entry held under `id` (or nullptr) and whether its expiry is at or before `now`.
  struct Lookup {
    std::shared_ptr<Entry> entry;
    bool expired = false;
  };
  Lookup lookup(const std::string& id, TimePoint now) const;
  // Takes `entry` out if it is still the one held under its id; false when someone else took it.
  bool take(const std::shared_ptr<Entry>& entry);
  // Takes out whatever entry is held under `id`; nullptr when there is none.
  std::shared_ptr<Entry> take(const std::string& id);
  // The entries held, in id order (for the list and the reload's moves).
  std::vector<std::shared_ptr<Entry>> snapshot() const;
  // The held entries whose expiry is at or before `now` (the TTL sweep).
  std::vector<std::shared_ptr<Entry>> expired(TimePoint now) const;
  // How many sandboxes are held (not counting creates in flight nor kept ones).
  std::size_t count() const;
  // Gives `entry` the Sandbox handle `box` (moved from) if it is still the one held under its
  // id: a reload's move, which a delete, the TTL sweep or the stop must not cross (whoever takes
  // the entry closes it through the handle it then has). False, `box` untouched, otherwise.
  bool set_box_if_held(const std::shared_ptr<Entry>& entry, std::shared_ptr<sbx::Sandbox>& box);

  // --- expiries ----------------------------------------------------------------------------
  // An entry's `expires_at` is set by its maker before the entry enters the registry; from then
  // on it is read and changed only here, under the registry's mutex.
  std::optional<TimePoint> expires_at(const Entry& entry) const;
  // Sets `entry`'s expiry if it is still the one held under its id (a renew); false otherwise
  // (deleted or expired meanwhile), nothing changed.
  bool renew(const std::shared_ptr<Entry>& entry, TimePoint expires_at);

  // --- creates in flight -------------------------------------------------------------------
  // Counts a create before the provider is asked (Options::max_sandboxes counts it with the held
  // sandboxes). A ticket, or why not: the cap (`cap` held and creating already; 0: no cap) is
  // reached, or the registry is closed (the server stops).
  enum class Refusal { full, closed };
  std::variant<uint64_t, Refusal> begin_create(std::size_t cap);
  // The create's provider operation, for the stop to cancel. True when the caller must cancel it
  // itself: the registry was closed before the operation was known (the stop could not cancel
  // it). False as well for a ticket already ended (the operation completed at once).
  bool set_create_op(uint64_t ticket, const sbx::Operation<sbx::Sandbox>& op);
  // The end of a create: its ticket goes and `entry` (null when the create failed) enters. False
  // when the registry was closed meanwhile: the entry did not enter and the caller closes it.
  bool end_create(uint64_t ticket, std::shared_ptr<Entry> entry);

  // --- the stop ----------------------------------------------------------------------------
  struct Closed {
    std::vector<std::shared_ptr<Entry>> to_close;       // the held sandboxes, for the stop to close
    std::vector<sbx::Operation<sbx::Sandbox>> creates;  // the creates in flight, to cancel
    std::size_t kept = 0;                               // how many went to kept()
  };
  // Closes the registry, once: the held sandboxes leave it, to `to_close` or (`keep`) to kept();
  // the creates in flight stay counted until they end. Nullopt when it was closed already.
  std::optional<Closed> close(bool keep);
  // The sandboxes a stop left running (keep_on_stop).
  std::vector<std::shared_ptr<Entry>> kept() const;

 private:
  mutable std::mutex mutex_;  // guards what follows and every held Entry's expires_at
  std::map<std::string, std::shared_ptr<Entry>> sandboxes_;
  std::vector<std::shared_ptr<Entry>> kept_;
  std::map<uint64_t, sbx::Operation<sbx::Sandbox>> creating_;  // by ticket
  uint64_t next_ticket_ = 0;
  bool closed_ = false;
};

}  // namespace sbx::serve
