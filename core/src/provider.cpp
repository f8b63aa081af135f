// sbx::Provider: creating provider instances and sandboxes, and the list-and-reap extension.

#include "abi_glue.hpp"

#include <sbx/abi/ext/list_reap.h>
#include <sbx/core/provider.hpp>

#include <boost/json/serialize.hpp>

namespace sbx {
namespace detail {

std::shared_ptr<Generation> make_generation(std::shared_ptr<PluginLibrary> library,
                                            const sbx_provider_factory& factory,
                                            const ProviderBlock& block, const StringMap& labels) {
  auto generation = make_deferred_shared(new Generation());
  generation->library = std::move(library);
  generation->host = std::make_unique<HostBinding>("provider." + block.name);
  generation->name = block.name;
  generation->provider_id = factory.id;
  generation->plugin_path = generation->library->path().string();
  generation->default_metadata = block.default_metadata;
  generation->labels = labels;
  generation->labels["sbx.provider"] = block.name;

  const std::string config = boost::json::serialize(block.config);
  ErrorCollector errors;
  sbx_provider* provider = nullptr;
  const sbx_status status =
      factory.create(&factory, generation->host->get(), view_of(config), &provider, &errors.sink);
  if (status != SBX_STATUS_OK || !provider) {
    std::string why = errors.message.empty() ? "status " + std::to_string(status) : errors.message;
    // A plugin names JSON paths from its config's root ("$.root"); say where that root is.
    if (why.starts_with("$") && !block.config_path.empty()) {
      why = block.config_path + why.substr(1);
    }
    throw_error(status == SBX_STATUS_OK ? SBX_STATUS_INTERNAL : status,
                "provider '" + block.name + "' (" + factory.id + "): " + why);
  }
  if (!SBX_HAS_FIELD(provider, sbx_provider, destroy)) {
    // `destroy` is the table's last field, so it cannot be called either: the provider leaks.
    throw PluginLoadError("provider '" + block.name + "' (" + factory.id +
                          "): its function table is smaller than ABI 1.0 defines it");
  }
  generation->provider = provider;
  return generation;
}

namespace {

// Borrowed C views of a SandboxSpec, valid while this object lives.
class CSpec {
 public:
  CSpec(const SandboxSpec& spec, const StringMap& metadata, const StringMap& labels)
      : metadata_(metadata),
        labels_(labels),
        env_(spec.env),
        metadata_list_(metadata_),
        labels_list_(labels_),
        options_(boost::json::serialize(spec.provider_options)) {
    for (const auto& [path, contents] : spec.files) {
      files_.push_back(
          {view_of(path), {reinterpret_cast<const uint8_t*>(contents.data()), contents.size()}});
    }
    if (spec.entrypoint) {
      for (const auto& arg : *spec.entrypoint)
        entrypoint_.push_back(view_of(arg));
    }
    for (int64_t port : spec.ports)
      ports_.push_back(static_cast<uint16_t>(port));

    const Resources& r = spec.resources;
    resources_.struct_size = sizeof(sbx_resources);
    resources_.cpu = {r.cpu.has_value(), r.cpu.value_or(0)};
    resources_.memory_mib = {r.memory_mib.has_value(), r.memory_mib.value_or(0)};
    resources_.disk_gib = {r.disk_gib.has_value(), r.disk_gib.value_or(0)};
    resources_.gpu = {r.gpu.has_value(), r.gpu.value_or(0)};
    resources_.gpu_type = optional_view(r.gpu_type);
    const bool has_resources = r.cpu || r.memory_mib || r.disk_gib || r.gpu || r.gpu_type;

    c_.struct_size = sizeof(sbx_spec);
    c_.image = optional_view(spec.image);
    c_.ttl_ms = to_abi_ms(spec.ttl_s);
    c_.ready_timeout_ms = to_abi_ms(spec.ready_timeout_s);
    c_.workdir = optional_view(spec.workdir);
    c_.env = env_.get();
    c_.files = {files_.data(), files_.size()};
    c_.metadata = metadata_list_.get();
    c_.resources = has_resources ? &resources_ : nullptr;
    c_.has_entrypoint = spec.entrypoint.has_value();
    c_.entrypoint = {entrypoint_.data(), entrypoint_.size()};
    c_.ports = {ports_.data(), ports_.size()};
    c_.provider_options = view_of(options_);
    c_.labels = labels_list_.get();
  }
  const sbx_spec* get() const { return &c_; }

 private:
  StringMap metadata_;
  StringMap labels_;
  KvList env_;
  KvList metadata_list_;
  KvList labels_list_;
  std::string options_;
  std::vector<sbx_file> files_;
  std::vector<sbx_str> entrypoint_;
  std::vector<uint16_t> ports_;
  sbx_resources resources_{};
  sbx_spec c_{};
};

struct CreateCtx {
  std::shared_ptr<OpState<Sandbox>> state;
  std::shared_ptr<Generation> generation;
  std::optional<std::string> workdir;
  std::vector<int64_t> ports;

  static void SBX_ABI on_complete(void* user_data, sbx_sandbox* sandbox, const sbx_error* error) {
    CallbackScope scope;
    std::unique_ptr<CreateCtx> ctx(static_cast<CreateCtx*>(user_data));
    in_callback(*ctx->state, [&] {
      if (!sandbox) {
        ctx->state->fail(error ? to_error(*error) : InternalError("create failed"));
        return;
      }
      auto s = std::make_shared<SandboxState>();
      s->generation = ctx->generation;
      s->handle = sandbox;
      s->id = copy_of(sandbox->id);
      s->workdir = std::move(ctx->workdir);
      s->ports = std::move(ctx->ports);
      ctx->state->succeed(Sandbox(std::move(s)));
    });
  }
};

StringMap merged_metadata(const Generation& g, const StringMap& spec_metadata) {
  StringMap merged = g.default_metadata;  // block defaults under the spec's own keys
  for (const auto& [k, v] : spec_metadata)
    merged[k] = v;
  return merged;
}

// list and reap: items arrive one by one, then completion.
template <class Callbacks>
struct ListCtx {
  std::shared_ptr<OpState<std::vector<SandboxInfo>>> state;
  std::vector<SandboxInfo> items;

  static void SBX_ABI on_item(void* user_data, const sbx_sandbox_info* info) {
    CallbackScope scope;
    auto* ctx = static_cast<ListCtx*>(user_data);
    in_callback(*ctx->state, [&] {
      SandboxInfo item;
      item.id = copy_of(info->id);
      item.status = to_status(info->status);
      item.labels = copy_of(info->labels);
      item.created_unix_ms = info->created_unix_ms;
      ctx->items.push_back(std::move(item));
    });
  }
  static void SBX_ABI on_complete(void* user_data, const sbx_error* error) {
    CallbackScope scope;
    std::unique_ptr<ListCtx> ctx(static_cast<ListCtx*>(user_data));
    in_callback(*ctx->state, [&] {
      if (error) {
        ctx->state->fail(*error);
      } else {
        ctx->state->succeed(std::move(ctx->items));
      }
    });
  }
};

}  // namespace
}  // namespace detail

Provider::Provider(std::shared_ptr<detail::Generation> generation)
    : generation_(std::move(generation)) {}

const std::string& Provider::name() const {
  return generation_->name;
}
const std::string& Provider::provider_id() const {
  return generation_->provider_id;
}
const std::string& Provider::plugin_path() const {
  return generation_->plugin_path;
}

Operation<Sandbox> Provider::create_async(SandboxSpec spec) const {
  spec.validate();
  auto ctx = std::make_unique<detail::CreateCtx>();
  ctx->generation = generation_;
  ctx->workdir = spec.workdir;
  ctx->ports = spec.ports;
  const detail::CSpec c_spec(spec, detail::merged_metadata(*generation_, spec.metadata),
                             generation_->labels);
  sbx_provider* p = generation_->provider;
  return detail::start_operation<Sandbox>(generation_, std::move(ctx), [&](detail::CreateCtx* raw) {
    const sbx_create_callbacks callbacks{sizeof(sbx_create_callbacks), raw,
                                         &detail::CreateCtx::on_complete};
    return p->create(p, c_spec.get(), &callbacks);
  });
}

Sandbox Provider::create(SandboxSpec spec) const {
  return create_async(std::move(spec)).get();
}

bool Provider::supports(std::string_view extension_id) const {
  const std::string id(extension_id);
  return generation_->extension(id.c_str()) != nullptr;
}

namespace {

template <class Callbacks, class Start>
std::vector<SandboxInfo> list_or_reap(const std::shared_ptr<detail::Generation>& g,
                                      const StringMap& selector, Start start) {
  const auto* ext = static_cast<const sbx_provider_list_reap*>(g->extension(SBX_EXT_LIST_REAP));
  if (!ext || !SBX_HAS_FIELD(ext, sbx_provider_list_reap, reap)) {
    throw UnimplementedError("provider '" + g->name + "' does not support listing and reaping");
  }
  using Ctx = detail::ListCtx<Callbacks>;
  const detail::KvList kv(selector);
  return detail::start_operation<std::vector<SandboxInfo>>(
             g, std::make_unique<Ctx>(),
             [&](Ctx* raw) {
               const Callbacks callbacks{sizeof(Callbacks), raw, &Ctx::on_item, &Ctx::on_complete};
               return start(*ext, g->provider, kv.get(), &callbacks);
             })
      .get();
}

}  // namespace

std::vector<SandboxInfo> Provider::list(const StringMap& selector) const {
  return list_or_reap<sbx_list_callbacks>(
      generation_, selector,
      [](const sbx_provider_list_reap& ext, sbx_provider* p, sbx_kv_list sel,
         const sbx_list_callbacks* cb) { return ext.list(p, sel, cb); });
}

std::vector<SandboxInfo> Provider::reap(const StringMap& selector) const {
  return list_or_reap<sbx_reap_callbacks>(
      generation_, selector,
      [](const sbx_provider_list_reap& ext, sbx_provider* p, sbx_kv_list sel,
         const sbx_reap_callbacks* cb) { return ext.reap(p, sel, cb); });
}

}  // namespace sbx
