/* sbx provider ABI: a provider instance, its sandboxes, and the asynchronous operations on them.
 *
 * Every call that may block starts an operation (docs/abi/async.md):
 *   - The start function copies what it needs from its arguments (all BORROWED for the call) and
 *     returns quickly.
 *   - The operation's `on_complete` is called EXACTLY ONCE, on any thread (often a plugin-owned one),
 *     possibly before the start function returns. Exactly one of the result and the error is
 *     non-NULL. Both are BORROWED for the duration of the callback, except a created sandbox, whose
 *     ownership passes to the host.
 *   - The start function returns an sbx_operation handle the host can cancel, or NULL when the
 *     operation cannot be cancelled (for example because it already completed). A non-NULL handle
 *     is released by the host exactly once with `release`, before or after completion.
 *   - Callbacks that are NULL, have a NULL on_complete, or whose struct_size does not reach
 *     on_complete cannot be reported to: the start function starts nothing and returns NULL.
 *   - The host keeps callback `user_data`, and the streams of upload/download, valid until
 *     on_complete has returned.
 *   - Once it has called on_complete, the plugin no longer touches the operation's arguments or
 *     its sandbox: the host may release the sandbox from inside that callback.
 *   - `cancel` may complete the operation on the calling thread before it returns, and may be
 *     called from inside the operation's own callbacks (e.g. on_output, to stop a chatty command).
 * Plugins never hold a lock of their own while calling a host callback, so a host may start new
 * operations from inside a callback. Callbacks must not block for long; they run on threads the
 * plugin needs for other work.
 * The rules beyond the types (paths, the working directory, closed and gone sandboxes, what may be
 * NULL, cancellation, threads, output) are in docs/sandbox-semantics.md, in one place.
 *
 * THREAD TAGS. Every function pointer of the ABI (here, in host.h, entry.h, types.h and ext/)
 * starts its comment with a tag, as CLAP tags every function: [where, blocking; conditions],
 * e.g. [thread-safe, non-blocking]. The caller is the host for what the plugin implements, and the
 * plugin for a callback or service the host implements.
 * Where:
 *   thread-safe         any thread, concurrently with the other functions of its table; for a
 *                       provider's, also for one sandbox and from inside its own callbacks
 *   any thread          any thread; the conditions say what may overlap
 *   host thread         a thread of the host's: never a plugin thread, never inside a callback of
 *                       the plugin's
 *   plugin thread or inline
 *                       any thread of the plugin's, or inline on the host's thread inside the start
 *                       call (or inside `cancel`) before that returns
 *   calling thread      the thread of the call that received it, before that call returns
 * Blocking:
 *   non-blocking        returns quickly: copies what it needs, starts the work elsewhere; waits for
 *                       no network, process or other operation, holds locks only briefly
 *   must not block for long
 *                       a callback into the host returns soon: it runs on a thread the plugin
 *                       needs for other work. It may start, cancel or release operations
 *   may block briefly   local work only (parse a config, read memory or a local file); no network
 *                       round trip
 *   may block           may wait, e.g. for the plugin's threads to end
 * Conditions: exactly once, at most once, once (per operation, call or object); one at a time
 * (calls in order, never overlapping); one thread at a time (never overlapping); never after X.
 * The static inline helpers (sbx_str_unset, sbx_str_is_set, sbx_status_name,
 * sbx_version_is_compatible) are pure: any thread, non-blocking. The same rules as a table:
 * docs/abi/async.md, "Threads".
 */
#ifndef SBX_ABI_PROVIDER_H
#define SBX_ABI_PROVIDER_H

#include "spec.h"
#include "types.h"

SBX_EXTERN_C_BEGIN

/* ---- Operations ------------------------------------------------------------------------------ */

/* A started operation. OWNERSHIP: plugin-owned; the host holds one reference, dropped by `release`.
 * The plugin frees the operation once it has been released and has completed. */
typedef struct sbx_operation {
  uint32_t struct_size;
  void* plugin_data; /* plugin-private */

  /* [thread-safe, non-blocking; also from inside the operation's own callbacks; never after
   * `release`] Asks the plugin to stop the operation. Idempotent; valid before or after
   * completion. on_complete is still called exactly once, possibly on this thread before cancel
   * returns: with SBX_STATUS_CANCELLED if the cancellation took effect, otherwise with the normal
   * outcome. Cancelling an exec kills the command's processes inside the sandbox (best effort).
   * Cancellation must really work, within milliseconds: see docs/sandbox-semantics.md,
   * "Cancellation". */
  void(SBX_ABI* cancel)(struct sbx_operation* op);

  /* [thread-safe, non-blocking; exactly once per returned handle] Drops the host's reference. */
  void(SBX_ABI* release)(struct sbx_operation* op);
} sbx_operation;

/* ---- Sandboxes ------------------------------------------------------------------------------- */

/* A provider's handle to one sandbox (NeMo Gym's SandboxHandle). OWNERSHIP: plugin-owned; handed to
 * the host by create's on_complete; released by `sbx_provider.release_sandbox` exactly once.
 * Releasing a handle does not end the sandbox; `close` does. */
typedef struct sbx_sandbox {
  uint32_t struct_size;
  sbx_str id;         /* backend id, stable, unique per provider; valid until release */
  void* sandbox_data; /* plugin-private */
} sbx_sandbox;

/* Provider-neutral lifecycle status (NeMo Gym's SandboxStatus). */
#define SBX_SANDBOX_UNKNOWN 0
#define SBX_SANDBOX_STARTING 1
#define SBX_SANDBOX_RUNNING 2
#define SBX_SANDBOX_STOPPED 3
#define SBX_SANDBOX_ERROR 4
/* 1.1: processes frozen by sbx.pause/1 (ext/pause.h). A plugin never reports it to a host whose
 * sbx_host.abi_version is 1.0 (the SDK reports RUNNING there, as a 1.0 plugin would). */
#define SBX_SANDBOX_PAUSED 5

/* ---- Requests and results -------------------------------------------------------------------- */

/* cwd, env, user and the outcomes: docs/sandbox-semantics.md, "Commands". */
typedef struct sbx_exec_request {
  uint32_t struct_size;
  sbx_str command;        /* shell command line, run with the sandbox's shell (`sh -c`) */
  sbx_str cwd;            /* unset = the spec's workdir, else the backend default */
  sbx_kv_list env;        /* merged over the sandbox env; these values win */
  sbx_opt_i64 timeout_ms; /* unset = the provider's configured default */
  sbx_str user;           /* user name or numeric uid as text; unset = the sandbox default. A
                             provider that cannot run as another user refuses with UNIMPLEMENTED */
  /* --- ABI 1.3 --- */
  /* When count > 0: the program and its arguments, to run without a shell (argv[0] is looked up
   * in PATH when it has no '/'), so that an image without one runs it. `command` then holds the
   * same argv as a shell command line (each word single-quoted), for a provider that runs only
   * command lines: reading `argv` is a choice, and a provider that ignores it runs the same
   * program through its shell. Read it only after SBX_HAS_FIELD(request, sbx_exec_request, argv). */
  sbx_str_list argv;
} sbx_exec_request;

/* The outcome of a command that the sandbox ran (docs/abi/errors.md, "exit codes are results"):
 *   - the command ran:                 return_code = its exit status, error_type unset;
 *   - the command hit its timeout:     return_code = 125, error_type = "timeout", output so far;
 *   - the backend could not run it:    return_code = 125, error_type = "sandbox".
 * A backend that cannot be reached is an error, not a result. */
typedef struct sbx_exec_result {
  uint32_t struct_size;
  int32_t return_code;
  sbx_str error_type;
  sbx_bytes stdout_bytes; /* empty when the host asked for streamed output (on_output != NULL) */
  sbx_bytes stderr_bytes; /* idem */
} sbx_exec_result;

#define SBX_EXEC_RETURN_CODE_NO_PROCESS 125
#define SBX_EXEC_ERROR_TIMEOUT "timeout"
#define SBX_EXEC_ERROR_SANDBOX "sandbox"

#define SBX_STREAM_STDOUT 1
#define SBX_STREAM_STDERR 2

/* A source of bytes for upload. OWNERSHIP: host-owned; valid until the upload's on_complete returns.
 * THREADING: `read` is called by one thread at a time, never after on_complete. The host's
 * streams read memory or a local file. */
typedef struct sbx_input_stream {
  uint32_t struct_size;
  void* ctx;
  int64_t size; /* exact number of bytes the stream yields */
  /* [any thread, one thread at a time, may block briefly; never after on_complete]
   * Copies up to `capacity` bytes into `buffer`. Returns the count (> 0), 0 at the end, or -1 on
   * error; the plugin then fails the upload with SBX_STATUS_INTERNAL and writes nothing partial. */
  int64_t(SBX_ABI* read)(void* ctx, uint8_t* buffer, size_t capacity);
} sbx_input_stream;

/* A sink of bytes for download. OWNERSHIP and THREADING as sbx_input_stream. */
typedef struct sbx_output_stream {
  uint32_t struct_size;
  void* ctx;
  /* [any thread, one thread at a time, may block briefly; never after on_complete]
   * Consumes all of `data`. Returns 0, or -1 to abort the download (the plugin then completes with
   * SBX_STATUS_CANCELLED). */
  int32_t(SBX_ABI* write)(void* ctx, sbx_bytes data);
  /* --- ABI 1.3 --- */
  /* [optional: NULL when the host does not ask; at most once, before the first write; same
   * thread rules as write] The number of bytes the download will write, for a plugin that knows
   * it before the first byte (the file's size, a Content-Length): a host can then announce it (an
   * HTTP server's Content-Length) instead of keeping the whole file first. A download that then
   * writes another number of bytes is failed by the host. Returns 0, or -1 to abort the download
   * as write does. Call it only after SBX_HAS_FIELD(stream, sbx_output_stream, expect). */
  int32_t(SBX_ABI* expect)(void* ctx, int64_t size);
} sbx_output_stream;

/* Relative paths, parents, modes, no partial file: docs/sandbox-semantics.md, "Paths". */
typedef struct sbx_upload_request {
  uint32_t struct_size;
  sbx_str remote_path;            /* file to write; missing parent directories are created */
  const sbx_input_stream* source; /* the file's contents */
  uint32_t mode;                  /* permission bits, 0 = 0644 */
} sbx_upload_request;

/* Download writes exactly the contents of one regular file to `sink`. A link, a directory, or a
 * missing file completes with an error; the host then discards whatever the sink received.
 * See docs/sandbox-semantics.md, "Paths". */
typedef struct sbx_download_request {
  uint32_t struct_size;
  sbx_str remote_path;
  const sbx_output_stream* sink;
} sbx_download_request;

/* ---- Callbacks ------------------------------------------------------------------------------- */

typedef struct sbx_create_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; exactly once] `sandbox` is ready
   * (commands can run, files can move) and now OWNED by the host; or NULL with an error (a failed
   * create leaves nothing behind in the backend). */
  void(SBX_ABI* on_complete)(void* user_data, sbx_sandbox* sandbox, const sbx_error* error);
} sbx_create_callbacks;

typedef struct sbx_exec_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; one at a time, all before on_complete]
   * Optional (may be NULL). Called with output chunks in order, one call at a time, all before
   * on_complete. `stream` is SBX_STREAM_STDOUT or SBX_STREAM_STDERR; `chunk` is BORROWED. When set,
   * output is delivered only here and the result's output fields are empty. */
  void(SBX_ABI* on_output)(void* user_data, int32_t stream, sbx_bytes chunk);
  /* [plugin thread or inline, must not block for long; exactly once, after the last on_output]
   * The result or the error (see sbx_exec_result). */
  void(SBX_ABI* on_complete)(void* user_data, const sbx_exec_result* result,
                             const sbx_error* error);
} sbx_exec_callbacks;

typedef struct sbx_status_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; exactly once] `status` is one of
   * SBX_SANDBOX_*; meaningful only when `error` is NULL. */
  void(SBX_ABI* on_complete)(void* user_data, int32_t status, const sbx_error* error);
} sbx_status_callbacks;

/* For operations with no result value (upload, download, close). `error` is NULL on success. */
typedef struct sbx_done_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; exactly once] */
  void(SBX_ABI* on_complete)(void* user_data, const sbx_error* error);
} sbx_done_callbacks;

/* ---- The provider ---------------------------------------------------------------------------- */

/* One configured provider instance, made by a factory (entry.h). OWNERSHIP: plugin-owned; the host
 * ends it with `destroy`. THREADING: every function except `destroy` is [thread-safe] and may be
 * called concurrently, also for the same sandbox, and from inside this provider's callbacks. */
typedef struct sbx_provider {
  uint32_t struct_size;
  void* provider_data; /* plugin-private */

  /* [thread-safe, non-blocking] Creates a sandbox and completes when it is ready, i.e. it passed
   * the provider's readiness check and the spec's startup files are in place. A failed create
   * removes what it made and completes with SBX_STATUS_CREATE_FAILED,
   * SBX_STATUS_CREATE_VERIFICATION_FAILED (readiness check failed) or a more specific status (e.g.
   * INVALID_ARGUMENT for a bad spec). */
  sbx_operation*(SBX_ABI* create)(struct sbx_provider* provider, const sbx_spec* spec,
                                  const sbx_create_callbacks* callbacks);

  /* [thread-safe, non-blocking] Runs a command. A command that ran, timed out, or could not be
   * started by the sandbox completes with a result (see sbx_exec_result); an unreachable backend
   * or a sandbox that is gone completes with an error. */
  sbx_operation*(SBX_ABI* exec)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                const sbx_exec_request* request,
                                const sbx_exec_callbacks* callbacks);

  /* [thread-safe, non-blocking] Writes one file into the sandbox from request->source. */
  sbx_operation*(SBX_ABI* upload)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                  const sbx_upload_request* request,
                                  const sbx_done_callbacks* callbacks);

  /* [thread-safe, non-blocking] Reads one file of the sandbox into request->sink. */
  sbx_operation*(SBX_ABI* download)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                    const sbx_download_request* request,
                                    const sbx_done_callbacks* callbacks);

  /* [thread-safe, non-blocking] Reports the lifecycle status. A sandbox the backend no longer
   * knows is SBX_SANDBOX_STOPPED. Every call's answer for a closed or gone sandbox:
   * docs/sandbox-semantics.md. */
  sbx_operation*(SBX_ABI* status)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                  const sbx_status_callbacks* callbacks);

  /* [thread-safe, non-blocking] Ends the sandbox in the backend. A sandbox that is already gone
   * is success; calling it twice is success. The handle stays valid (release it with
   * release_sandbox). */
  sbx_operation*(SBX_ABI* close)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                 const sbx_done_callbacks* callbacks);

  /* [thread-safe, non-blocking; no operation on this sandbox pending] Frees a sandbox handle. Does
   * not end the sandbox. */
  void(SBX_ABI* release_sandbox)(struct sbx_provider* provider, sbx_sandbox* sandbox);

  /* [thread-safe, non-blocking] Returns the extension table with this id (see sbx/abi/ext/), or
   * NULL. The table is plugin-owned and valid until `destroy`. */
  const void*(SBX_ABI* get_extension)(const struct sbx_provider* provider, const char* id);

  /* [host thread, may block; once] Ends the provider and frees everything it owns; it may wait for
   * the provider's threads. The host calls it once, after every operation has completed and every
   * sandbox handle has been released, and never from inside one of this provider's callbacks.
   * When it returns, no plugin thread runs code of this provider. */
  void(SBX_ABI* destroy)(struct sbx_provider* provider);
} sbx_provider;

SBX_EXTERN_C_END

#endif /* SBX_ABI_PROVIDER_H */
