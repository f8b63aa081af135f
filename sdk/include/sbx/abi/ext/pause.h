/* sbx provider ABI extension "sbx.pause/1" (ABI 1.1): freeze and thaw every process of a sandbox.
 *
 * Obtain with `provider->get_extension(provider, SBX_EXT_PAUSE)`; NULL means unsupported. The table
 * is plugin-owned and valid until the provider is destroyed. Both functions follow the operation
 * rules of provider.h (exactly one on_complete, cancellable, callbacks BORROWED for the call).
 *
 * While a sandbox is paused:
 *   - `status` reports SBX_SANDBOX_PAUSED;
 *   - exec, upload and download complete at once with SBX_STATUS_FAILED_PRECONDITION and a message
 *     saying the sandbox is paused: they never wait for a resume;
 *   - close works (a paused sandbox can be ended);
 *   - its TTL keeps running: a sandbox paused past its expiry is ended like any other.
 * Pausing a paused sandbox and resuming a running one succeed and change nothing. A sandbox that is
 * gone completes with SBX_STATUS_NOT_FOUND.
 */
#ifndef SBX_ABI_EXT_PAUSE_H
#define SBX_ABI_EXT_PAUSE_H

#include "../provider.h"

SBX_EXTERN_C_BEGIN

#define SBX_EXT_PAUSE "sbx.pause/1"

typedef struct sbx_provider_pause {
  uint32_t struct_size;
  /* [thread-safe, non-blocking] Completes once every process of `sandbox` is frozen. */
  sbx_operation*(SBX_ABI* pause)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                 const sbx_done_callbacks* callbacks);
  /* [thread-safe, non-blocking] Completes once the processes run again. */
  sbx_operation*(SBX_ABI* resume)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                  const sbx_done_callbacks* callbacks);
} sbx_provider_pause;

SBX_EXTERN_C_END

#endif /* SBX_ABI_EXT_PAUSE_H */
