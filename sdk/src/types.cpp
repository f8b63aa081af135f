#include <sbx/sdk/error.hpp>
#include <sbx/sdk/json.hpp>
#include <sbx/sdk/types.hpp>

namespace sbx::sdk {
namespace {

// `complete` says whether the writer's struct reaches the last field ABI 1.0 defined (a later minor
// appends fields, so larger structs are fine).
void require_struct(bool complete, std::string_view name) {
  if (!complete) {
    throw Error::invalid_argument(std::string(name) + " is smaller than ABI 1.0 defines it");
  }
}

std::optional<std::chrono::milliseconds> optional_ms(sbx_opt_i64 v) {
  if (!v.set) return std::nullopt;
  return std::chrono::milliseconds(v.value);
}

}  // namespace

KeyValues to_key_values(sbx_kv_list list) {
  KeyValues out;
  for (size_t i = 0; i < list.count; ++i) {
    out.insert_or_assign(std::string(view(list.items[i].key)),
                         std::string(view(list.items[i].value)));
  }
  return out;
}

Spec to_spec(const sbx_spec& c) {
  require_struct(SBX_HAS_FIELD(&c, sbx_spec, labels), "sbx_spec");
  Spec spec;
  spec.image = optional_string(c.image);
  spec.ttl = optional_ms(c.ttl_ms);
  spec.ready_timeout = optional_ms(c.ready_timeout_ms);
  spec.workdir = optional_string(c.workdir);
  spec.env = to_key_values(c.env);
  for (size_t i = 0; i < c.files.count; ++i) {
    const sbx_file& f = c.files.items[i];
    spec.files.push_back(
        {std::string(view(f.path)),
         std::string(reinterpret_cast<const char*>(f.contents.data), f.contents.len)});
  }
  spec.metadata = to_key_values(c.metadata);
  if (c.resources) {
    require_struct(SBX_HAS_FIELD(c.resources, sbx_resources, gpu_type), "sbx_resources");
    const sbx_resources& r = *c.resources;
    if (r.cpu.set) spec.resources.cpu = r.cpu.value;
    if (r.memory_mib.set) spec.resources.memory_mib = r.memory_mib.value;
    if (r.disk_gib.set) spec.resources.disk_gib = r.disk_gib.value;
    if (r.gpu.set) spec.resources.gpu = r.gpu.value;
    spec.resources.gpu_type = optional_string(r.gpu_type);
  }
  if (c.has_entrypoint) {
    std::vector<std::string> argv;
    for (size_t i = 0; i < c.entrypoint.count; ++i)
      argv.emplace_back(view(c.entrypoint.items[i]));
    spec.entrypoint = std::move(argv);
  }
  spec.ports.assign(c.ports.items, c.ports.items + c.ports.count);
  if (sbx_str_is_set(c.provider_options)) {
    spec.provider_options = json::parse_object(view(c.provider_options), "provider_options");
  }
  spec.labels = to_key_values(c.labels);
  return spec;
}

ExecRequest to_exec_request(const sbx_exec_request& c) {
  require_struct(SBX_HAS_FIELD(&c, sbx_exec_request, user), "sbx_exec_request");
  ExecRequest r;
  r.command = std::string(view(c.command));
  r.cwd = optional_string(c.cwd);
  r.env = to_key_values(c.env);
  r.timeout = optional_ms(c.timeout_ms);
  r.user = optional_string(c.user);
  return r;
}

KvListView::KvListView(const KeyValues& values) {
  items_.reserve(values.size());
  for (const auto& [k, v] : values)
    items_.push_back({to_sbx(k), to_sbx(v)});
}

}  // namespace sbx::sdk
