/* sbx provider ABI extension "sbx.renew/1" (ABI 1.1): move a sandbox's expiry.
 *
 * Obtain with `provider->get_extension(provider, SBX_EXT_RENEW)`; NULL means unsupported, which is
 * also what a provider answers when it cannot honour a new expiry for real (a provider never
 * pretends). The table is plugin-owned and valid until the provider is destroyed.
 *
 * The new expiry replaces the old one, later or earlier, also for a sandbox created without a TTL.
 * From then on the sandbox is ended at the new expiry even if no host process runs (the same
 * promise as sbx_spec.ttl_ms). A sandbox that is gone completes with SBX_STATUS_NOT_FOUND; an
 * expiry in the past with SBX_STATUS_INVALID_ARGUMENT.
 */
#ifndef SBX_ABI_EXT_RENEW_H
#define SBX_ABI_EXT_RENEW_H

#include "../provider.h"

SBX_EXTERN_C_BEGIN

#define SBX_EXT_RENEW "sbx.renew/1"

typedef struct sbx_renew_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; exactly once] `expires_at_unix_ms` is the
   * expiry now in force (a provider may round it up to its own resolution); meaningful only when
   * `error` is NULL. */
  void(SBX_ABI* on_complete)(void* user_data, int64_t expires_at_unix_ms, const sbx_error* error);
} sbx_renew_callbacks;

typedef struct sbx_provider_renew {
  uint32_t struct_size;
  /* [thread-safe, non-blocking] Starts moving the expiry of `sandbox` to `expires_at_unix_ms` (wall
   * clock, milliseconds since the Unix epoch). */
  sbx_operation*(SBX_ABI* renew)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                 int64_t expires_at_unix_ms, const sbx_renew_callbacks* callbacks);
} sbx_provider_renew;

SBX_EXTERN_C_END

#endif /* SBX_ABI_EXT_RENEW_H */
