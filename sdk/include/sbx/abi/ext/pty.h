/* sbx provider ABI extension "sbx.pty/1" (ABI 1.2): interactive terminals.
 *
 * NeMo Gym's SupportsSandboxPty and SupportsSandboxPtyAttach, OpenSandbox execd's `/pty` routes.
 * A terminal is a process (a command, or the user's shell) on a pseudo-terminal in the sandbox, or
 * in pipe mode on plain pipes (stdout and stderr apart, no line discipline). Obtain the table with
 * `provider->get_extension(provider, SBX_EXT_PTY)`; NULL means unsupported. The table is
 * plugin-owned and valid until the provider is destroyed.
 *
 * A terminal is named by a string id the provider makes (at most 128 bytes of [A-Za-z0-9_.:-]),
 * valid for any handle to the same sandbox until `close` or the sandbox's end.
 *
 * Output: the provider numbers the bytes the process writes from 0 (stdout and stderr share one
 * count in pipe mode) and keeps at least the latest 64 KiB of them, whether or not anyone is
 * attached. An attachment replays what is kept from an offset, then streams live output, in order,
 * one call at a time. At most one attachment is live at a time: a second attach either fails at
 * once (takeover false) or ends the first (takeover true), whose completion then says so. A
 * terminal whose process has exited stays (its output readable, its exit code known) until
 * `close`. Writing and resizing are short operations of their own: a host never waits for output
 * to send a key. In TTY mode, input goes through the terminal's line discipline: a Ctrl-C byte
 * (0x03) is SIGINT to the foreground process group, as at a real terminal.
 * Threading and completion are those of every operation (docs/abi/async.md).
 */
#ifndef SBX_ABI_EXT_PTY_H
#define SBX_ABI_EXT_PTY_H

#include "session.h"

SBX_EXTERN_C_BEGIN

#define SBX_EXT_PTY "sbx.pty/1"

/* `since` for an attachment that wants only what comes next. */
#define SBX_PTY_LIVE UINT64_MAX

typedef struct sbx_pty_request {
  uint32_t struct_size;
  sbx_str command; /* run by the sandbox's shell (`sh -c`); unset: the user's login shell */
  sbx_str cwd;     /* unset: the sandbox's workdir */
  sbx_kv_list env; /* merged over the sandbox env; TERM defaults to xterm-256color in TTY mode */
  sbx_str user;    /* as sbx_exec_request.user */
  uint16_t rows;   /* 0: 24 */
  uint16_t cols;   /* 0: 80 */
  bool tty;        /* false: pipe mode (no terminal; stdout and stderr apart) */
} sbx_pty_request;

typedef struct sbx_pty_attach_callbacks {
  uint32_t struct_size;
  void* user_data;
  /* [plugin thread or inline, must not block for long; one at a time, all before on_complete]
   * Output in order; may be called before attach returns. `offset` is the position of data's first
   * byte in the terminal's output (the first call's offset says where the replay really starts:
   * later than asked when that much is no longer kept); `stream` is SBX_STREAM_STDERR only in pipe
   * mode. `data` is BORROWED for the call. */
  void(SBX_ABI* on_output)(void* user_data, int32_t stream, uint64_t offset, sbx_bytes data);
  /* [plugin thread or inline, must not block for long; exactly once, after the last on_output]
   * The process exited (`exit_code`, its status, or 128 + the signal that ended it; error NULL),
   * or the attachment ended otherwise: another attach took the terminal over
   * (SBX_STATUS_FAILED_PRECONDITION, reason SBX_REASON_TAKEN_OVER), the terminal was closed
   * (SBX_STATUS_NOT_FOUND), the host cancelled it (SBX_STATUS_CANCELLED: a detach; the process
   * goes on). */
  void(SBX_ABI* on_complete)(void* user_data, int32_t exit_code, const sbx_error* error);
  /* [ABI 1.3; plugin thread or inline, must not block for long; at most once, before any
   * on_output and on_complete] The attachment is in place: the terminal exists and this
   * attachment holds it (an attach that fails at once, an unknown id or a held terminal without
   * takeover, never calls it). A plugin of ABI 1.3 or later calls it when the host's
   * `struct_size` covers it and it is not NULL; from an older plugin a host learns nothing
   * until the first output or the end. */
  void(SBX_ABI* on_attached)(void* user_data);
} sbx_pty_attach_callbacks;

typedef struct sbx_provider_pty {
  uint32_t struct_size;
  /* [thread-safe, non-blocking] Starts the process; completes with the terminal's id once it runs.
   * `request` is BORROWED for the call. */
  sbx_operation*(SBX_ABI* open)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                const sbx_pty_request* request,
                                const sbx_session_callbacks* callbacks);
  /* [thread-safe, non-blocking] Attaches to the terminal `session_id` (BORROWED for the call).
   * `since`: the offset to replay from (0: everything kept), or SBX_PTY_LIVE. An attachment lasts
   * until the process exits, it is taken over, the terminal is closed, or the host cancels it. */
  sbx_operation*(SBX_ABI* attach)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                  sbx_str session_id, uint64_t since, bool takeover,
                                  const sbx_pty_attach_callbacks* callbacks);
  /* [thread-safe, non-blocking] Sends `input` (BORROWED for the call) to the process's terminal or
   * stdin, in the order the writes were started. A process that has exited:
   * SBX_STATUS_FAILED_PRECONDITION. */
  sbx_operation*(SBX_ABI* write)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                 sbx_str session_id, sbx_bytes input,
                                 const sbx_done_callbacks* callbacks);
  /* [thread-safe, non-blocking] Sets the terminal's window size (SIGWINCH to its foreground process
   * group). In pipe mode: success, nothing to resize. Rows or cols 0:
   * SBX_STATUS_INVALID_ARGUMENT. */
  sbx_operation*(SBX_ABI* resize)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                  sbx_str session_id, uint16_t rows, uint16_t cols,
                                  const sbx_done_callbacks* callbacks);
  /* [thread-safe, non-blocking] Kills the process (its process group) if it still runs, ends the
   * attachment (NOT_FOUND) and forgets the terminal. Unknown id: SBX_STATUS_NOT_FOUND. */
  sbx_operation*(SBX_ABI* close)(struct sbx_provider* provider, sbx_sandbox* sandbox,
                                 sbx_str session_id, const sbx_done_callbacks* callbacks);
} sbx_provider_pty;

SBX_EXTERN_C_END

#endif /* SBX_ABI_EXT_PTY_H */
