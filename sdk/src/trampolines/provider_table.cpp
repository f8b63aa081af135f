// The provider table: the sbx_provider and extension tables the host calls, each entry starting
// one operation on the C++ Provider through start_operation(); the sandboxes handed to the host.

#include "operations.hpp"

#include <mutex>
#include <unordered_set>

namespace sbx::sdk::detail {

struct ProviderBox {
  sbx_provider c{};
  std::unique_ptr<Provider> impl;
  Logger log;
  EndpointExtension* endpoint = nullptr;
  ListReapExtension* list_reap = nullptr;
  PauseExtension* pause = nullptr;
  ConnectExtension* connect = nullptr;
  RenewExtension* renew = nullptr;
  SessionExtension* session = nullptr;
  PtyExtension* pty = nullptr;
  bool host_knows_paused = false;  // the host's ABI is 1.1 or later

  // The sandboxes handed to the host and not released yet: a handle is looked up here before it is
  // dereferenced, so that a released (or foreign) handle is reported, not used.
  std::mutex sandboxes_mutex;
  std::unordered_set<const sbx_sandbox*> sandboxes;

  static ProviderBox& from(const sbx_provider* p) {
    return *static_cast<ProviderBox*>(p->provider_data);
  }
};

ProviderBox& provider_of(const sbx_provider* p) {
  return ProviderBox::from(p);
}
const Logger& log_of(const sbx_provider* p) {
  return ProviderBox::from(p).log;
}
Provider& impl_of(const sbx_provider* p) {
  return *ProviderBox::from(p).impl;
}
SessionExtension& session_of(const sbx_provider* p) {
  return *ProviderBox::from(p).session;
}
PtyExtension& pty_of(const sbx_provider* p) {
  return *ProviderBox::from(p).pty;
}

SandboxBox* adopt_sandbox(const sbx_provider* p, std::unique_ptr<Sandbox> sandbox) {
  auto box = std::make_unique<SandboxBox>(std::move(sandbox));
  ProviderBox& provider = ProviderBox::from(p);
  std::lock_guard lock(provider.sandboxes_mutex);
  provider.sandboxes.insert(&box->c);
  return box.release();
}

Sandbox& sandbox_of(const sbx_provider* p, sbx_sandbox* s) {
  ProviderBox& provider = ProviderBox::from(p);
  {
    std::lock_guard lock(provider.sandboxes_mutex);
    if (s && provider.sandboxes.count(s)) return *static_cast<SandboxBox*>(s->sandbox_data)->impl;
  }
  const char* what = s ? "a sandbox handle this provider did not give out, or used after "
                         "release_sandbox"
                       : "a NULL sandbox handle";
  checks::violation(provider.log.host(), std::string("an operation on ") + what);
  throw Error::failed_precondition(std::string("the host passed ") + what);
}

namespace {

sbx_operation* SBX_ABI provider_create(sbx_provider* p, const sbx_spec* spec,
                                       const sbx_create_callbacks* cb) {
  return start_operation<CreateOp>(
      p, "create", cb,
      [&](CreateOp&, Completion<std::unique_ptr<Sandbox>> done) {
        if (!spec) throw Error::invalid_argument("create needs a spec");
        Spec copy = to_spec(*spec);
        impl_of(p).create(std::move(copy), std::move(done));
      },
      p);
}

sbx_operation* SBX_ABI provider_status(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_status_callbacks* cb) {
  return start_operation<StatusOp>(
      p, "status", cb,
      [&](StatusOp&, Completion<SandboxStatus> done) {
        impl_of(p).status(sandbox_of(p, s), std::move(done));
      },
      ProviderBox::from(p).host_knows_paused);
}

sbx_operation* SBX_ABI provider_close(sbx_provider* p, sbx_sandbox* s,
                                      const sbx_done_callbacks* cb) {
  return start_operation<DoneOp>(p, "close", cb, [&](DoneOp&, Completion<void> done) {
    impl_of(p).close(sandbox_of(p, s), std::move(done));
  });
}

void SBX_ABI provider_release_sandbox(sbx_provider* p, sbx_sandbox* s) {
  ProviderBox& provider = ProviderBox::from(p);
  {
    std::lock_guard lock(provider.sandboxes_mutex);
    if (s && provider.sandboxes.erase(s) == 1) {
      delete static_cast<SandboxBox*>(s->sandbox_data);
      return;
    }
  }
  checks::violation(provider.log.host(),
                    s ? "release_sandbox of a sandbox already released (or never given out by "
                        "this provider); ignored"
                      : "release_sandbox of a NULL sandbox; ignored");
}

sbx_operation* SBX_ABI endpoint_get(sbx_provider* p, sbx_sandbox* s, uint16_t port,
                                    const sbx_endpoint_callbacks* cb) {
  return start_operation<EndpointOp>(
      p, "sbx.endpoint/1 endpoint", cb, [&](EndpointOp&, Completion<Endpoint> done) {
        ProviderBox::from(p).endpoint->endpoint(sandbox_of(p, s), port, std::move(done));
      });
}

template <class Callbacks, bool kReap>
sbx_operation* SBX_ABI list_or_reap(sbx_provider* p, sbx_kv_list selector, const Callbacks* cb) {
  return start_operation<InfoListOp<Callbacks>>(
      p, kReap ? "sbx.list-reap/1 reap" : "sbx.list-reap/1 list", cb,
      [&](InfoListOp<Callbacks>&, Completion<std::vector<SandboxInfo>> done) {
        auto& ext = *ProviderBox::from(p).list_reap;
        if constexpr (kReap) {
          ext.reap(to_key_values(selector), std::move(done));
        } else {
          ext.list(to_key_values(selector), std::move(done));
        }
      });
}

// sbx.pause/1: both directions complete like close.
template <bool kPause>
sbx_operation* SBX_ABI pause_or_resume(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_done_callbacks* cb) {
  return start_operation<DoneOp>(p, kPause ? "sbx.pause/1 pause" : "sbx.pause/1 resume", cb,
                                 [&](DoneOp&, Completion<void> done) {
                                   Sandbox& sandbox = sandbox_of(p, s);
                                   auto& ext = *ProviderBox::from(p).pause;
                                   if constexpr (kPause) {
                                     ext.pause(sandbox, std::move(done));
                                   } else {
                                     ext.resume(sandbox, std::move(done));
                                   }
                                 });
}

sbx_operation* SBX_ABI connect_serialize(sbx_provider* p, sbx_sandbox* s,
                                         const sbx_descriptor_callbacks* cb) {
  return start_operation<DescriptorOp>(
      p, "sbx.connect/1 serialize", cb, [&](DescriptorOp&, Completion<std::string> done) {
        ProviderBox::from(p).connect->serialize(sandbox_of(p, s), std::move(done));
      });
}

sbx_operation* SBX_ABI connect_connect(sbx_provider* p, sbx_str descriptor,
                                       const sbx_connect_callbacks* cb) {
  return start_operation<ConnectOp>(
      p, "sbx.connect/1 connect", cb,
      [&](ConnectOp&, Completion<Connected> done) {
        ProviderBox::from(p).connect->connect(text(descriptor, "the descriptor"), std::move(done));
      },
      p);
}

sbx_operation* SBX_ABI renew_renew(sbx_provider* p, sbx_sandbox* s, int64_t expires_at_unix_ms,
                                   const sbx_renew_callbacks* cb) {
  return start_operation<RenewOp>(
      p, "sbx.renew/1 renew", cb, [&](RenewOp&, Completion<int64_t> done) {
        ProviderBox::from(p).renew->renew(sandbox_of(p, s), expires_at_unix_ms, std::move(done));
      });
}

// sbx.flow/1: every exec of an SDK provider can be asked; whether its output can be held is the
// exec's (ExecCompletion::on_hold, hold_by_blocking_writes).
bool SBX_ABI flow_hold_output(sbx_provider*, sbx_operation* op, bool hold) {
  OpBase* target = OpBase::of_host_handle(
      op, "sbx.flow/1 hold_output on an operation handle the host does not hold");
  return target && target->hold_output(hold);
}

const sbx_provider_flow kFlowTable{sizeof(sbx_provider_flow), &flow_hold_output};
const sbx_provider_endpoint kEndpointTable{sizeof(sbx_provider_endpoint), &endpoint_get};
const sbx_provider_pause kPauseTable{sizeof(sbx_provider_pause), &pause_or_resume<true>,
                                     &pause_or_resume<false>};
const sbx_provider_connect kConnectTable{sizeof(sbx_provider_connect), &connect_serialize,
                                         &connect_connect};
const sbx_provider_renew kRenewTable{sizeof(sbx_provider_renew), &renew_renew};
const sbx_provider_list_reap kListReapTable{sizeof(sbx_provider_list_reap),
                                            &list_or_reap<sbx_list_callbacks, false>,
                                            &list_or_reap<sbx_reap_callbacks, true>};

const void* SBX_ABI provider_get_extension(const sbx_provider* p, const char* id) {
  if (!id) return nullptr;
  const ProviderBox& box = ProviderBox::from(p);
  const std::string_view name(id);
  if (name == SBX_EXT_FLOW) return &kFlowTable;
  if (name == SBX_EXT_ENDPOINT && box.endpoint) return &kEndpointTable;
  if (name == SBX_EXT_LIST_REAP && box.list_reap) return &kListReapTable;
  if (name == SBX_EXT_PAUSE && box.pause) return &kPauseTable;
  if (name == SBX_EXT_CONNECT && box.connect) return &kConnectTable;
  if (name == SBX_EXT_RENEW && box.renew) return &kRenewTable;
  if (name == SBX_EXT_SESSION && box.session) return &kSessionTable;
  if (name == SBX_EXT_PTY && box.pty) return &kPtyTable;
  return nullptr;
}

void SBX_ABI provider_destroy(sbx_provider* p) {
  delete &ProviderBox::from(p);
}

}  // namespace

sbx_provider* make_c_provider(std::unique_ptr<Provider> provider, Logger log,
                              bool host_knows_paused) {
  auto box = std::make_unique<ProviderBox>();
  box->endpoint = provider->endpoint_extension();
  box->list_reap = provider->list_reap_extension();
  box->pause = provider->pause_extension();
  box->connect = provider->connect_extension();
  box->renew = provider->renew_extension();
  box->session = provider->session_extension();
  box->pty = provider->pty_extension();
  box->host_knows_paused = host_knows_paused;
  box->impl = std::move(provider);
  box->log = log;
  sbx_provider& c = box->c;
  c.struct_size = sizeof(sbx_provider);
  c.provider_data = box.get();
  c.create = &provider_create;
  c.exec = &provider_exec;
  c.upload = &provider_upload;
  c.download = &provider_download;
  c.status = &provider_status;
  c.close = &provider_close;
  c.release_sandbox = &provider_release_sandbox;
  c.get_extension = &provider_get_extension;
  c.destroy = &provider_destroy;
  return &box.release()->c;
}

}  // namespace sbx::sdk::detail
