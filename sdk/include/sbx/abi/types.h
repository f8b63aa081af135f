/* sbx provider ABI: value types shared by every other header.
 *
 * Strings, byte views, key/value lists, optional numbers, status codes and the error object.
 * Ownership of every view is stated where it is passed (docs/abi/ownership.md); the default rule is:
 * a view given as an argument is BORROWED and valid only until the function (or callback) returns.
 */
#ifndef SBX_ABI_TYPES_H
#define SBX_ABI_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "version.h"

SBX_EXTERN_C_BEGIN

/* ---- Strings (docs/abi/strings.md) -------------------------------------------------------------
 * UTF-8, sized, not necessarily NUL-terminated. Three states:
 *   unset:  data == NULL (len must be 0)    -> "no value" for optional fields
 *   empty:  data != NULL, len == 0
 *   value:  data != NULL, len  > 0
 */
typedef struct sbx_str {
  const char* data;
  size_t len;
} sbx_str;

static inline sbx_str sbx_str_unset(void) {
  sbx_str s = {NULL, 0};
  return s;
}
static inline bool sbx_str_is_set(sbx_str s) { return s.data != NULL; }

/* Arbitrary bytes (file contents, process output). data may be NULL only when len == 0. */
typedef struct sbx_bytes {
  const uint8_t* data;
  size_t len;
} sbx_bytes;

typedef struct sbx_kv {
  sbx_str key;
  sbx_str value;
} sbx_kv;

/* An ordered list of key/value pairs; keys are unique. items may be NULL only when count == 0. */
typedef struct sbx_kv_list {
  const sbx_kv* items;
  size_t count;
} sbx_kv_list;

typedef struct sbx_str_list {
  const sbx_str* items;
  size_t count;
} sbx_str_list;

/* ---- Optional numbers: `set == false` means "no value"; `value` is then meaningless. ---------- */
typedef struct sbx_opt_i64 {
  bool set;
  int64_t value;
} sbx_opt_i64;

typedef struct sbx_opt_f64 {
  bool set;
  double value;
} sbx_opt_f64;

/* ---- Status codes (docs/abi/errors.md) ---------------------------------------------------------
 * Every fallible call reports one of these; anything but SBX_STATUS_OK comes with an sbx_error.
 * New codes may be added in a minor version; a reader maps unknown codes to SBX_STATUS_INTERNAL. */
typedef int32_t sbx_status;

#define SBX_STATUS_OK 0
#define SBX_STATUS_INVALID_ARGUMENT 1    /* bad spec, request, config or option; do not retry */
#define SBX_STATUS_NOT_FOUND 2           /* sandbox, file or image does not exist */
#define SBX_STATUS_TIMEOUT 3             /* a deadline passed before the backend answered */
#define SBX_STATUS_CANCELLED 4           /* the host cancelled the operation */
#define SBX_STATUS_UNAVAILABLE 5         /* backend unreachable or overloaded; usually retryable */
#define SBX_STATUS_RESOURCE_EXHAUSTED 6  /* quota, rate limit, disk full */
#define SBX_STATUS_FAILED_PRECONDITION 7 /* state does not allow it (e.g. sandbox not running) */
#define SBX_STATUS_UNIMPLEMENTED 8       /* the provider does not support this call or option */
#define SBX_STATUS_PERMISSION_DENIED 9   /* credentials or permissions refused */
#define SBX_STATUS_INTERNAL 10           /* a bug or an unexpected backend answer */
#define SBX_STATUS_CREATE_FAILED 11      /* NeMo Gym SandboxCreateError */
#define SBX_STATUS_CREATE_VERIFICATION_FAILED 12 /* NeMo Gym SandboxCreateVerificationError */

/* The name of a status code, e.g. "INVALID_ARGUMENT"; "INTERNAL" for codes this version does not
 * know. The returned string is static. */
static inline const char* sbx_status_name(sbx_status status) {
  switch (status) {
    case SBX_STATUS_OK: return "OK";
    case SBX_STATUS_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case SBX_STATUS_NOT_FOUND: return "NOT_FOUND";
    case SBX_STATUS_TIMEOUT: return "TIMEOUT";
    case SBX_STATUS_CANCELLED: return "CANCELLED";
    case SBX_STATUS_UNAVAILABLE: return "UNAVAILABLE";
    case SBX_STATUS_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case SBX_STATUS_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case SBX_STATUS_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case SBX_STATUS_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case SBX_STATUS_CREATE_FAILED: return "CREATE_FAILED";
    case SBX_STATUS_CREATE_VERIFICATION_FAILED: return "CREATE_VERIFICATION_FAILED";
    default: return "INTERNAL";
  }
}

/* ---- The error object --------------------------------------------------------------------------
 * Always BORROWED by whoever receives it: valid only until the function or callback it was passed
 * to returns. Copy what you need. Plugins classify failures (`status`, `retryable`, `reason`);
 * retry policy belongs to the host's configuration. */
typedef struct sbx_error {
  uint32_t struct_size;  /* sizeof(sbx_error) as known to the writer */
  sbx_status status;     /* never SBX_STATUS_OK */
  sbx_str message;       /* human-readable, never contains secrets */
  bool retryable;        /* true when the same call may succeed if repeated */
  int32_t http_status;   /* HTTP status of the failing backend response, 0 if none */
  sbx_str request_id;    /* backend request id, unset if unknown */
  /* --- ABI 1.2 --- */
  /* Why, within `status`, for a program to match: one of the SBX_REASON_* below, or the backend's
   * own code as the backend wrote it (e.g. OpenSandbox's "SANDBOX::INVALID_METADATA_LABEL");
   * unset when there is none. At most 128 bytes of [A-Za-z0-9_.:/-]; a host drops anything else.
   * Read it only after SBX_HAS_FIELD(error, sbx_error, reason): a 1.0 or 1.1 writer has none. */
  sbx_str reason;
} sbx_error;

/* The well-known reasons (ABI 1.2). A host matches these exactly; a provider that knows one of
 * these to be the cause says so, whatever status it reports alongside. */
/* The sandbox's image could not be pulled: missing, refused by the registry, or the registry
 * unreachable. Final for the create that asked (the same pull fails the same way). */
#define SBX_REASON_IMAGE_PULL_FAILED "image_pull_failed"
/* A terminal's attachment ended because another attach took the terminal over (ext/pty.h). */
#define SBX_REASON_TAKEN_OVER "taken_over"
/* --- ABI 1.3 --- */
/* The operation failed because its sandbox no longer runs: closed (through any handle), past its
 * TTL, removed behind the provider, or its main process ended. With SBX_STATUS_NOT_FOUND, it tells
 * a sandbox that is gone from a missing object of the call (a file, a terminal, a command), which
 * is NOT_FOUND without it. Final: nothing done to that sandbox can succeed again. */
#define SBX_REASON_SANDBOX_GONE "sandbox_gone"

/* Where synchronous calls (init, provider factories) report failure details.
 * OWNERSHIP: the sink is host-owned and BORROWED for the duration of the call that receives it;
 * `report` may be called at most once per call, on the calling thread. `error` is borrowed. */
typedef struct sbx_error_sink {
  uint32_t struct_size;
  void* ctx;
  /* [calling thread, non-blocking; at most once per call] Hands the host the call's error. */
  void(SBX_ABI* report)(void* ctx, const sbx_error* error);
} sbx_error_sink;

SBX_EXTERN_C_END

#endif /* SBX_ABI_TYPES_H */
