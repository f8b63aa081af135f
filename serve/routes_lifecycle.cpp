// The lifecycle routes that read and change the registry, at the root and under /v1:
//   POST   /sandboxes        create (202, state Running once the provider reports it ready)
//   GET    /sandboxes        list (state and metadata filters, page/pageSize, newest first)
//   GET    /sandboxes/{id}   get
//   DELETE /sandboxes/{id}   delete (204; 404 DOCKER::SANDBOX_NOT_FOUND for an unknown id)
// Request-validation failures answer FastAPI's 422 {"detail": [...]} as the real server does;
// other errors the {"code", "message"} envelope (docs/serve.md). pause, resume, renew and
// endpoints are in routes_sandbox_ops.cpp.

#include "state.hpp"

#include <sbx/base/time.hpp>
#include <sbx/core/errors.hpp>

#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <boost/algorithm/string/case_conv.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <variant>

namespace sbx::serve {

namespace json = boost::json;

namespace {

// Pydantic's error items, gathered while the body is read.
struct Invalid {
  json::array detail;

  void add(std::string type, json::array loc, std::string msg, const json::value& input,
           std::optional<json::object> ctx = std::nullopt) {
    json::object item{{"type", std::move(type)},
                      {"loc", std::move(loc)},
                      {"msg", std::move(msg)},
                      {"input", input}};
    if (ctx) item["ctx"] = std::move(*ctx);
    detail.push_back(std::move(item));
  }
};

json::array loc(std::initializer_list<json::value> parts) {
  json::array out{"body"};
  for (const auto& p : parts)
    out.push_back(p);
  return out;
}

// An object of string values (null values skipped, as the real server skips them in env).
std::optional<json::object> string_map(const json::object& body, const char* name,
                                       Invalid& invalid) {
  const auto* v = body.if_contains(name);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_object()) {
    invalid.add("dict_type", loc({name}), "Input should be a valid dictionary", *v);
    return std::nullopt;
  }
  json::object out;
  for (const auto& [key, value] : v->as_object()) {
    if (value.is_null()) continue;
    if (!value.is_string()) {
      invalid.add("string_type", loc({name, key}), "Input should be a valid string", value);
      continue;
    }
    out[key] = value;
  }
  return out;
}

// A Kubernetes label name or value part: alphanumerics at both ends, '-', '_', '.' between.
bool label_word(std::string_view word, std::size_t max) {
  const auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (word.empty() || word.size() > max || !alnum(word.front()) || !alnum(word.back())) {
    return false;
  }
  return std::all_of(word.begin(), word.end(),
                     [&](char c) { return alnum(c) || c == '-' || c == '_' || c == '.'; });
}

// A DNS subdomain (a label key's prefix): lowercase alphanumerics and '-', dot-separated labels.
bool dns_subdomain(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  for (std::size_t start = 0;;) {
    const std::size_t dot = name.find('.', start);
    const std::string_view label = name.substr(start, dot - start);
    const auto ok = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
    if (label.empty() || label.size() > 63 || !ok(label.front()) || !ok(label.back())) {
      return false;
    }
    for (const char c : label)
      if (!ok(c) && c != '-') return false;
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

// Why a metadata pair breaks the real server's rules (Kubernetes labels; the `opensandbox.io/`
// prefix reserved), or "" when it does not.
std::string metadata_problem(std::string_view key, std::string_view value) {
  const std::size_t slash = key.find('/');
  const std::string_view prefix = slash == std::string_view::npos ? "" : key.substr(0, slash);
  const std::string_view name = slash == std::string_view::npos ? key : key.substr(slash + 1);
  if (prefix == "opensandbox.io") {
    return "metadata key '" + std::string(key) + "' uses the reserved prefix opensandbox.io/";
  }
  if ((slash != std::string_view::npos && !dns_subdomain(prefix)) || !label_word(name, 63)) {
    return "metadata key '" + std::string(key) +
           "' is not a valid label key (an optional DNS subdomain prefix and '/', then up to 63 "
           "characters of [A-Za-z0-9-_.] starting and ending alphanumeric)";
  }
  if (!value.empty() && !label_word(value, 63)) {
    return "metadata value '" + std::string(value.substr(0, 80)) + "' of key '" + std::string(key) +
           "' is not a valid label value (up to 63 characters of [A-Za-z0-9-_.] starting and "
           "ending alphanumeric)";
  }
  return "";
}

// The largest resource limits a create may ask for: beyond them the provider's arithmetic
// (Docker's NanoCPUs and bytes are int64) could overflow, and no host has that much.
constexpr double kMaxCpu = 65536;                   // cores
constexpr double kMaxMemoryMib = 1024.0 * 1048576;  // 1 PiB

// "500m" -> 0.5, "2" -> 2, "1.5" -> 1.5; nullopt when not a positive number. Not range-checked.
std::optional<double> parse_cpu(const std::string& text) {
  try {
    std::size_t used = 0;
    if (!text.empty() && text.back() == 'm') {
      const double v = std::stod(text.substr(0, text.size() - 1), &used);
      if (used != text.size() - 1 || !(v > 0)) return std::nullopt;
      return v / 1000;
    }
    const double v = std::stod(text, &used);
    if (used != text.size() || !(v > 0)) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "512Mi" -> 512, "2Gi" -> 2048, "1024Ki" -> 1, "512M" / plain bytes in MiB (not rounded);
// nullopt when not a positive number. Not range-checked (infinity is a positive number).
std::optional<double> parse_memory_mib(const std::string& text) {
  static const std::vector<std::pair<std::string, double>> units{
      {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
      {"K", 1e3},     {"M", 1e6},        {"G", 1e9},           {"T", 1e12}};
  double factor = 1;
  std::string number = text;
  for (const auto& [suffix, f] : units) {
    if (text.size() > suffix.size() &&
        text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
      factor = f;
      number = text.substr(0, text.size() - suffix.size());
      break;
    }
  }
  try {
    std::size_t used = 0;
    const double v = std::stod(number, &used);
    if (used != number.size() || !(v > 0)) return std::nullopt;
    return v * factor / 1048576.0;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// What a create request asks for, read and checked; an answer instead when it cannot be served.
struct CreateRequest {
  sbx::SandboxSpec spec;
  std::string image;
  std::vector<std::string> entrypoint;
  std::optional<json::object> metadata;
  std::optional<int64_t> timeout_s;
};

std::optional<CreateRequest> read_create(const Request& request, const Reply& reply) {
  auto parsed = parse_json_body(request, reply);
  if (!parsed) return std::nullopt;
  const json::value& value = *parsed;
  auto unprocessable = [&](Invalid& invalid) {
    reply(json_response(request, http::status::unprocessable_entity,
                        json::object{{"detail", std::move(invalid.detail)}}));
    return std::nullopt;
  };
  Invalid invalid;
  if (!value.is_object()) {
    invalid.add("model_attributes_type", json::array{"body"},
                "Input should be a valid dictionary or object to extract fields from", value);
    return unprocessable(invalid);
  }
  const json::object& body = value.as_object();
  CreateRequest out;

  bool has_image = false;
  if (const auto* image = body.if_contains("image"); image && !image->is_null()) {
    if (!image->is_object()) {
      invalid.add("model_attributes_type", loc({"image"}),
                  "Input should be a valid dictionary or object to extract fields from", *image);
    } else if (const auto* uri = image->as_object().if_contains("uri"); !uri) {
      invalid.add("missing", loc({"image", "uri"}), "Field required", *image);
    } else if (!uri->is_string()) {
      invalid.add("string_type", loc({"image", "uri"}), "Input should be a valid string", *uri);
    } else {
      out.image = std::string(uri->as_string());
      has_image = out.image.find_first_not_of(" \t") != std::string::npos;
    }
    if (image->is_object()) {
      for (const auto& [key, v] : image->as_object()) {
        if (key != "uri" && key != "auth") {
          continue;  // unknown keys are ignored, as pydantic does
        }
        if (key == "auth" && !v.is_null()) {
          reply(error_response(request, http::status::bad_request, "SANDBOX::API_NOT_SUPPORTED",
                               "image.auth is not supported by this server yet."));
          return std::nullopt;
        }
      }
    }
  }
  bool has_snapshot = false;
  if (const auto* snapshot = body.if_contains("snapshotId"); snapshot && !snapshot->is_null()) {
    if (!snapshot->is_string()) {
      invalid.add("string_type", loc({"snapshotId"}), "Input should be a valid string", *snapshot);
    } else {
      has_snapshot = !snapshot->as_string().empty();
    }
  }
  if (const auto* entrypoint = body.if_contains("entrypoint");
      entrypoint && !entrypoint->is_null()) {
    if (!entrypoint->is_array()) {
      invalid.add("list_type", loc({"entrypoint"}), "Input should be a valid list", *entrypoint);
    } else if (entrypoint->as_array().empty()) {
      invalid.add("too_short", loc({"entrypoint"}),
                  "List should have at least 1 item after validation, not 0", *entrypoint,
                  json::object{{"field_type", "List"}, {"min_length", 1}, {"actual_length", 0}});
    } else {
      int64_t i = 0;
      for (const auto& word : entrypoint->as_array()) {
        if (!word.is_string()) {
          invalid.add("string_type", loc({"entrypoint", i}), "Input should be a valid string",
                      word);
        } else {
          out.entrypoint.emplace_back(word.as_string());
        }
        ++i;
      }
    }
  }
  // Optional as a field (absent or null is no field error); required by the model's check below.
  const std::optional<json::object> limits = string_map(body, "resourceLimits", invalid);
  if (const auto* timeout = body.if_contains("timeout"); timeout && !timeout->is_null()) {
    std::optional<int64_t> seconds;
    if (timeout->is_int64()) seconds = timeout->as_int64();
    if (timeout->is_uint64()) {  // past int64: too long, refused below as any other
      seconds = timeout->as_uint64() > static_cast<uint64_t>(kMaxTimeoutS)
                    ? kMaxTimeoutS + 1
                    : static_cast<int64_t>(timeout->as_uint64());
    }
    if (timeout->is_double() && std::floor(timeout->as_double()) == timeout->as_double() &&
        std::abs(timeout->as_double()) < 1e15) {
      seconds = static_cast<int64_t>(timeout->as_double());
    }
    if (!seconds) {
      invalid.add("int_type", loc({"timeout"}), "Input should be a valid integer", *timeout);
    } else if (*seconds < 60) {
      invalid.add("greater_than_equal", loc({"timeout"}),
                  "Input should be greater than or equal to 60", *timeout,
                  json::object{{"ge", 60}});
    } else {
      out.timeout_s = seconds;
    }
  }
  const auto env = string_map(body, "env", invalid);
  out.metadata = string_map(body, "metadata", invalid);
  if (!invalid.detail.empty()) return unprocessable(invalid);

  // The model's own checks, after its fields (pydantic runs them only when the fields are valid).
  auto model_error = [&](const std::string& message) {
    invalid.add("value_error", json::array{"body"}, "Value error, " + message, value,
                json::object{{"error", json::object{}}});
    return unprocessable(invalid);
  };
  // A pool's sandbox takes its image, entrypoint and limits from the pool: none is asked for (the
  // provider then answers for poolRef itself; local_docker refuses it).
  const auto* extensions = body.if_contains("extensions");
  const auto* pool = extensions && extensions->is_object()
                         ? extensions->as_object().if_contains("poolRef")
                         : nullptr;
  const bool has_pool_ref =
      pool && pool->is_string() && pool->as_string().find_first_not_of(" \t") != std::string::npos;
  if (has_pool_ref) {
    // nothing the model checks
  } else if (has_image == has_snapshot) {
    return model_error("Exactly one of image or snapshotId must be provided.");
  } else if (has_image && out.entrypoint.empty()) {
    return model_error("Entrypoint is required when image is provided.");
  } else if (!limits) {
    return model_error("resourceLimits is required when poolRef is not provided.");
  }

  // Known fields this slice does not serve yet: a clear refusal, never a silent drop.
  auto unsupported = [&](const std::string& what) {
    reply(error_response(request, http::status::bad_request, "SANDBOX::API_NOT_SUPPORTED",
                         what + " is not supported by this server yet."));
    return std::nullopt;
  };
  // As the real server's server.max_sandbox_timeout_seconds, here fixed at what the time types
  // hold with room to spare (sbx::base::kForever): a longer TTL would overflow the expiry.
  if (out.timeout_s && *out.timeout_s > kMaxTimeoutS) {
    reply(error_response(request, http::status::bad_request, "SANDBOX::INVALID_PARAMETER",
                         "timeout must be at most " + std::to_string(kMaxTimeoutS) +
                             " seconds (about 31 years), got " + std::to_string(*out.timeout_s) +
                             "."));
    return std::nullopt;
  }
  if (out.metadata) {
    for (const auto& [k, v] : *out.metadata) {
      if (const std::string problem = metadata_problem(k, v.as_string()); !problem.empty()) {
        reply(error_response(request, http::status::bad_request, "SANDBOX::INVALID_METADATA_LABEL",
                             problem + "."));
        return std::nullopt;
      }
    }
  }
  if (has_snapshot) return unsupported("snapshotId");
  if (const auto* v = body.if_contains("credentialProxy"); v && !v->is_null()) {
    return unsupported("credentialProxy");
  }
  if (const auto* v = body.if_contains("secureAccess"); v && !v->is_null()) {
    if (!v->is_bool()) {
      invalid.add("bool_type", loc({"secureAccess"}), "Input should be a valid boolean", *v);
      return unprocessable(invalid);
    }
    if (v->as_bool()) return unsupported("secureAccess");
  }
  if (const auto* v = body.if_contains("extensions"); v && !v->is_null()) {
    if (!v->is_object()) {
      invalid.add("dict_type", loc({"extensions"}), "Input should be a valid dictionary", *v);
      return unprocessable(invalid);
    }
  }
  static const std::set<std::string> known{
      "image",     "snapshotId", "entrypoint", "resourceLimits", "timeout",         "env",
      "metadata",  "platform",   "volumes",    "networkPolicy",  "credentialProxy", "secureAccess",
      "extensions"};
  for (const auto& [key, v] : body) {
    if (!known.count(key)) spdlog::debug("sbx serve: create: ignoring unknown field '{}'", key);
  }

  // The spec. platform, volumes, networkPolicy and extensions go to the provider as they came, as
  // provider_options (the opensandbox plugin's names for them); a provider that cannot honour one
  // refuses it (400 SANDBOX::INVALID_PARAMETER with its message), never a silent drop here.
  sbx::SandboxSpec& spec = out.spec;
  for (const auto& [field, option] :
       {std::pair{"platform", "platform"}, std::pair{"volumes", "volumes"},
        std::pair{"networkPolicy", "network_policy"}, std::pair{"extensions", "extensions"}}) {
    const auto* v = body.if_contains(field);
    if (!v || v->is_null()) continue;
    if (v->is_object() && v->as_object().empty()) continue;  // "extensions": {} asks nothing
    if (v->is_array() && v->as_array().empty()) continue;
    spec.provider_options[option] = *v;
  }
  spec.image = out.image;
  spec.entrypoint = out.entrypoint;
  if (out.timeout_s) spec.ttl_s = static_cast<double>(*out.timeout_s);
  // The real server's bootstrap names execd's env file: the SDKs' commands.set_env appends to it,
  // and the sandbox's execd (local_docker's agent) loads it for every command. A client's own
  // EXECD_ENVS wins.
  spec.env[std::string(kExecdEnvsVar)] = std::string(kExecdEnvsFile);
  if (env) {
    for (const auto& [k, v] : *env)
      spec.env[k] = std::string(v.as_string());
  }
  if (out.metadata) {
    for (const auto& [k, v] : *out.metadata)
      spec.metadata[k] = std::string(v.as_string());
  }
  if (limits) {
    for (const auto& [k, v] : *limits) {
      const std::string text(v.as_string());
      auto invalid_limit = [&](const std::string& message) {
        reply(error_response(request, http::status::bad_request, "SANDBOX::INVALID_PARAMETER",
                             message));
        return std::nullopt;
      };
      if (k == "cpu") {
        const auto cpu = parse_cpu(text);
        if (!cpu) return invalid_limit("Invalid cpu limit '" + text + "'.");
        if (!(*cpu <= kMaxCpu)) {
          return invalid_limit("cpu limit '" + text + "' is out of range (at most " +
                               std::to_string(static_cast<int64_t>(kMaxCpu)) + ").");
        }
        spec.resources.cpu = cpu;
      } else if (k == "memory") {
        const auto mib = parse_memory_mib(text);
        if (!mib) return invalid_limit("Invalid memory limit '" + text + "'.");
        if (!(*mib <= kMaxMemoryMib)) {
          return invalid_limit("memory limit '" + text + "' is out of range (at most 1Pi).");
        }
        spec.resources.memory_mib = static_cast<int64_t>(std::ceil(*mib));
      } else {
        return unsupported("resourceLimits." + std::string(k));
      }
    }
  }
  return out;
}

// Docker-runtime states, as the real server reports them (docs/serve.md).
json::object status_of(sbx::SandboxStatus status, std::chrono::system_clock::time_point at) {
  const char* state = "Unknown";
  const char* reason = "CONTAINER_UNKNOWN";
  const char* message = "Sandbox container is in an unknown state.";
  switch (status) {
    case sbx::SandboxStatus::running:
      state = "Running", reason = "CONTAINER_RUNNING", message = "Sandbox container is running.";
      break;
    case sbx::SandboxStatus::paused:
      state = "Paused", reason = "CONTAINER_PAUSED", message = "Sandbox container is paused.";
      break;
    case sbx::SandboxStatus::starting:
      state = "Pending", reason = "CONTAINER_STARTING", message = "Sandbox container is starting.";
      break;
    case sbx::SandboxStatus::stopped:
      state = "Terminated", reason = "CONTAINER_EXITED", message = "Sandbox container exited.";
      break;
    case sbx::SandboxStatus::error:
      state = "Failed", reason = "CONTAINER_EXITED_ERROR", message = "Sandbox container failed.";
      break;
    case sbx::SandboxStatus::unknown:
      break;
  }
  return json::object{{"state", state},
                      {"reason", reason},
                      {"message", message},
                      {"lastTransitionAt", format_time(at)}};
}

json::array entrypoint_json(const Entry& entry) {
  json::array out;
  for (const auto& word : entry.entrypoint)
    out.push_back(json::string(word));
  return out;
}

// The end of a create: the sandbox enters the registry (or, when the server began stopping
// meanwhile, is closed) and the client gets its answer.
void finish_create(const std::shared_ptr<Server::State>& state, uint64_t ticket,
                   const std::string& token, const std::shared_ptr<Entry>& entry,
                   std::exception_ptr error, unsigned version, const Reply& reply) {
  Request shape;
  shape.version(version);
  // Read before the entry is published: from then on a renew may change expires_at.
  const auto expires_at = entry->expires_at;
  // The record first, so that a delete racing with this answer removes it after it was written.
  if (!error) store_save(*state, *entry);
  // Then the create's own record goes: a crash between the two leaves both, and the next server
  // adopts the sandbox (its record names it).
  store_end_create(*state, token);
  // The registry first, then the gate, which counts a refused one as a close in the step that
  // ends the create (state.hpp).
  const bool refused = !state->registry.end_create(ticket, error ? nullptr : entry);
  state->gate.end_create(refused);
  if (error) {
    spdlog::info("sbx serve: create failed: {}", sbx::to_error(error).what());
    reply(provider_error_response(shape, error, ""));
    return;
  }
  if (refused) {  // the server began stopping while the provider created it
    store_remove(*state, *entry);
    begin_close(state, entry, [](std::exception_ptr) {});
    reply(error_response(shape, http::status::service_unavailable, "SANDBOX::SERVER_STOPPING",
                         "The server is stopping."));
    return;
  }
  spdlog::info("sbx serve: created sandbox {}", entry->id);
  json::object body{{"id", entry->id},
                    {"status", json::object{{"state", "Running"},
                                            {"reason", "CONTAINER_RUNNING"},
                                            {"message", "Sandbox container started successfully."},
                                            {"lastTransitionAt", format_time(entry->created_at)}}}};
  if (auto metadata = entry->metadata()) body["metadata"] = std::move(*metadata);
  if (expires_at) body["expiresAt"] = format_time(*expires_at);
  body["createdAt"] = format_time(entry->created_at);
  body["entrypoint"] = entrypoint_json(*entry);
  reply(json_response(shape, http::status::accepted, body));
}

void create(const std::shared_ptr<Server::State>& state, const Request& request,
            const Reply& reply) {
  auto read = read_create(request, reply);
  if (!read) return;
  // Counted in the gate (a stop waits for it), then in the registry (the cap), before it starts
  // (state.hpp).
  const std::size_t cap = state->limits.max_sandboxes;
  std::optional<uint64_t> begun;
  bool full = false;
  if (state->gate.begin_create()) {
    const auto ticket_or_refusal = state->registry.begin_create(cap);
    if (const auto* ticket = std::get_if<uint64_t>(&ticket_or_refusal)) {
      begun = *ticket;
    } else {
      full = std::get<Registry::Refusal>(ticket_or_refusal) == Registry::Refusal::full;
      state->gate.end_create(false);
    }
  }
  if (!begun && full) {
    reply(error_response(request, http::status::too_many_requests, "SANDBOX::TOO_MANY_SANDBOXES",
                         "The server holds its maximum of " + std::to_string(cap) +
                             " sandboxes; delete one first."));
    return;
  }
  if (!begun) {
    reply(error_response(request, http::status::service_unavailable, "SANDBOX::SERVER_STOPPING",
                         "The server is stopping."));
    return;
  }
  const uint64_t ticket = *begun;
  auto entry = std::make_shared<Entry>();
  entry->image = read->image;
  entry->entrypoint = read->entrypoint;
  entry->set_metadata(read->metadata);
  // As the real server: createdAt is taken when the request is accepted and expiresAt counts
  // from it, so the server's expiry never comes after the provider's own TTL.
  entry->created_at = std::chrono::system_clock::now();
  if (read->timeout_s) {  // at most kMaxTimeoutS (read_create): the sum cannot overflow
    entry->expires_at =
        sbx::base::add_checked(entry->created_at, std::chrono::seconds(*read->timeout_s));
  }
  auto version = request.version();

  // With a state directory the create is recorded before the provider is asked, with a token
  // the sandbox carries (kCreateLabel): a server killed before the create ends leaves the record,
  // and the next one closes the sandbox (store_load).
  std::string token;
  if (state->options.state_dir) {
    token = new_request_id();
    read->spec.metadata[kCreateLabel] = token;
    if (const std::string error =
            store_begin_create(*state, token, entry->image, entry->created_at);
        !error.empty()) {
      state->registry.end_create(ticket, nullptr);
      state->gate.end_create(false);
      spdlog::warn("sbx serve: create refused: {}", error);
      reply(error_response(request, http::status::internal_server_error, "GENERAL::UNKNOWN_ERROR",
                           "The create could not be recorded in the state directory."));
      return;
    }
  }

  sbx::Operation<sbx::Sandbox> op;
  try {
    op = state->current_provider().create_async(std::move(read->spec));
  } catch (...) {
    store_end_create(*state, token);
    state->registry.end_create(ticket, nullptr);
    state->gate.end_create(false);
    reply(provider_error_response(request, std::current_exception(), ""));
    return;
  }
  // For the stop to cancel; cancelled here when the stop came first (state.hpp).
  if (state->registry.set_create_op(ticket, op)) op.cancel();
  // The continuation runs on the thread that completes the create (a plugin thread, or this one).
  op.then([state, ticket, token, entry, version, reply](sbx::Operation<sbx::Sandbox>& done) {
    std::exception_ptr error;
    try {
      entry->set_box(std::make_shared<sbx::Sandbox>(done.get()));
      entry->id = entry->box()->id();
    } catch (...) {
      error = std::current_exception();
    }
    if (error || !state->options.state_dir) {
      finish_create(state, ticket, token, entry, error, version, reply);
      return;
    }
    // With a state directory, the sandbox's descriptor is kept before the client hears of it.
    sbx::Operation<std::string> serialize;
    try {
      serialize = entry->box()->serialize_async();
    } catch (...) {
      error = std::current_exception();
    }
    auto described = [state, ticket, token, entry, version, reply](std::exception_ptr error) {
      if (error) {  // a sandbox the server could not find again after a restart: not created
        spdlog::warn("sbx serve: sandbox {} has no descriptor ({}); closing it", entry->id,
                     sbx::to_error(error).what());
        state->gate.begin_close();
        begin_close(state, entry, [](std::exception_ptr) {});
      }
      finish_create(state, ticket, token, entry, error, version, reply);
    };
    if (error) {
      described(error);
      return;
    }
    serialize.then([entry, described](sbx::Operation<std::string>& d) {
      std::exception_ptr error;
      try {
        entry->descriptor = d.get();
      } catch (...) {
        error = std::current_exception();
      }
      described(error);
    });
  });
}

}  // namespace

// The JSON body as the real server reads it: 422 json_invalid with the offset of the error.
std::optional<json::value> parse_json_body(const Request& request, const Reply& reply) {
  const std::string& body = request.body();
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) {  // FastAPI: a required body
    Invalid invalid;
    invalid.add("missing", json::array{"body"}, "Field required", nullptr);
    reply(json_response(request, http::status::unprocessable_entity,
                        json::object{{"detail", std::move(invalid.detail)}}));
    return std::nullopt;
  }
  json::stream_parser parser;
  boost::system::error_code ec;
  const std::size_t used = parser.write_some(body.data(), body.size(), ec);
  if (!ec) parser.finish(ec);
  if (!ec) return parser.release();
  Invalid invalid;
  invalid.add("json_invalid", loc({static_cast<int64_t>(used)}), "JSON decode error",
              json::object{}, json::object{{"error", "Expecting value"}});
  reply(json_response(request, http::status::unprocessable_entity,
                      json::object{{"detail", std::move(invalid.detail)}}));
  return std::nullopt;
}

Response not_found(const Request& request, const std::string& id) {
  return error_response(request, http::status::not_found, "DOCKER::SANDBOX_NOT_FOUND",
                        "Sandbox " + id + " not found.");
}

Response method_not_allowed(const Request& request) {
  return json_response(request, http::status::method_not_allowed,
                       json::object{{"detail", "Method Not Allowed"}});
}

json::object sandbox_json(const std::shared_ptr<Server::State>& state, const Entry& entry,
                          sbx::SandboxStatus status) {
  const auto expires_at = state->registry.expires_at(entry);
  json::object body{{"id", entry.id},
                    {"image", json::object{{"uri", entry.image}}},
                    {"status", status_of(status, entry.created_at)}};
  if (auto metadata = entry.metadata()) body["metadata"] = std::move(*metadata);
  body["entrypoint"] = entrypoint_json(entry);
  if (expires_at) body["expiresAt"] = format_time(*expires_at);
  body["createdAt"] = format_time(entry.created_at);
  return body;
}

namespace {

void get(const std::shared_ptr<Server::State>& state, const Request& request, const Reply& reply,
         const std::string& id) {
  auto entry = find_live(state, id);
  if (!entry) {
    reply(not_found(request, id));
    return;
  }
  const auto version = request.version();
  entry->box()->status_async().then(
      [state, entry, id, version, reply](sbx::Operation<sbx::SandboxStatus>& done) {
        Request shape;
        shape.version(version);
        try {
          const sbx::SandboxStatus status = done.get();
          if (status == sbx::SandboxStatus::stopped) entry->not_running = true;
          reply(json_response(shape, http::status::ok, sandbox_json(state, *entry, status)));
        } catch (...) {
          reply(provider_error_response(shape, std::current_exception(), id));
        }
      });
}

// PATCH /sandboxes/{id}/metadata: a JSON Merge Patch of string values (null removes a key), each
// pair under the create's rules; answers the sandbox as GET does. Kept in the state directory.
// The provider's own labels (a container's, fixed at its create) are not changed: the patched
// metadata is what this server's GET and list answer and filter on.
void patch_metadata(const std::shared_ptr<Server::State>& state, const Request& request,
                    const Reply& reply, const std::string& id) {
  auto entry = find_live(state, id);
  if (!entry) {
    reply(not_found(request, id));
    return;
  }
  auto parsed = parse_json_body(request, reply);
  if (!parsed) return;
  Invalid invalid;
  if (!parsed->is_object()) {
    invalid.add("dict_type", json::array{"body"}, "Input should be a valid dictionary", *parsed);
  } else {
    for (const auto& [k, v] : parsed->as_object()) {
      if (!v.is_string() && !v.is_null()) {
        invalid.add("string_type", json::array{"body", json::string(k)},
                    "Input should be a valid string", v);
      }
    }
  }
  if (!invalid.detail.empty()) {
    reply(json_response(request, http::status::unprocessable_entity,
                        json::object{{"detail", std::move(invalid.detail)}}));
    return;
  }
  const json::object& patch = parsed->as_object();
  for (const auto& [k, v] : patch) {
    // A null removes the key: only the key is checked (an empty value passes the value rule).
    const std::string problem =
        metadata_problem(k, v.is_string() ? std::string_view(v.as_string()) : std::string_view());
    if (!problem.empty()) {
      reply(error_response(request, http::status::bad_request, "SANDBOX::INVALID_METADATA_LABEL",
                           problem + "."));
      return;
    }
  }
  entry->patch_metadata(patch);
  store_save(*state, *entry);
  get(state, request, reply, id);
}

void remove(const std::shared_ptr<Server::State>& state, const Request& request, const Reply& reply,
            const std::string& id) {
  if (!find_live(state, id)) {  // unknown, or past its expiry (then closed in the background)
    reply(not_found(request, id));
    return;
  }
  // Counted as a close before it leaves the registry (state.hpp).
  state->gate.begin_close();
  const std::shared_ptr<Entry> entry = state->registry.take(id);
  if (!entry) {  // another request took it meanwhile
    state->gate.end_close();
    reply(not_found(request, id));
    return;
  }
  store_remove(*state, *entry);
  const auto version = request.version();
  begin_close(state, entry, [id, version, reply](std::exception_ptr error) {
    Request shape;
    shape.version(version);
    if (error) {
      reply(provider_error_response(shape, error, id));
      return;
    }
    spdlog::info("sbx serve: deleted sandbox {}", id);
    reply(empty_response(shape, http::status::no_content));
  });
}

// Python's repr() of a short text, as the real server's messages quote it.
std::string py_repr(const std::string& text) {
  const char quote =
      text.find('\'') != std::string::npos && text.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : text) {
    if (c == '\\' || c == quote) out += '\\';
    out += c;
  }
  out += quote;
  return out;
}

// An integer query parameter as FastAPI reads it: the 422 items for what it is not.
std::optional<int64_t> query_int(const std::string& name, const std::string& text, int64_t ge,
                                 std::optional<int64_t> le, Invalid& invalid) {
  const auto first = text.find_first_not_of(" \t\r\n");
  const auto last = text.find_last_not_of(" \t\r\n");
  const std::string trimmed =
      first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
  std::size_t i = trimmed.size() > 0 && (trimmed[0] == '-' || trimmed[0] == '+') ? 1 : 0;
  bool ok = i < trimmed.size() && trimmed.size() <= 18;
  for (; ok && i < trimmed.size(); ++i)
    ok = (trimmed[i] >= '0' && trimmed[i] <= '9') || (trimmed[i] == '_' && i + 1 < trimmed.size());
  std::string digits;
  for (const char c : trimmed)
    if (c != '_') digits += c;
  if (!ok) {
    invalid.add("int_parsing", json::array{"query", json::string(name)},
                "Input should be a valid integer, unable to parse string as an integer",
                json::string(text));
    return std::nullopt;
  }
  const int64_t value = std::stoll(digits);
  if (value < ge) {
    invalid.add("greater_than_equal", json::array{"query", json::string(name)},
                "Input should be greater than or equal to " + std::to_string(ge),
                json::string(text), json::object{{"ge", ge}});
    return std::nullopt;
  }
  if (le && value > *le) {
    invalid.add("less_than_equal", json::array{"query", json::string(name)},
                "Input should be less than or equal to " + std::to_string(*le), json::string(text),
                json::object{{"le", *le}});
    return std::nullopt;
  }
  return value;
}

// GET /sandboxes: the sandboxes of this server (its registry), filtered, newest first, one page.
void list(const std::shared_ptr<Server::State>& state, const Request& request, const Reply& reply) {
  std::vector<std::string> states;
  std::optional<std::string> metadata_text, page_text, size_text;
  for (auto& [name, value] : query_params(request)) {
    if (name == "state") states.push_back(value);
    if (name == "metadata") metadata_text = value;  // a single value: the last one, as FastAPI
    if (name == "page") page_text = value;
    if (name == "pageSize") size_text = value;
  }
  Invalid invalid;
  int64_t page = 1, page_size = 20;
  if (page_text) page = query_int("page", *page_text, 1, std::nullopt, invalid).value_or(0);
  if (size_text) page_size = query_int("pageSize", *size_text, 1, 200, invalid).value_or(0);
  if (!invalid.detail.empty()) {
    reply(json_response(request, http::status::unprocessable_entity,
                        json::object{{"detail", std::move(invalid.detail)}}));
    return;
  }
  // metadata=k%3Dv%26k2%3Dv2: one parameter whose value is itself a query, every pair ANDed
  // (Python's parse_qsl with strict parsing and blank values kept, as the real server).
  std::map<std::string, std::string> wanted;
  if (metadata_text && !metadata_text->empty()) {
    std::string_view rest = *metadata_text;
    while (true) {
      const auto amp = rest.find('&');
      const std::string field(rest.substr(0, amp));
      const auto eq = field.find('=');
      if (eq == std::string::npos) {
        reply(error_response(request, http::status::bad_request, "INVALID_METADATA_FORMAT",
                             "Invalid metadata format: bad query field: " + py_repr(field)));
        return;
      }
      const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
      wanted[percent_decode(key, true).value_or(key)] = percent_decode(value, true).value_or(value);
      if (amp == std::string_view::npos) break;
      rest = rest.substr(amp + 1);
    }
  }
  std::set<std::string> wanted_states;
  for (const auto& st : states)
    wanted_states.insert(boost::algorithm::to_lower_copy(st));

  retire_expired(state);
  std::vector<std::shared_ptr<Entry>> entries;
  for (const auto& entry : state->registry.snapshot()) {
    bool match = true;
    const auto metadata = entry->metadata();
    for (const auto& [k, v] : wanted) {
      const json::value* have = metadata ? metadata->if_contains(k) : nullptr;
      match = match && have && have->is_string() && have->as_string() == v;
    }
    if (match) entries.push_back(entry);
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a->created_at != b->created_at ? a->created_at > b->created_at : a->id < b->id;
  });

  // Without a state filter only the page's sandboxes are asked for their status.
  struct Gather {
    std::vector<std::shared_ptr<Entry>> entries;
    std::vector<sbx::SandboxStatus> statuses;
    std::atomic<std::size_t> left{0};
  };
  const bool by_state = !wanted_states.empty();
  auto slice = [page, page_size](std::size_t total) {
    // (page - 1) * page_size may overflow for a page far past the end: such a page is empty.
    const auto skipped_pages = static_cast<std::size_t>(page - 1);
    const auto size = static_cast<std::size_t>(page_size);
    const std::size_t begin =
        skipped_pages > total / size ? total : std::min(total, skipped_pages * size);
    return std::pair{begin,
                     std::min<std::size_t>(total, begin + static_cast<std::size_t>(page_size))};
  };
  auto gather = std::make_shared<Gather>();
  std::size_t total_unfiltered = entries.size();
  if (by_state) {
    gather->entries = std::move(entries);
  } else {
    const auto [b, e] = slice(entries.size());
    gather->entries.assign(entries.begin() + static_cast<std::ptrdiff_t>(b),
                           entries.begin() + static_cast<std::ptrdiff_t>(e));
  }
  gather->statuses.assign(gather->entries.size(), sbx::SandboxStatus::unknown);
  const auto version = request.version();
  auto complete = [state, gather, wanted_states, by_state, total_unfiltered, slice, page, page_size,
                   version, reply] {
    std::vector<json::value> items;
    std::size_t total = 0;
    if (by_state) {
      std::vector<std::size_t> kept;
      for (std::size_t i = 0; i < gather->entries.size(); ++i) {
        const json::object s = status_of(gather->statuses[i], {});
        const std::string name =
            boost::algorithm::to_lower_copy(std::string(s.at("state").as_string()));
        if (wanted_states.count(name)) kept.push_back(i);
      }
      total = kept.size();
      const auto [b, e] = slice(total);
      for (std::size_t k = b; k < e; ++k) {
        items.push_back(sandbox_json(state, *gather->entries[kept[k]], gather->statuses[kept[k]]));
      }
    } else {
      total = total_unfiltered;
      for (std::size_t i = 0; i < gather->entries.size(); ++i)
        items.push_back(sandbox_json(state, *gather->entries[i], gather->statuses[i]));
    }
    const int64_t pages =
        total == 0 ? 0
                   : static_cast<int64_t>((total + static_cast<std::size_t>(page_size) - 1) /
                                          static_cast<std::size_t>(page_size));
    json::array array(items.begin(), items.end());
    Request shape;
    shape.version(version);
    reply(json_response(
        shape, http::status::ok,
        json::object{{"items", std::move(array)},
                     {"pagination", json::object{{"page", page},
                                                 {"pageSize", page_size},
                                                 {"totalItems", static_cast<int64_t>(total)},
                                                 {"totalPages", pages},
                                                 {"hasNextPage", page < pages}}}}));
  };
  if (gather->entries.empty()) {
    complete();
    return;
  }
  gather->left = gather->entries.size();
  for (std::size_t i = 0; i < gather->entries.size(); ++i) {
    // A status that fails is reported as Unknown; the item stays in the list.
    auto one = [gather, i, complete](std::optional<sbx::SandboxStatus> status) {
      if (status) gather->statuses[i] = *status;
      if (gather->left.fetch_sub(1) == 1) complete();
    };
    sbx::Operation<sbx::SandboxStatus> op;
    try {
      op = gather->entries[i]->box()->status_async();
    } catch (...) {
      one(std::nullopt);
      continue;
    }
    op.then([one](sbx::Operation<sbx::SandboxStatus>& done) {
      try {
        one(done.get());
      } catch (...) {
        one(std::nullopt);
      }
    });
  }
}

}  // namespace

void get_sandboxes(const Call& call) {
  list(call.state, call.request, call.reply);
}

void post_sandboxes(const Call& call) {
  create(call.state, call.request, call.reply);
}

void get_sandbox(const Call& call) {
  get(call.state, call.request, call.reply, call.sandbox_id);
}

void delete_sandbox(const Call& call) {
  remove(call.state, call.request, call.reply, call.sandbox_id);
}

void patch_sandbox_metadata(const Call& call) {
  patch_metadata(call.state, call.request, call.reply, call.sandbox_id);
}

}  // namespace sbx::serve
