// Fault injection: the plan from the config file, the route keys, and the per-route sequences and
// windows (faults.hpp).

#include "faults.hpp"

#include <sbx/base/json.hpp>
#include <sbx/core/errors.hpp>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <array>
#include <map>
#include <utility>

namespace sbx::serve {

namespace {

[[noreturn]] void fail_at(const std::string& path, const std::string& message) {
  throw base::json::Error(path + ": " + message);
}

FaultAction read_action(const boost::json::value& value, const std::string& path,
                        const Route& route) {
  if (!value.is_object()) {
    fail_at(path, "expected an action object, got " + std::string(base::json::kind_name(value)));
  }
  static constexpr std::array<std::string_view, 5> kinds{"status", "reset", "delay_ms",
                                                         "cut_after_events", "pass"};
  const auto& object = value.get_object();
  std::vector<std::string_view> present;
  for (auto k : kinds)
    if (object.contains(k)) present.push_back(k);
  if (present.size() != 1) {
    std::string got;
    for (auto k : present)
      got += (got.empty() ? "" : ", ") + std::string(k);
    fail_at(path,
            "an action has exactly one of status, reset, delay_ms, cut_after_events, pass; "
            "got " +
                (got.empty() ? std::string("none") : got));
  }
  base::json::ObjectReader r(object, path);
  FaultAction a;
  const std::string_view kind = present.front();
  if (kind == "status") {
    a.kind = FaultAction::Kind::status;
    a.status = static_cast<int>(*r.integer("status", 400, 599));
    a.code = r.string("code", "GENERAL::INJECTED_FAULT");
    a.message = r.string("message", "Injected fault (serve.faults): " + std::to_string(a.status) +
                                        " on " + route.key() + ".");
    a.short_body = r.boolean("short_body").value_or(false);
  } else if (kind == "reset" || kind == "pass") {
    const auto flag = r.boolean(kind);
    if (!flag || !*flag) r.fail(kind, "must be true (leave the action out instead)");
    a.kind = kind == "reset" ? FaultAction::Kind::reset : FaultAction::Kind::pass;
  } else if (kind == "delay_ms") {
    a.kind = FaultAction::Kind::delay;
    a.delay = std::chrono::milliseconds(*r.integer("delay_ms", 0, 3600 * 1000));
  } else {
    if (!route.stream) {
      r.fail("cut_after_events",
             "only a streamed route (POST /command, GET /files/download) can be cut, not " +
                 route.key());
    }
    a.kind = FaultAction::Kind::cut_after_events;
    a.events = static_cast<int>(*r.integer("cut_after_events", 0, 1000000));
  }
  r.finish();
  return a;
}

}  // namespace

std::string describe(const FaultAction& action) {
  switch (action.kind) {
    case FaultAction::Kind::status:
      return "status " + std::to_string(action.status) + " " + action.code;
    case FaultAction::Kind::reset:
      return "reset";
    case FaultAction::Kind::delay:
      return "delay " + std::to_string(action.delay.count()) + " ms";
    case FaultAction::Kind::cut_after_events:
      return "cut after " + std::to_string(action.events) + " events";
    case FaultAction::Kind::pass:
      return "pass";
  }
  return "?";
}

bool is_known_route(std::string_view key) {
  return find_route(key) != nullptr;
}

std::shared_ptr<Faults> Faults::parse(const boost::json::value& plan, std::string_view path) {
  const std::string where(path);
  try {
    if (!plan.is_array()) {
      fail_at(where,
              "expected an array of fault rules, got " + std::string(base::json::kind_name(plan)));
    }
    auto faults = std::make_shared<Faults>();
    std::map<std::string, std::pair<bool, bool>> seen;  // route -> (has a sequence, has a window)
    const auto& rules = plan.get_array();
    for (std::size_t i = 0; i < rules.size(); ++i) {
      const std::string rule_path = base::json::path_index(where, i);
      if (!rules[i].is_object()) {
        fail_at(rule_path,
                "expected a rule object, got " + std::string(base::json::kind_name(rules[i])));
      }
      base::json::ObjectReader r(rules[i].get_object(), rule_path);
      Rule rule;
      const auto route_text = r.string("route");
      if (!route_text) r.fail("route", "required: a route key such as \"POST /sandboxes\"");
      const Route* route = find_route(*route_text);
      if (!route) {
        r.fail("route", "unknown route '" + *route_text +
                            "'; a route key is \"METHOD PATH\" as in the OpenAPI specs, e.g. "
                            "\"POST /sandboxes\", \"GET /sandboxes/{id}\", \"POST /command\", "
                            "\"GET /ping\" (docs/serve.md lists them)");
      }
      rule.route = *route_text;
      const auto* actions = r.value("actions");
      const auto fail_for = r.number("fail_for_s", 0, 86400, true);
      auto& [has_sequence, has_window] = seen[rule.route];
      if (actions && fail_for) r.fail("fail_for_s", "a rule has actions or fail_for_s, not both");
      if (fail_for) {
        if (!route->names_sandbox()) {
          r.fail("fail_for_s",
                 "a window counts from a sandbox's creation: " + rule.route + " names no sandbox");
        }
        if (has_window) r.fail("route", "a second window for " + rule.route);
        has_window = true;
        rule.fail_for = std::chrono::milliseconds(static_cast<int64_t>(*fail_for * 1000.0 + 0.5));
        const auto status = r.integer("status", 400, 599);
        if (!status) r.fail("status", "required with fail_for_s: the status to answer (400-599)");
        rule.window_action.kind = FaultAction::Kind::status;
        rule.window_action.status = static_cast<int>(*status);
        rule.window_action.code = r.string("code", "GENERAL::INJECTED_FAULT");
        rule.window_action.message =
            r.string("message", fmt::format("Injected fault (serve.faults): {} on {} for {} s "
                                            "after the sandbox's creation.",
                                            *status, rule.route, *fail_for));
      } else {
        if (!actions) {
          r.fail("actions",
                 "required: a sequence of actions (or fail_for_s with a status, for a window)");
        }
        if (!actions->is_array() || actions->get_array().empty()) {
          r.fail("actions", "expected a non-empty array of actions");
        }
        if (has_sequence) r.fail("route", "a second sequence for " + rule.route);
        has_sequence = true;
        const auto& list = actions->get_array();
        for (std::size_t j = 0; j < list.size(); ++j) {
          rule.actions.push_back(
              read_action(list[j], base::json::path_index(r.path_of("actions"), j), *route));
        }
        rule.repeat = r.boolean("repeat", false);
      }
      r.finish();
      faults->rules_.push_back(std::move(rule));
    }
    return faults;
  } catch (const base::json::Error& e) {
    throw ConfigError(e.what());
  }
}

Faults::Rule* Faults::sequence_locked(std::string_view route) {
  for (auto& rule : rules_)
    if (rule.route == route && rule.fail_for.count() == 0) return &rule;
  return nullptr;
}

std::optional<FaultAction> Faults::take(
    const RouteKey& route, std::optional<std::chrono::system_clock::time_point> sandbox_created_at,
    std::chrono::system_clock::time_point now) {
  std::optional<FaultAction> out;
  {
    std::lock_guard lock(mutex_);
    for (const auto& rule : rules_) {
      if (rule.route != route.key || rule.fail_for.count() == 0 || !sandbox_created_at) continue;
      if (now - *sandbox_created_at < rule.fail_for) out = rule.window_action;
    }
    if (!out) {
      Rule* seq = sequence_locked(route.key);
      if (!seq) return std::nullopt;
      if (seq->next == seq->actions.size()) {
        if (!seq->repeat) return std::nullopt;
        seq->next = 0;
      }
      const FaultAction& next = seq->actions[seq->next];
      if (next.kind == FaultAction::Kind::cut_after_events) return std::nullopt;  // stream_cut's
      out = next;
      ++seq->next;
    }
  }
  spdlog::info("sbx serve: fault injected on {}{}: {}", route.key,
               route.sandbox_id.empty() ? "" : " (sandbox " + route.sandbox_id + ")",
               describe(*out));
  return out;
}

std::optional<int> Faults::stream_cut(std::string_view route_key, std::string_view sandbox_id) {
  int events = 0;
  {
    std::lock_guard lock(mutex_);
    Rule* seq = sequence_locked(route_key);
    if (!seq) return std::nullopt;
    if (seq->next == seq->actions.size()) {
      if (!seq->repeat) return std::nullopt;
      seq->next = 0;
    }
    const FaultAction& next = seq->actions[seq->next];
    if (next.kind != FaultAction::Kind::cut_after_events) return std::nullopt;
    events = next.events;
    ++seq->next;
  }
  spdlog::info("sbx serve: fault injected on {}{}: cut after {} events", route_key,
               sandbox_id.empty() ? std::string() : " (sandbox " + std::string(sandbox_id) + ")",
               events);
  return events;
}

}  // namespace sbx::serve
