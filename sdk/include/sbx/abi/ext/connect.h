/* sbx provider ABI extension "sbx.connect/1" (ABI 1.1): a sandbox handle as text, and back.
 *
 * NeMo Gym's ConnectableProvider. `serialize` turns a live handle into a descriptor; `connect` turns
 * a descriptor into a new, working handle, in this process or another one, on this host or another
 * one. Obtain with `provider->get_extension(provider, SBX_EXT_CONNECT)`; NULL means unsupported.
 * The table is plugin-owned and valid until the provider is destroyed.
 *
 * A descriptor is a JSON object (UTF-8 text) with at least:
 *   "format":     "sbx.descriptor/1"
 *   "provider":   the provider id that made it (sbx_provider_factory.id)
 *   "sandbox_id": the sandbox's id (sbx_sandbox.id)
 * and whatever else the provider needs to reach the sandbox again (documented by the provider;
 * never a secret: descriptors are printed and stored). A provider may accept less, for example
 * only {"sandbox_id": "..."} when it can find the rest in its backend (local_docker can).
 * `connect` refuses, with a message saying which:
 *   - text that is not a JSON object, or a "format" it does not know: SBX_STATUS_INVALID_ARGUMENT;
 *   - a "provider" other than its own id: SBX_STATUS_INVALID_ARGUMENT;
 *   - a sandbox that no longer exists in the backend: SBX_STATUS_NOT_FOUND.
 * Connecting does not create, restart or change the sandbox. Handles from `connect` are released
 * with `release_sandbox` like those from `create`; two handles to one sandbox may coexist, and
 * closing the sandbox through one makes the other's operations fail with SBX_STATUS_NOT_FOUND.
 */
#ifndef SBX_ABI_EXT_CONNECT_H
#define SBX_ABI_EXT_CONNECT_H

#include "../provider.h"

SBX_EXTERN_C_BEGIN

#define SBX_EXT_CONNECT "sbx.connect/1"
#define SBX_DESCRIPTOR_FORMAT "sbx.descriptor/1"

typedef struct sbx_descriptor_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; exactly once] `descriptor` (JSON text) is
   * BORROWED for the call and set when `error` is NULL. */
  void(SBX_ABI* on_complete)(void* user_data, sbx_str descriptor, const sbx_error* error);
} sbx_descriptor_callbacks;

/* What the host needs to know of a sandbox it did not create: the defaults a create would have
 * told it. BORROWED for the on_complete call that passes it. */
typedef struct sbx_connected_sandbox {
  uint32_t struct_size;
  sbx_str workdir;     /* the spec's workdir (the default cwd of exec); unset if none */
  sbx_port_list ports; /* the spec's declared ports (see ext/endpoint.h) */
} sbx_connected_sandbox;

typedef struct sbx_connect_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; exactly once] `sandbox` (now OWNED by the
   * host) and `info`, or an error and both NULL. */
  void(SBX_ABI* on_complete)(void* user_data, sbx_sandbox* sandbox,
                             const sbx_connected_sandbox* info, const sbx_error* error);
} sbx_connect_callbacks;

typedef struct sbx_provider_connect {
  uint32_t struct_size;
  /* [thread-safe, non-blocking] Starts making the descriptor of `sandbox`. */
  sbx_operation*(SBX_ABI* serialize)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                     const sbx_descriptor_callbacks* callbacks);
  /* [thread-safe, non-blocking] Starts reaching the sandbox `descriptor` names (BORROWED for the
   * call). */
  sbx_operation*(SBX_ABI* connect)(struct sbx_provider* provider, sbx_str descriptor,
                                   const sbx_connect_callbacks* callbacks);
} sbx_provider_connect;

SBX_EXTERN_C_END

#endif /* SBX_ABI_EXT_CONNECT_H */
