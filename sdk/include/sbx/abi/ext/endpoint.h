/* sbx provider ABI extension "sbx.endpoint/1": reach a service a sandbox serves on a declared port.
 *
 * Obtain with `provider->get_extension(provider, SBX_EXT_ENDPOINT)`; NULL means unsupported.
 * The port must be one of the spec's declared `ports`; any other port completes with
 * SBX_STATUS_INVALID_ARGUMENT. The table is plugin-owned and valid until the provider is destroyed.
 */
#ifndef SBX_ABI_EXT_ENDPOINT_H
#define SBX_ABI_EXT_ENDPOINT_H

#include "../provider.h"

SBX_EXTERN_C_BEGIN

#define SBX_EXT_ENDPOINT "sbx.endpoint/1"

typedef struct sbx_endpoint {
  uint32_t struct_size;
  sbx_str url;         /* absolute URL, e.g. "http://127.0.0.1:49153" */
  sbx_kv_list headers; /* headers a client must send (auth, routing); may be empty */
} sbx_endpoint;

typedef struct sbx_endpoint_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; exactly once] `endpoint` or `error`
   * non-NULL, both BORROWED for the call. */
  void(SBX_ABI* on_complete)(void* user_data, const sbx_endpoint* endpoint, const sbx_error* error);
} sbx_endpoint_callbacks;

typedef struct sbx_provider_endpoint {
  uint32_t struct_size;
  /* [thread-safe, non-blocking] Starts resolving `port` of `sandbox`; same operation rules as
   * provider.h. */
  sbx_operation*(SBX_ABI* get)(struct sbx_provider* provider, sbx_sandbox* sandbox, uint16_t port,
                               const sbx_endpoint_callbacks* callbacks);
} sbx_provider_endpoint;

SBX_EXTERN_C_END

#endif /* SBX_ABI_EXT_ENDPOINT_H */
