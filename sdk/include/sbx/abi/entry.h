/* sbx provider ABI: the plugin entry point and provider factories.
 *
 * A plugin is a shared library that exports exactly one symbol:
 *
 *     SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void);
 *
 * [any thread, non-blocking; possibly in a probe process that never calls init] It returns the
 * descriptor and runs no code with side effects (no thread, no file, no connection).
 * The host loads the library with RTLD_NOW | RTLD_LOCAL, calls `sbx_plugin_entry`, checks
 * `struct_size` and `abi_version` (refusing another major version with a message naming both), then
 * calls `init` once. Only after a successful `init` does it use a factory's `create`. Before it
 * unloads the library it destroys every provider and calls `deinit` once.
 *
 * The descriptor and everything it points to (names, factories, schemas) is static, plugin-owned
 * data, valid from `sbx_plugin_entry` until the library is unloaded, and readable before `init`:
 * a host may list a plugin's providers without initialising it.
 * Which thread calls what, and what may block: the tag at the start of each function's comment
 * (legend: provider.h, "THREAD TAGS"), and docs/sandbox-semantics.md, "Threads".
 */
#ifndef SBX_ABI_ENTRY_H
#define SBX_ABI_ENTRY_H

#include "host.h"
#include "provider.h"
#include "types.h"

SBX_EXTERN_C_BEGIN

/* Makes provider instances of one kind. */
typedef struct sbx_provider_factory {
  uint32_t struct_size;
  const char* id;            /* stable provider id, e.g. "local_docker"; [a-z0-9_.-]+ */
  const char* description;   /* one line */
  const char* config_schema; /* JSON Schema (draft 2020-12) of the config object, as text */

  /* [thread-safe, may block briefly; no network round trip required] Creates a provider from
   * `config_json` (a JSON object as text; BORROWED). Validation happens here: an unknown key or a
   * bad value fails with SBX_STATUS_INVALID_ARGUMENT and a message naming the JSON path. `host`
   * is scoped to this provider and outlives it (see host.h). On success stores a provider the host
   * now OWNS in `*out` and returns SBX_STATUS_OK; otherwise leaves `*out` NULL, reports details to
   * `errors` (may be NULL) and returns the status. */
  sbx_status(SBX_ABI* create)(const struct sbx_provider_factory* factory, const sbx_host* host,
                              sbx_str config_json, sbx_provider** out,
                              const sbx_error_sink* errors);
} sbx_provider_factory;

typedef struct sbx_plugin {
  uint32_t struct_size;
  sbx_version abi_version; /* the ABI the plugin was built against */
  const char* name;        /* plugin name, e.g. "local_docker" */
  const char* version;     /* plugin version, e.g. "0.1.0" */
  const char* description; /* one line */

  /* [host thread, may block briefly; once, before anything but reading this struct] Initialises
   * plugin-wide state. `host` stays valid until `deinit` returns. Returns SBX_STATUS_OK, or a
   * failure status with details reported to `errors` (may be NULL); after a failure the host calls
   * nothing else but may unload the library. */
  sbx_status(SBX_ABI* init)(const sbx_host* host, const sbx_error_sink* errors);

  /* [host thread, may block; once, after every provider has been destroyed] Releases plugin-wide
   * state. When it returns no plugin thread may run (the library is unloaded next). */
  void(SBX_ABI* deinit)(void);

  size_t factory_count;
  const sbx_provider_factory* const* factories; /* factory_count entries */
} sbx_plugin;

/* The name of the one exported symbol, for hosts that look it up. */
#define SBX_PLUGIN_ENTRY_SYMBOL "sbx_plugin_entry"

/* [any thread, non-blocking] The type of sbx_plugin_entry (above). */
typedef const sbx_plugin*(SBX_ABI* sbx_plugin_entry_fn)(void);

SBX_EXTERN_C_END

#endif /* SBX_ABI_ENTRY_H */
