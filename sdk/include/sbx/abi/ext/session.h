/* sbx provider ABI extension "sbx.session/1" (ABI 1.2): a persistent shell.
 *
 * NeMo Gym's `preserve_background_services=True`, OpenSandbox execd's `/session` routes. A session
 * is a shell whose state carries from one command to the next: the working directory, exported
 * variables, and jobs started in the background (with their output redirected). Obtain the table
 * with `provider->get_extension(provider, SBX_EXT_SESSION)`; NULL means unsupported. The table is
 * plugin-owned and valid until the provider is destroyed.
 *
 * A session is named by a string id the provider makes (at most 128 bytes of [A-Za-z0-9_.:-]),
 * not by a handle: the id is valid for any handle to the same sandbox, in any process, for as long
 * as the sandbox lives or until `close`. A session never outlives its sandbox.
 *
 * Each `run` is one command with exec's request, callbacks and outcomes (provider.h): streamed or
 * collected output, the exit code as a result, its own timeout. The request's `cwd` and `env`
 * act as a `cd` and `export`s typed before the command: they win over the session's state and,
 * as any state, carry to the session's later commands (execd's rule). Cancelling a run kills that command,
 * never the session. Runs may overlap; the state the last one to end leaves is the session's
 * (execd's rule). A command that ends the shell itself (`exit`, `exec`) leaves the state as it was.
 * An id the provider does not know (never made, or closed) completes with SBX_STATUS_NOT_FOUND.
 * Threading and completion are those of every operation (docs/abi/async.md).
 */
#ifndef SBX_ABI_EXT_SESSION_H
#define SBX_ABI_EXT_SESSION_H

#include "../provider.h"

SBX_EXTERN_C_BEGIN

#define SBX_EXT_SESSION "sbx.session/1"

typedef struct sbx_session_request {
  uint32_t struct_size;
  sbx_str cwd;     /* where the shell starts; unset: the sandbox's workdir */
  sbx_kv_list env; /* exported in the shell before its first command */
  sbx_str user;    /* who runs the session's commands; unset: the sandbox's default. A provider
                      that cannot run as another user refuses with UNIMPLEMENTED */
} sbx_session_request;

/* The completion of an operation that makes a session (here) or a terminal (ext/pty.h). */
typedef struct sbx_session_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; exactly once] The new id (BORROWED for the
   * call; set when `error` is NULL), or an error and an unset id. */
  void(SBX_ABI* on_complete)(void* user_data, sbx_str session_id, const sbx_error* error);
} sbx_session_callbacks;

typedef struct sbx_provider_session {
  uint32_t struct_size;
  /* [thread-safe, non-blocking] Starts a session in `sandbox`. `request` is BORROWED for the
   * call. */
  sbx_operation*(SBX_ABI* open)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                const sbx_session_request* request,
                                const sbx_session_callbacks* callbacks);
  /* [thread-safe, non-blocking] Runs one command in the session `session_id` (BORROWED for the
   * call), with exec's request and callbacks; `request->user` is ignored (the session's user runs
   * it). */
  sbx_operation*(SBX_ABI* run)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                               sbx_str session_id, const sbx_exec_request* request,
                               const sbx_exec_callbacks* callbacks);
  /* [thread-safe, non-blocking] Ends the session: its runs still going are killed, what they
   * started in the background lives on (execd's rule). Unknown id: SBX_STATUS_NOT_FOUND. */
  sbx_operation*(SBX_ABI* close)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                 sbx_str session_id, const sbx_done_callbacks* callbacks);
} sbx_provider_session;

SBX_EXTERN_C_END

#endif /* SBX_ABI_EXT_SESSION_H */
