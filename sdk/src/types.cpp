#include <sbx/sdk/error.hpp>
#include <sbx/sdk/json.hpp>
#include <sbx/sdk/types.hpp>
#include <sbx/sdk/utf8.hpp>

#include <algorithm>
#include <cctype>

namespace sbx::sdk {
namespace {

// `complete` says whether the writer's struct reaches the last field ABI 1.0 defined (a later minor
// appends fields, so larger structs are fine).
void require_struct(bool complete, std::string_view name) {
  if (!complete) {
    throw Error::invalid_argument(std::string(name) + " is smaller than ABI 1.0 defines it");
  }
}

std::optional<std::string> optional_text(sbx_str s, std::string_view what) {
  if (!sbx_str_is_set(s)) return std::nullopt;
  return text(s, what);
}

KeyValues text_key_values(sbx_kv_list list, std::string_view what) {
  KeyValues out;
  for (size_t i = 0; i < list.count; ++i) {
    std::string key = text(list.items[i].key, std::string(what) + " name");
    std::string value = text(list.items[i].value, std::string(what) + " '" + key + "'");
    out.insert_or_assign(std::move(key), std::move(value));
  }
  return out;
}

std::optional<std::chrono::milliseconds> optional_ms(sbx_opt_i64 v) {
  if (!v.set) return std::nullopt;
  return std::chrono::milliseconds(v.value);
}

}  // namespace

std::string text(sbx_str s, std::string_view what) {
  std::string out(view(s));
  if (const size_t at = utf8::first_invalid(out); at != out.size()) {
    throw Error::invalid_argument(std::string(what) + " is not valid UTF-8 (byte " +
                                  std::to_string(at) + ")");
  }
  return out;
}

KeyValues to_key_values(sbx_kv_list list) {
  return base::copy_of(list);
}

Spec to_spec(const sbx_spec& c) {
  require_struct(SBX_HAS_FIELD(&c, sbx_spec, labels), "sbx_spec");
  Spec spec;
  spec.image = optional_text(c.image, "spec.image");
  spec.ttl = optional_ms(c.ttl_ms);
  spec.ready_timeout = optional_ms(c.ready_timeout_ms);
  spec.workdir = optional_text(c.workdir, "spec.workdir");
  spec.env = text_key_values(c.env, "spec.env variable");
  for (size_t i = 0; i < c.files.count; ++i) {
    const sbx_file& f = c.files.items[i];
    spec.files.push_back(
        {text(f.path, "a startup file's path"),
         std::string(reinterpret_cast<const char*>(f.contents.data), f.contents.len)});
  }
  spec.metadata = text_key_values(c.metadata, "spec.metadata key");
  if (c.resources) {
    require_struct(SBX_HAS_FIELD(c.resources, sbx_resources, gpu_type), "sbx_resources");
    const sbx_resources& r = *c.resources;
    if (r.cpu.set) spec.resources.cpu = r.cpu.value;
    if (r.memory_mib.set) spec.resources.memory_mib = r.memory_mib.value;
    if (r.disk_gib.set) spec.resources.disk_gib = r.disk_gib.value;
    if (r.gpu.set) spec.resources.gpu = r.gpu.value;
    spec.resources.gpu_type = optional_text(r.gpu_type, "resources.gpu_type");
  }
  if (c.has_entrypoint) {
    std::vector<std::string> argv;
    for (size_t i = 0; i < c.entrypoint.count; ++i)
      argv.push_back(text(c.entrypoint.items[i], "spec.entrypoint"));
    spec.entrypoint = std::move(argv);
  }
  spec.ports.assign(c.ports.items, c.ports.items + c.ports.count);
  if (sbx_str_is_set(c.provider_options)) {
    spec.provider_options = json::parse_object(view(c.provider_options), "provider_options");
  }
  spec.labels = text_key_values(c.labels, "label");
  return spec;
}

ExecRequest to_exec_request(const sbx_exec_request& c) {
  require_struct(SBX_HAS_FIELD(&c, sbx_exec_request, user), "sbx_exec_request");
  ExecRequest r;
  r.command = text(c.command, "the command");
  r.cwd = optional_text(c.cwd, "the exec's cwd");
  r.env = text_key_values(c.env, "exec env variable");
  r.timeout = optional_ms(c.timeout_ms);
  r.user = optional_text(c.user, "the exec's user");
  if (SBX_HAS_FIELD(&c, sbx_exec_request, argv) && c.argv.count > 0) {
    if (!c.argv.items) throw Error::invalid_argument("the exec's argv has no items");
    for (size_t i = 0; i < c.argv.count; ++i)
      r.argv.push_back(text(c.argv.items[i], "an argv word"));
    if (r.argv.front().empty()) throw Error::invalid_argument("the exec's argv[0] is empty");
  }
  return r;
}

SessionRequest to_session_request(const sbx_session_request& c) {
  require_struct(SBX_HAS_FIELD(&c, sbx_session_request, user), "sbx_session_request");
  SessionRequest r;
  r.cwd = optional_text(c.cwd, "the session's cwd");
  r.env = text_key_values(c.env, "session env variable");
  r.user = optional_text(c.user, "the session's user");
  return r;
}

PtyRequest to_pty_request(const sbx_pty_request& c) {
  require_struct(SBX_HAS_FIELD(&c, sbx_pty_request, tty), "sbx_pty_request");
  PtyRequest r;
  r.command = optional_text(c.command, "the terminal's command");
  r.cwd = optional_text(c.cwd, "the terminal's cwd");
  r.env = text_key_values(c.env, "terminal env variable");
  r.user = optional_text(c.user, "the terminal's user");
  if (c.rows) r.rows = c.rows;
  if (c.cols) r.cols = c.cols;
  r.tty = c.tty;
  return r;
}

std::string session_id_of(sbx_str id) {
  std::string s = text(id, "the session id");
  const bool ok = !s.empty() && s.size() <= 128 && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == ':' ||
           ch == '-';
  });
  if (!ok) {
    throw Error::invalid_argument("a session id is 1 to 128 bytes of [A-Za-z0-9_.:-]; got \"" +
                                  s.substr(0, 140) + "\"");
  }
  return s;
}

}  // namespace sbx::sdk
