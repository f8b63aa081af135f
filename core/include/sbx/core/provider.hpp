// sbx::Provider: a configured provider (a named config block bound to a plugin's provider kind).
// Cheap to copy; copies share the provider instance. The plugin stays loaded while any Provider,
// Sandbox or Operation from it lives.
#pragma once

#include <sbx/core/operation.hpp>
#include <sbx/core/sandbox.hpp>
#include <sbx/core/spec.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sbx {

namespace detail {
struct Generation;
}

class Provider {
 public:
  Provider() = default;
  explicit Provider(std::shared_ptr<detail::Generation> generation);

  bool valid() const noexcept { return generation_ != nullptr; }
  const std::string& name() const;         // the config block's name
  const std::string& provider_id() const;  // the plugin's provider kind, e.g. "local_docker"
  const std::string& plugin_path() const;

  // Creates a ready sandbox: validates the spec, merges the block's default_metadata under the
  // spec's metadata, passes the host labels down, and returns once the provider reports it ready
  // with its startup files in place. Throws CreateError / CreateVerificationError (or a more
  // specific error, e.g. InvalidArgumentError for a bad spec).
  Sandbox create(SandboxSpec spec) const;
  Operation<Sandbox> create_async(SandboxSpec spec) const;

  // sbx.connect/1: a working Sandbox for a descriptor from Sandbox::serialize() (or, for providers
  // that can find the rest themselves, such as local_docker, {"sandbox_id": "..."}). The Sandbox
  // owns the sandbox like one from create(). InvalidArgumentError for a malformed descriptor or one
  // of another provider, NotFoundError for a sandbox that is gone, UnimplementedError when the
  // provider cannot connect.
  Sandbox connect(std::string_view descriptor) const;
  Operation<Sandbox> connect_async(std::string descriptor) const;

  // Extensions by id (e.g. "sbx.endpoint/1").
  bool supports(std::string_view extension_id) const;

  // sbx.list-reap/1: sandboxes of this provider whose labels match every selector pair.
  std::vector<SandboxInfo> list(const StringMap& selector) const;
  std::vector<SandboxInfo> reap(const StringMap& selector) const;

 private:
  std::shared_ptr<detail::Generation> generation_;
};

}  // namespace sbx
