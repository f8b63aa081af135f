// sbx::Provider: creating provider instances and sandboxes, and the list-and-reap extension.

#include "abi_glue.hpp"
#include "calls.hpp"

#include <sbx/abi/ext/connect.h>
#include <sbx/abi/ext/list_reap.h>
#include <sbx/core/provider.hpp>

#include <boost/json.hpp>

namespace sbx {
namespace detail {

std::shared_ptr<Generation> make_generation(std::shared_ptr<PluginLibrary> library,
                                            const sbx_provider_factory& factory,
                                            const ProviderBlock& block, const StringMap& labels,
                                            const Deadlines& deadlines) {
  auto generation = make_deferred_shared(new Generation());
  generation->deadlines = deadlines;
  generation->library = std::move(library);
  generation->host = std::make_unique<HostBinding>("provider." + block.name);
  generation->name = block.name;
  generation->provider_id = factory.id;
  generation->plugin_path = generation->library->path().string();
  generation->default_metadata = block.default_metadata;
  generation->labels = labels;
  generation->labels["sbx.provider"] = block.name;
  generation->serial = register_generation(generation);

  const std::string config = boost::json::serialize(block.config);
  ErrorCollector errors;
  sbx_provider* provider = nullptr;
  const sbx_status status =
      factory.create(&factory, generation->host->get(), view_of(config), &provider, &errors.sink);
  if (status != SBX_STATUS_OK || !provider) {
    std::string why =
        !errors.message.empty() ? errors.message
        : status == SBX_STATUS_OK
            ? "its factory returned OK but no provider"
            : "its factory failed with " + std::string(sbx_status_name(status)) + " and no message";
    // A plugin names JSON paths from its config's root ("$.root"); say where that root is.
    if (why.starts_with("$") && !block.config_path.empty()) {
      why = block.config_path + why.substr(1);
    }
    const std::string message = "provider '" + block.name + "' (" + factory.id + "): " + why;
    // A config the provider refuses is the user's config error, as one the host refuses is: the
    // same error (and the same exit status of every command).
    if (status == SBX_STATUS_INVALID_ARGUMENT) throw ConfigError(message);
    throw_error(status == SBX_STATUS_OK ? SBX_STATUS_INTERNAL : status, message);
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
    c_.env = env_.list();
    c_.files = {files_.data(), files_.size()};
    c_.metadata = metadata_list_.list();
    c_.resources = has_resources ? &resources_ : nullptr;
    c_.has_entrypoint = spec.entrypoint.has_value();
    c_.entrypoint = {entrypoint_.data(), entrypoint_.size()};
    c_.ports = {ports_.data(), ports_.size()};
    c_.provider_options = view_of(options_);
    c_.labels = labels_list_.list();
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

// A sandbox handed over by a create (or connect) that had completed already: owned by the host like
// any other. One from a create is closed and released; one from a connect only released, since that
// call did not make it. Nothing can be done if its provider no longer exists.
void adopt_stray(void* token, sbx_sandbox* sandbox, bool close) {
  auto generation = calls::generation_of(token);
  if (!generation) return;
  auto s = make_deferred_shared(new SandboxState(std::move(generation), sandbox));
  s->id = SBX_HAS_FIELD(sandbox, sbx_sandbox, sandbox_data) ? copy_of(sandbox->id) : "?";
  logger()->warn("{} handed over sandbox {} by a second completion; {} it",
                 describe(*s->generation), s->id, close ? "closing" : "releasing");
  Sandbox stray(std::move(s));  // closes it when dropped (without waiting, in this callback)
  if (!close) stray.detach();
}

// Takes ownership of a sandbox a create or connect handed over. When it cannot be used (a short
// struct, an id that is empty or not UTF-8), `unusable` says why; the Sandbox made from the state
// then only closes and releases it.
std::shared_ptr<SandboxState> adopt(const std::shared_ptr<Generation>& generation,
                                    sbx_sandbox* sandbox, const char* call,
                                    std::optional<Error>& unusable) {
  auto s = make_deferred_shared(new SandboxState(generation, sandbox));
  const std::string who = describe(*generation) + " " + call + " a sandbox whose ";
  if (!SBX_HAS_FIELD(sandbox, sbx_sandbox, sandbox_data)) {
    unusable = InternalError(who + "sbx_sandbox has " + std::to_string(sandbox->struct_size) +
                             " bytes, smaller than ABI 1.0 defines; it was closed");
    s->id = "(unreadable id)";
    return s;
  }
  s->id = copy_of(sandbox->id);
  if (s->id.empty() || !base::utf8::valid(s->id)) {
    unusable = InternalError(who + "id is " + (s->id.empty() ? "empty" : "not valid UTF-8") +
                             "; it was closed");
  }
  return s;
}

struct CreateCtx : CallCtx {
  static constexpr CallKind kKind = CallKind::create;
  CreateCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<Sandbox>> state;
  std::shared_ptr<Generation> generation;
  std::optional<std::string> workdir;
  std::vector<int64_t> ports;

  // A sandbox handed over is owned by the host whatever happens next: one that cannot be used or
  // that arrives after the host gave up on the create is closed and released, never dropped.
  static void SBX_ABI on_complete(void* token, sbx_sandbox* sandbox, const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<CreateCtx> ctx = calls::complete<CreateCtx>(token, "on_complete");
    if (!ctx) {
      if (sandbox) adopt_stray(token, sandbox, true);
      return;
    }
    if (!sandbox) {
      if (calls::late(*ctx)) return;
      in_callback(*ctx->state,
                  [&] { ctx->state->fail(plugin_error(*ctx->generation, error, "create")); });
      return;
    }
    std::optional<Error> unusable;
    auto s = adopt(ctx->generation, sandbox, "created", unusable);
    s->workdir = std::move(ctx->workdir);
    s->ports = std::move(ctx->ports);
    Sandbox box(std::move(s));  // closes the sandbox when dropped below, unless handed on
    if (calls::late(*ctx)) return;
    in_callback(*ctx->state, [&] {
      if (unusable) return ctx->state->fail(*unusable);
      ctx->state->succeed(std::move(box));
    });
  }
};

// As create; the workdir and ports come from the provider, which knows how the sandbox was made.
struct ConnectCtx : CallCtx {
  static constexpr CallKind kKind = CallKind::connect;
  ConnectCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<Sandbox>> state;
  std::shared_ptr<Generation> generation;

  static void SBX_ABI on_complete(void* token, sbx_sandbox* sandbox,
                                  const sbx_connected_sandbox* info, const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<ConnectCtx> ctx = calls::complete<ConnectCtx>(token, "on_complete");
    if (!ctx) {
      if (sandbox) adopt_stray(token, sandbox, false);
      return;
    }
    if (!sandbox) {
      if (calls::late(*ctx)) return;
      in_callback(*ctx->state,
                  [&] { ctx->state->fail(plugin_error(*ctx->generation, error, "connect")); });
      return;
    }
    std::optional<Error> unusable;
    auto s = adopt(ctx->generation, sandbox, "connected", unusable);
    if (!unusable && (!info || !SBX_HAS_FIELD(info, sbx_connected_sandbox, ports) ||
                      (info->ports.count && !info->ports.items))) {
      unusable = InternalError(describe(*ctx->generation) +
                               " connected a sandbox without a usable sbx_connected_sandbox");
    } else if (!unusable) {
      if (info->workdir.data) s->workdir = base::utf8::sanitize(copy_of(info->workdir));
      s->ports.assign(info->ports.items, info->ports.items + info->ports.count);
    }
    // A connected sandbox that cannot be used, or that nobody waits for any more, is released
    // but not closed: this call did not make it.
    Sandbox box(std::move(s));
    if (unusable || calls::late(*ctx)) box.detach();
    if (calls::late(*ctx)) return;
    in_callback(*ctx->state, [&] {
      if (unusable) return ctx->state->fail(*unusable);
      ctx->state->succeed(std::move(box));
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
template <class Callbacks, CallKind K>
struct ListCtx : CallCtx {
  static constexpr CallKind kKind = K;
  ListCtx() : CallCtx(kKind) {}
  std::shared_ptr<OpState<std::vector<SandboxInfo>>> state;
  std::mutex mutex;
  std::vector<SandboxInfo> items;

  static void SBX_ABI on_item(void* token, const sbx_sandbox_info* info) {
    CallbackScope scope;
    const std::shared_ptr<ListCtx> ctx = calls::find<ListCtx>(token, "on_item");
    if (!ctx || ctx->state->ready()) return;
    in_callback(*ctx->state, [&] {
      const Generation& g = *ctx->state->generation();
      if (!info || !SBX_HAS_FIELD(info, sbx_sandbox_info, created_unix_ms)) {
        throw InternalError(describe(g) + " listed a sandbox in an sbx_sandbox_info smaller " +
                            "than ABI 1.0 defines");
      }
      SandboxInfo item;
      item.id = base::utf8::sanitize(copy_of(info->id));
      item.status = to_status(info->status);
      for (auto& [k, v] : copy_of(info->labels))
        item.labels.emplace(base::utf8::sanitize(k), base::utf8::sanitize(v));
      item.created_unix_ms = info->created_unix_ms;
      std::lock_guard lock(ctx->mutex);
      ctx->items.push_back(std::move(item));
    });
  }
  static void SBX_ABI on_complete(void* token, const sbx_error* error) {
    CallbackScope scope;
    const std::shared_ptr<ListCtx> ctx = calls::complete<ListCtx>(token, "on_complete");
    if (!ctx || calls::late(*ctx)) return;
    in_callback(*ctx->state, [&] {
      if (error) {
        ctx->state->fail(plugin_error(*ctx->state->generation(), error, ctx->state->kind()));
        return;
      }
      std::lock_guard lock(ctx->mutex);
      ctx->state->succeed(std::move(ctx->items));
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
  auto ctx = std::make_shared<detail::CreateCtx>();
  ctx->generation = generation_;
  ctx->workdir = spec.workdir;
  ctx->ports = spec.ports;
  const detail::CSpec c_spec(spec, detail::merged_metadata(*generation_, spec.metadata),
                             generation_->labels);
  sbx_provider* p = generation_->provider;
  const Deadlines& d = generation_->deadlines;
  detail::OpDeadline deadline{d.create(), detail::OpDeadline::From::start,
                              "the host's limit for a create"};
  if (spec.ready_timeout_s && Deadlines::ms(*spec.ready_timeout_s) + d.grace() > d.create()) {
    deadline.after = Deadlines::ms(*spec.ready_timeout_s) + d.grace();
    deadline.why = "its ready_timeout_s plus the host's grace";
  }
  return detail::start_operation<Sandbox>(generation_, std::move(ctx), deadline, [&](void* token) {
    const sbx_create_callbacks callbacks{sizeof(sbx_create_callbacks), token,
                                         &detail::CreateCtx::on_complete};
    return p->create(p, c_spec.get(), &callbacks);
  });
}

Sandbox Provider::create(SandboxSpec spec) const {
  return create_async(std::move(spec)).get();
}

Operation<Sandbox> Provider::connect_async(std::string descriptor) const {
  const detail::Generation& g = *generation_;
  const auto* ext = static_cast<const sbx_provider_connect*>(g.extension(SBX_EXT_CONNECT));
  if (!ext || !SBX_HAS_FIELD(ext, sbx_provider_connect, connect) || !ext->connect) {
    throw UnimplementedError("provider '" + g.name + "' does not support serialize()/connect() (" +
                             SBX_EXT_CONNECT + ")");
  }
  // What every provider would refuse alike is refused here, with the same words for all.
  detail::require_utf8(descriptor, "the descriptor");
  boost::system::error_code ec;
  const boost::json::value parsed = boost::json::parse(descriptor, ec);
  if (ec || !parsed.is_object()) {
    throw InvalidArgumentError("the descriptor is not a JSON object" +
                               (ec ? " (" + ec.message() + ")" : std::string()));
  }
  const auto& o = parsed.get_object();
  if (const auto* format = o.if_contains("format");
      format && (!format->is_string() || format->get_string() != SBX_DESCRIPTOR_FORMAT)) {
    throw InvalidArgumentError("the descriptor's format is " + boost::json::serialize(*format) +
                               "; this host reads \"" SBX_DESCRIPTOR_FORMAT "\"");
  }
  if (const auto* provider = o.if_contains("provider");
      provider && (!provider->is_string() || provider->get_string() != g.provider_id)) {
    throw InvalidArgumentError("the descriptor is of provider " +
                               boost::json::serialize(*provider) + ", not of '" + g.provider_id +
                               "' (provider '" + g.name + "')");
  }
  const auto* id = o.if_contains("sandbox_id");
  if (!id || !id->is_string() || id->get_string().empty()) {
    throw InvalidArgumentError("the descriptor has no \"sandbox_id\"");
  }
  auto ctx = std::make_shared<detail::ConnectCtx>();
  ctx->generation = generation_;
  sbx_provider* p = generation_->provider;
  const detail::OpDeadline deadline{g.deadlines.call(), detail::OpDeadline::From::start,
                                    "the host's limit for this call"};
  return detail::start_operation<Sandbox>(generation_, std::move(ctx), deadline, [&](void* token) {
    const sbx_connect_callbacks callbacks{sizeof(sbx_connect_callbacks), token,
                                          &detail::ConnectCtx::on_complete};
    return ext->connect(p, detail::view_of(descriptor), &callbacks);
  });
}

Sandbox Provider::connect(std::string_view descriptor) const {
  return connect_async(std::string(descriptor)).get();
}

bool Provider::supports(std::string_view extension_id) const {
  const std::string id(extension_id);
  return generation_->extension(id.c_str()) != nullptr;
}

namespace {

template <class Callbacks, detail::CallKind K, class Start>
std::vector<SandboxInfo> list_or_reap(const std::shared_ptr<detail::Generation>& g,
                                      const StringMap& selector, Start start) {
  const auto* ext = static_cast<const sbx_provider_list_reap*>(g->extension(SBX_EXT_LIST_REAP));
  if (!ext || !SBX_HAS_FIELD(ext, sbx_provider_list_reap, reap) || !ext->list || !ext->reap) {
    throw UnimplementedError("provider '" + g->name + "' does not support listing and reaping");
  }
  using Ctx = detail::ListCtx<Callbacks, K>;
  const detail::KvList kv(selector);
  const detail::OpDeadline deadline{g->deadlines.call(), detail::OpDeadline::From::start,
                                    "the host's limit for this call"};
  return detail::start_operation<std::vector<SandboxInfo>>(
             g, std::make_shared<Ctx>(), deadline,
             [&](void* token) {
               const Callbacks callbacks{sizeof(Callbacks), token, &Ctx::on_item,
                                         &Ctx::on_complete};
               return start(*ext, g->provider, kv.list(), &callbacks);
             })
      .get();
}

}  // namespace

std::vector<SandboxInfo> Provider::list(const StringMap& selector) const {
  return list_or_reap<sbx_list_callbacks, detail::CallKind::list>(
      generation_, selector,
      [](const sbx_provider_list_reap& ext, sbx_provider* p, sbx_kv_list sel,
         const sbx_list_callbacks* cb) { return ext.list(p, sel, cb); });
}

std::vector<SandboxInfo> Provider::reap(const StringMap& selector) const {
  return list_or_reap<sbx_reap_callbacks, detail::CallKind::reap>(
      generation_, selector,
      [](const sbx_provider_list_reap& ext, sbx_provider* p, sbx_kv_list sel,
         const sbx_reap_callbacks* cb) { return ext.reap(p, sel, cb); });
}

}  // namespace sbx
