/* sbx provider ABI: services the host passes to a plugin.
 *
 * A plugin links no logging, metrics or clock library of the host's; it calls these instead. The
 * host gives one sbx_host to `sbx_plugin.init` (plugin-wide) and one to each provider factory call
 * (scoped to that provider: its log lines carry the provider's configured name).
 *
 * OWNERSHIP: host-owned. A plugin may keep the pointer it received until `deinit` (for the one given
 * to `init`) or until `sbx_provider.destroy` returns (for the one given to a factory).
 * THREADING: every function here is [thread-safe, non-blocking] and may be called from any thread,
 * including from inside operations and while the plugin holds its own locks. None of them calls
 * back into the plugin. Which may be NULL, and the threads of everything else:
 * docs/sandbox-semantics.md. The tags: provider.h, "THREAD TAGS".
 */
#ifndef SBX_ABI_HOST_H
#define SBX_ABI_HOST_H

#include "types.h"

SBX_EXTERN_C_BEGIN

/* Log severities. */
#define SBX_LOG_TRACE 0
#define SBX_LOG_DEBUG 1
#define SBX_LOG_INFO 2
#define SBX_LOG_WARN 3
#define SBX_LOG_ERROR 4

typedef struct sbx_host {
  uint32_t struct_size;    /* sizeof(sbx_host) as known to the host */
  sbx_version abi_version; /* the host's ABI version */
  sbx_str host_name;       /* e.g. "sbx", borrowed, valid as long as the struct */
  sbx_str host_version;    /* e.g. "0.1.0" */
  void* host_data;         /* host-private; plugins must not touch it */

  /* [thread-safe, non-blocking; also while the plugin holds its own locks] Writes one log line.
   * `message` is BORROWED for the call and needs no trailing newline. Must not contain secrets. */
  void(SBX_ABI* log)(const struct sbx_host* host, int32_t level, sbx_str message);

  /* [thread-safe, non-blocking] True when a line of `level` would be written; lets a plugin skip
   * formatting. The host's level (sbx --log-level, $SBX_LOG_LEVEL) applies to plugin lines: `log`
   * drops lower ones anyway. */
  bool(SBX_ABI* log_enabled)(const struct sbx_host* host, int32_t level);

  /* [thread-safe, non-blocking] Monotonic clock in nanoseconds (arbitrary origin). Plugins measure
   * deadlines with it so that a host can test time-dependent behaviour. */
  int64_t(SBX_ABI* now_ns)(const struct sbx_host* host);

  /* [thread-safe, non-blocking] Returns the host extension with this id (e.g. a metrics or tracing
   * interface), or NULL if the host does not offer it. The returned table is host-owned and lives
   * as long as this struct. */
  const void*(SBX_ABI* get_extension)(const struct sbx_host* host, const char* id);
} sbx_host;

SBX_EXTERN_C_END

#endif /* SBX_ABI_HOST_H */
