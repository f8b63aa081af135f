// Hot swap for operators (docs/hot-swap.md), with Options::admin:
//   POST /admin/reload     reloads the host's config (a replaced plugin file is a new generation);
//                          an optional body {"sandboxes": "move"|"drain"} says what becomes of the
//                          sandboxes held on a replaced generation (default:
//                          Admin::move_sandboxes). 200 with the report, 409 {"code":
//                          "ADMIN::RELOAD_REFUSED"} when the reload was refused as a whole (the old
//                          generation still serves)
//   GET  /admin/providers  the generations (current and draining), the last reload, the counts
// Authenticated like every route but /health. Without Options::admin both answer 404.
//
// Reloads (from these routes, SIGHUP and the watcher) run one at a time on the admin thread: they
// run plugin code (a library's init, a canary's create, exec and close), never on the server's
// threads.

#include "state.hpp"

#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <algorithm>

namespace sbx::serve {

namespace json = boost::json;

namespace {

json::array names(const std::vector<std::string>& list) {
  json::array out;
  for (const auto& name : list)
    out.emplace_back(name);
  return out;
}

// Moves every sandbox the server holds that is not on its block's current generation (Admin::move).
// Requests that took the old handle finish on it; later ones take the new one. What cannot move
// drains on its generation, as without the move; sandboxes created meanwhile are on the current
// generation already.
void move_sandboxes(Server::State& state, json::object& report) {
  const std::vector<std::shared_ptr<Entry>> entries = state.registry.snapshot();
  json::array moved;
  json::array not_moved;
  for (const auto& entry : entries) {
    const std::shared_ptr<sbx::Sandbox> box = entry->box();
    if (!box || box->closed()) continue;
    std::string why;
    try {
      std::optional<sbx::Sandbox> fresh = state.options.admin->move(*box);
      if (!fresh) continue;  // on the current generation already
      auto handle = std::make_shared<sbx::Sandbox>(std::move(*fresh));
      // Only into an entry still served: a DELETE, the TTL sweep or the stop may have taken it
      // out (and closed the sandbox through the old handle) while it moved.
      if (state.registry.set_box_if_held(entry, handle)) {
        moved.emplace_back(entry->id);
        continue;
      }
      handle->detach();  // whoever took it out closes it; this handle must not close it again
      why = "it was deleted during the move";
    } catch (const std::exception& e) {
      why = e.what();
    }
    spdlog::warn("sbx serve: sandbox {} stays on its generation: {}", entry->id, why);
    not_moved.emplace_back(json::object{{"id", entry->id}, {"reason", why}});
  }
  report["moved"] = std::move(moved);
  report["not_moved"] = std::move(not_moved);
}

// One reload, on the admin thread: the report (or the refusal), recorded for /admin/providers.
std::pair<bool, json::object> run_reload(Server::State& state, bool move) {
  const auto started = std::chrono::system_clock::now();
  bool ok = true;
  json::object body;
  try {
    const sbx::ReloadReport report = state.options.admin->reload();
    body = json::object{{"ok", true},
                        {"added", names(report.added)},
                        {"changed", names(report.changed)},
                        {"removed", names(report.removed)},
                        {"unchanged", names(report.unchanged)}};
  } catch (const std::exception& e) {
    spdlog::error("sbx serve: {}", e.what());
    ok = false;
    body = json::object{{"code", "ADMIN::RELOAD_REFUSED"},
                        {"message", sbx::to_error(std::current_exception()).what()}};
  }
  if (ok) {
    // The reload is in service whatever happens to the moves.
    if (move && state.options.admin->move) {
      try {
        move_sandboxes(state, body);
      } catch (const std::exception& e) {
        body["move_error"] = e.what();
      }
    }
    spdlog::info("sbx serve: reload: {}", json::serialize(body));
  }
  json::object outcome = ok ? body : json::object{{"ok", false}, {"error", body.at("message")}};
  outcome["at_unix_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(started.time_since_epoch()).count();
  std::function<void()> on_reloaded;
  {
    std::lock_guard lock(state.admin_queue.mutex);
    ++(ok ? state.admin_queue.reloads : state.admin_queue.refused);
    state.admin_queue.last = std::move(outcome);
    on_reloaded = state.admin_queue.on_reloaded;
  }
  if (ok && on_reloaded) on_reloaded();
  return {ok, std::move(body)};
}

json::object stopping_refusal() {
  return json::object{{"code", "ADMIN::RELOAD_REFUSED"},
                      {"message", "reload refused, nothing changed: the server is stopping"}};
}

void admin_loop(Server::State& state) {
  auto& queue = state.admin_queue;
  std::unique_lock lock(queue.mutex);
  for (;;) {
    queue.wake.wait(lock, [&] { return queue.stopping || !queue.jobs.empty(); });
    if (queue.stopping) return;  // stop_admin answers what is left
    auto job = std::move(queue.jobs.front());
    queue.jobs.pop_front();
    lock.unlock();
    try {  // nothing may leave this thread
      auto [ok, body] = run_reload(state, job.move.value_or(state.options.admin->move_sandboxes));
      if (job.done) job.done(ok, std::move(body));
    } catch (const std::exception& e) {
      spdlog::error("sbx serve: reload: {}", e.what());
    }
    lock.lock();
  }
}

}  // namespace

void start_reload(const std::shared_ptr<Server::State>& state, std::optional<bool> move,
                  std::function<void(bool ok, json::object body)> done) {
  auto& queue = state->admin_queue;
  {
    std::lock_guard lock(queue.mutex);
    if (!queue.stopping) {
      const bool covered = !done && std::any_of(queue.jobs.begin(), queue.jobs.end(),
                                                [&](auto& j) { return !j.done && j.move == move; });
      if (!covered) queue.jobs.push_back({move, std::move(done)});
      // The thread holds a raw State: ~Server joins it before the state can go.
      if (!queue.thread.joinable()) {
        queue.thread = std::thread([s = state.get()] { admin_loop(*s); });
      }
      queue.wake.notify_one();
      return;
    }
  }
  if (done) done(false, stopping_refusal());
}

void stop_admin(Server::State& state) {
  auto& queue = state.admin_queue;
  std::deque<Server::State::AdminQueue::Job> left;
  {
    std::lock_guard lock(queue.mutex);
    queue.stopping = true;
    left.swap(queue.jobs);
    queue.on_reloaded = nullptr;
  }
  queue.wake.notify_all();
  // A reload hung in plugin code (a load or a canary that never returns) is abandoned, not
  // waited for: the join below then waits only for host-side work.
  if (state.options.admin && state.options.admin->stop_reloads) state.options.admin->stop_reloads();
  if (queue.thread.joinable()) queue.thread.join();
  for (auto& job : left)
    if (job.done) job.done(false, stopping_refusal());
}

namespace {

// GET /admin/providers's body: the generations, the last reload and the counts.
json::object admin_providers(Server::State& state) {
  json::array generations;
  for (const sbx::GenerationInfo& g : state.options.admin->generations()) {
    generations.push_back(json::object{{"name", g.name},
                                       {"generation", g.serial},
                                       {"provider_id", g.provider_id},
                                       {"plugin_file", g.plugin_file},
                                       {"plugin_version", g.plugin_version},
                                       {"current", g.current},
                                       {"sandboxes", g.sandboxes},
                                       {"operations", g.operations}});
  }
  std::lock_guard lock(state.admin_queue.mutex);
  return json::object{
      {"generations", std::move(generations)},
      {"reloads", state.admin_queue.reloads},
      {"reloads_refused", state.admin_queue.refused},
      {"last_reload", state.admin_queue.last.empty() ? json::value(nullptr)
                                                     : json::value(state.admin_queue.last)}};
}

// Without Options::admin the admin routes are not there: 404 as for any unknown path.
bool admin_enabled(const Call& call) {
  if (call.state->options.admin) return true;
  call.reply(
      json_response(call.request, http::status::not_found, json::object{{"detail", "Not Found"}}));
  return false;
}

}  // namespace

void get_admin_providers(const Call& call) {
  if (!admin_enabled(call)) return;
  json::object body = admin_providers(*call.state);
  body["served"] = call.state->current_provider().name();
  call.reply(json_response(call.request, http::status::ok, body));
}

void post_admin_reload(const Call& call) {
  if (!admin_enabled(call)) return;
  const Request& request = call.request;
  // The body: empty, {} or {"sandboxes": "move"|"drain"}; anything else is refused.
  std::optional<bool> move;
  if (request.body().find_first_not_of(" \t\r\n") != std::string::npos) {
    boost::system::error_code ec;
    const json::value body = json::parse(request.body(), ec);
    const json::object* object = ec ? nullptr : body.if_object();
    const json::value* choice = object ? object->if_contains("sandboxes") : nullptr;
    const bool readable = object && object->size() == (choice ? 1u : 0u) &&
                          (!choice || (choice->is_string() && (choice->get_string() == "move" ||
                                                               choice->get_string() == "drain")));
    if (!readable) {
      call.reply(
          error_response(request, http::status::bad_request, "ADMIN::INVALID_REQUEST",
                         "the body must be empty, {} or {\"sandboxes\": \"move\"|\"drain\"}"));
      return;
    }
    if (choice) move = choice->get_string() == "move";
  }
  Request shape;  // what the answer needs of the request, kept past it
  shape.version(request.version());
  shape.keep_alive(request.keep_alive());
  if (const auto id = request.find("x-request-id"); id != request.end()) {
    shape.set("x-request-id", id->value());
  }
  start_reload(call.state, move, [shape, reply = call.reply](bool ok, json::object body) {
    reply(json_response(shape, ok ? http::status::ok : http::status::conflict, std::move(body)));
  });
}

}  // namespace sbx::serve
