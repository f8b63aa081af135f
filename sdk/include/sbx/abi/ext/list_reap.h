/* sbx provider ABI extension "sbx.list-reap/1": find and remove sandboxes by label.
 *
 * Providers stamp the spec's `labels` and `metadata` on every backend resource they create; this
 * extension lists the sandboxes whose labels match a selector and force-removes them, so leaks of a
 * crashed host can be found and reaped. Only sandboxes made by this provider kind are considered.
 * A selector matches when every pair matches: same key and value, or an unset value (any value).
 * Obtain with `provider->get_extension(provider, SBX_EXT_LIST_REAP)`; NULL means unsupported.
 */
#ifndef SBX_ABI_EXT_LIST_REAP_H
#define SBX_ABI_EXT_LIST_REAP_H

#include "../provider.h"

SBX_EXTERN_C_BEGIN

#define SBX_EXT_LIST_REAP "sbx.list-reap/1"

typedef struct sbx_sandbox_info {
  uint32_t struct_size;
  sbx_str id;
  int32_t status;          /* SBX_SANDBOX_* */
  sbx_kv_list labels;      /* every label of the sandbox, metadata included */
  int64_t created_unix_ms; /* 0 if unknown */
} sbx_sandbox_info;

typedef struct sbx_list_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; one at a time, all before on_complete]
   * Once per matching sandbox; `info` is BORROWED. */
  void(SBX_ABI* on_item)(void* user_data, const sbx_sandbox_info* info);
  /* [plugin thread or inline, must not block for long; exactly once] */
  void(SBX_ABI* on_complete)(void* user_data, const sbx_error* error);
} sbx_list_callbacks;

typedef struct sbx_reap_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; one at a time, all before on_complete]
   * Once per removed sandbox, as for listing. */
  void(SBX_ABI* on_item)(void* user_data, const sbx_sandbox_info* info);
  /* [plugin thread or inline, must not block for long; exactly once] `error` is NULL when every
   * matching sandbox was removed. */
  void(SBX_ABI* on_complete)(void* user_data, const sbx_error* error);
} sbx_reap_callbacks;

typedef struct sbx_provider_list_reap {
  uint32_t struct_size;
  /* [thread-safe, non-blocking] Starts listing the sandboxes `selector` (BORROWED for the call)
   * matches. */
  sbx_operation*(SBX_ABI* list)(struct sbx_provider* provider, sbx_kv_list selector,
                                const sbx_list_callbacks* callbacks);
  /* [thread-safe, non-blocking] Starts force-removing the sandboxes `selector` (BORROWED for the
   * call) matches. */
  sbx_operation*(SBX_ABI* reap)(struct sbx_provider* provider, sbx_kv_list selector,
                                const sbx_reap_callbacks* callbacks);
} sbx_provider_list_reap;

SBX_EXTERN_C_END

#endif /* SBX_ABI_EXT_LIST_REAP_H */
