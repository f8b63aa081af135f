/* sbx provider ABI extension "sbx.flow/1" (ABI 1.3): the host holds an exec's output, or a
 * download's bytes.
 *
 * Obtain with `provider->get_extension(provider, SBX_EXT_FLOW)`; NULL means the provider cannot
 * hold any operation's output: its on_output calls (its sink's writes) come as fast as its
 * backend sends them, and a host that passes them on slower must keep them or drop them
 * (docs/flow-control.md says what sbx serve does). The table is plugin-owned and valid until the
 * provider is destroyed.
 *
 * A host that cannot pass an operation's output on as fast as it comes (a slow client of a
 * server) calls hold_output(op, true). From then on the provider stops reading from its backend:
 * a command blocks on its pipe, as it would on a terminal nobody reads, and a download waits;
 * nothing is dropped and nothing is killed for it. Output already read may still arrive, at most
 * SBX_FLOW_SLACK bytes after the call returns. hold_output(op, false) lets it flow again. A held
 * command's own timeout keeps running (it is killed at its timeout, as any command).
 */
#ifndef SBX_ABI_EXT_FLOW_H
#define SBX_ABI_EXT_FLOW_H

#include "../provider.h"

SBX_EXTERN_C_BEGIN

#define SBX_EXT_FLOW "sbx.flow/1"

/* The most output that may still reach on_output (or the sink) after hold_output(op, true)
 * returned: what the provider had read from its backend before it stopped. */
#define SBX_FLOW_SLACK (1024u * 1024u)

typedef struct sbx_provider_flow {
  uint32_t struct_size;
  /* [any thread, also from inside the operation's own on_output or sink write; non-blocking]
   * Holds (`hold` true) or releases the output of `op`, an operation this provider's exec,
   * sbx.session/1 run or download returned and the host has not released. Returns true when the
   * output is held (or flows again), false when this operation's output cannot be held (its
   * backend cannot be paused, or it is another kind of operation): the host then keeps or drops
   * what comes. Calls for one operation come one at a time; the last one wins. After the
   * operation completed it does nothing and returns true. */
  bool(SBX_ABI* hold_output)(struct sbx_provider* provider, sbx_operation* op, bool hold);
} sbx_provider_flow;

SBX_EXTERN_C_END

#endif /* SBX_ABI_EXT_FLOW_H */
