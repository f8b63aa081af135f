/* sbx provider ABI: version numbers, negotiation rule and portability macros.
 *
 * Rule (docs/abi/versioning.md):
 *   - A host and a plugin work together iff their MAJOR versions are equal.
 *   - A MINOR version only appends fields to structs and slots to function tables. A reader checks
 *     `struct_size` (SBX_HAS_FIELD) before touching a field newer than the oldest minor it accepts.
 *   - PATCH changes documentation only.
 * Both sides learn the other's version: the plugin states its own in `sbx_plugin.abi_version`; the
 * host states its own in `sbx_host.abi_version`, given to `init`.
 *
 * 1.1 added: the sandbox status SBX_SANDBOX_PAUSED (never reported to a 1.0 host), and the
 * extensions sbx.pause/1, sbx.connect/1 and sbx.renew/1 (sbx/abi/ext/).
 * 1.2 added: sbx_error.reason and the well-known reasons SBX_REASON_* (types.h), and the
 * extensions sbx.session/1 and sbx.pty/1 (ext/session.h, ext/pty.h).
 * 1.2.1: a thread tag on every function (comments only).
 * 1.3 added: the well-known reason SBX_REASON_SANDBOX_GONE (types.h),
 * sbx_exec_request.argv and sbx_output_stream.expect (provider.h), sbx_pty_attach_callbacks's
 * on_attached (ext/pty.h) and the extension sbx.flow/1 (ext/flow.h), which holds an exec's output
 * or a download.
 *
 * The headers' hash is recorded per version in tests/abi/abi_hashes.txt: a header changed without
 * a version bump fails the test abi_headers_hash (tests/abi/check_abi_hash.sh).
 */
#ifndef SBX_ABI_VERSION_H
#define SBX_ABI_VERSION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define SBX_EXTERN_C_BEGIN extern "C" {
#define SBX_EXTERN_C_END }
#else
#define SBX_EXTERN_C_BEGIN
#define SBX_EXTERN_C_END
#endif

/* Calling convention of every function pointer and exported function in the ABI. */
#if defined(_WIN32) && !defined(_WIN64)
#define SBX_ABI __cdecl
#else
#define SBX_ABI
#endif

/* Marks the one symbol a plugin exports (`sbx_plugin_entry`, see entry.h). */
#if defined(_WIN32)
#define SBX_EXPORT __declspec(dllexport)
#else
#define SBX_EXPORT __attribute__((visibility("default")))
#endif

#define SBX_ABI_VERSION_MAJOR 1u
#define SBX_ABI_VERSION_MINOR 3u
#define SBX_ABI_VERSION_PATCH 0u

SBX_EXTERN_C_BEGIN

typedef struct sbx_version {
  uint32_t major;
  uint32_t minor;
  uint32_t patch;
} sbx_version;

#define SBX_ABI_VERSION_INIT {SBX_ABI_VERSION_MAJOR, SBX_ABI_VERSION_MINOR, SBX_ABI_VERSION_PATCH}

/* True when a peer built against `other` can be used by code built against these headers. */
static inline int sbx_version_is_compatible(sbx_version other) {
  return other.major == SBX_ABI_VERSION_MAJOR;
}

/* True when a struct received from a peer is large enough to contain `field`.
 * `ptr` points to a struct whose first member is `uint32_t struct_size`. */
#define SBX_HAS_FIELD(ptr, type, field) \
  ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

SBX_EXTERN_C_END

#endif /* SBX_ABI_VERSION_H */
