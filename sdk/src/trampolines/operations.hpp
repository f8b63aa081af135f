// The operations of the provider table (provider_table.cpp): each turns the provider's outcome
// into the host's on_complete call. Exec's operation is in exec.cpp, upload's and download's in
// streams.cpp. OWNERSHIP: each copies the host's callbacks struct; user_data stays the host's.
#pragma once

#include "internal.hpp"

#include <optional>
#include <vector>

namespace sbx::sdk::detail {

// Hands the host a new sandbox (create) or reports why there is none.
class CreateOp final : public Op<std::unique_ptr<Sandbox>> {
 public:
  CreateOp(const sbx_create_callbacks* cb, const sbx_provider* p) : cb_(*cb), p_(p) {}
  void deliver_value(std::unique_ptr<Sandbox>&& sandbox) noexcept override {
    if (!sandbox) return deliver_error(Error::internal("the provider created no sandbox"));
    SandboxBox* box;
    try {
      box = adopt_sandbox(p_, std::move(sandbox));
    } catch (...) {
      return deliver_error(current_exception_to_error());
    }
    cb_.on_complete(cb_.user_data, &box->c, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, e); });
  }

 private:
  sbx_create_callbacks cb_;
  const sbx_provider* p_;
};

class DoneOp final : public Op<void> {
 public:
  explicit DoneOp(const sbx_done_callbacks* cb) : cb_(*cb) {}
  void deliver_value() noexcept override { cb_.on_complete(cb_.user_data, nullptr); }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, e); });
  }

 private:
  sbx_done_callbacks cb_;
};

class StatusOp final : public Op<SandboxStatus> {
 public:
  // `host_knows_paused`: the host's ABI is 1.1 or later; a 1.0 host hears RUNNING for PAUSED.
  StatusOp(const sbx_status_callbacks* cb, bool host_knows_paused)
      : cb_(*cb), host_knows_paused_(host_knows_paused) {}
  void deliver_value(SandboxStatus&& status) noexcept override {
    if (status == SandboxStatus::paused && !host_knows_paused_) status = SandboxStatus::running;
    cb_.on_complete(cb_.user_data, static_cast<int32_t>(status), nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(
        error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, SBX_SANDBOX_UNKNOWN, e); });
  }

 private:
  sbx_status_callbacks cb_;
  bool host_knows_paused_;
};

// Completes with a string: a descriptor (sbx.connect/1), a session's or a terminal's id.
template <class Callbacks>
class StringOp final : public Op<std::string> {
 public:
  explicit StringOp(const Callbacks* cb) : cb_(*cb) {}
  void deliver_value(std::string&& descriptor) noexcept override {
    cb_.on_complete(cb_.user_data, to_sbx(descriptor), nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) {
      cb_.on_complete(cb_.user_data, sbx_str{nullptr, 0}, e);
    });
  }

 private:
  Callbacks cb_;
};
using DescriptorOp = StringOp<sbx_descriptor_callbacks>;
using SessionIdOp = StringOp<sbx_session_callbacks>;

// As CreateOp: a sandbox handed over is the host's; with it, what the host must know of it.
class ConnectOp final : public Op<Connected> {
 public:
  ConnectOp(const sbx_connect_callbacks* cb, const sbx_provider* p) : cb_(*cb), p_(p) {}
  void deliver_value(Connected&& connected) noexcept override {
    if (!connected.sandbox)
      return deliver_error(Error::internal("the provider connected no sandbox"));
    SandboxBox* box;
    try {
      box = adopt_sandbox(p_, std::move(connected.sandbox));
    } catch (...) {
      return deliver_error(current_exception_to_error());
    }
    const sbx_connected_sandbox info{
        sizeof(sbx_connected_sandbox),
        connected.workdir ? to_sbx(*connected.workdir) : sbx_str{nullptr, 0},
        {connected.ports.data(), connected.ports.size()}};
    cb_.on_complete(cb_.user_data, &box->c, &info, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error,
                 [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, nullptr, e); });
  }

 private:
  sbx_connect_callbacks cb_;
  const sbx_provider* p_;
};

class RenewOp final : public Op<int64_t> {
 public:
  explicit RenewOp(const sbx_renew_callbacks* cb) : cb_(*cb) {}
  void deliver_value(int64_t&& expires_at) noexcept override {
    cb_.on_complete(cb_.user_data, expires_at, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, 0, e); });
  }

 private:
  sbx_renew_callbacks cb_;
};

class EndpointOp final : public Op<Endpoint> {
 public:
  explicit EndpointOp(const sbx_endpoint_callbacks* cb) : cb_(*cb) {}
  void deliver_value(Endpoint&& endpoint) noexcept override {
    std::optional<KvListView> headers;
    try {
      headers.emplace(endpoint.headers);
    } catch (...) {
      return deliver_error(current_exception_to_error());
    }
    const sbx_endpoint c{sizeof(sbx_endpoint), to_sbx(endpoint.url), headers->list()};
    cb_.on_complete(cb_.user_data, &c, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, nullptr, e); });
  }

 private:
  sbx_endpoint_callbacks cb_;
};

// list and reap share a shape: items, then completion.
template <class Callbacks>
class InfoListOp final : public Op<std::vector<SandboxInfo>> {
 public:
  explicit InfoListOp(const Callbacks* cb) : cb_(*cb) {}
  void deliver_value(std::vector<SandboxInfo>&& items) noexcept override {
    try {
      for (const SandboxInfo& info : items) {
        const KvListView labels(info.labels);
        const sbx_sandbox_info c{sizeof(sbx_sandbox_info), to_sbx(info.id),
                                 static_cast<int32_t>(info.status), labels.list(),
                                 info.created_unix_ms};
        if (cb_.on_item) cb_.on_item(cb_.user_data, &c);
      }
    } catch (...) {
      return deliver_error(current_exception_to_error());
    }
    cb_.on_complete(cb_.user_data, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, e); });
  }

 private:
  Callbacks cb_;
};

}  // namespace sbx::sdk::detail
