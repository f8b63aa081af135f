/* sbx provider ABI: the sandbox creation request (NeMo Gym's SandboxSpec and SandboxResources).
 *
 * OWNERSHIP: host-owned and BORROWED for the duration of the `create` call that receives it; a
 * provider that needs any of it later copies it before `create` returns.
 * Every optional field has an explicit unset state: sbx_str with data == NULL, sbx_opt_* with
 * set == false, a NULL pointer, or `has_entrypoint == false`.
 * The host validates the spec before any provider sees it (ports in 1..65535 and unique, timeouts
 * not negative, resources not negative), so providers may rely on those properties.
 */
#ifndef SBX_ABI_SPEC_H
#define SBX_ABI_SPEC_H

#include "types.h"

SBX_EXTERN_C_BEGIN

/* Provider-neutral resource request. All fields optional. */
typedef struct sbx_resources {
  uint32_t struct_size;
  sbx_opt_f64 cpu;        /* CPUs, may be fractional (0.5) */
  sbx_opt_i64 memory_mib; /* MiB */
  sbx_opt_i64 disk_gib;   /* GiB */
  sbx_opt_i64 gpu;        /* number of GPUs */
  sbx_str gpu_type;       /* e.g. "H100"; unset when not requested */
} sbx_resources;

/* One startup file: written at `path` inside the sandbox before `create` completes. */
typedef struct sbx_file {
  sbx_str path;
  sbx_bytes contents;
} sbx_file;

typedef struct sbx_file_list {
  const sbx_file* items;
  size_t count;
} sbx_file_list;

typedef struct sbx_port_list {
  const uint16_t* items; /* TCP ports the sandbox will serve on, unique, each in 1..65535 */
  size_t count;
} sbx_port_list;

typedef struct sbx_spec {
  uint32_t struct_size;

  sbx_str image;                /* container image or provider-specific template; unset = default */
  sbx_opt_i64 ttl_ms;           /* sandbox lifetime; the backend ends it even if the host dies. A
                                   provider that cannot fails create with UNIMPLEMENTED when it is
                                   set (docs/sandbox-semantics.md) */
  sbx_opt_i64 ready_timeout_ms; /* how long create may wait for the sandbox to become ready */
  sbx_str workdir;              /* default working directory for exec, made by create; relative
                                   paths are relative to it (docs/sandbox-semantics.md) */
  sbx_kv_list env;              /* environment of every process in the sandbox */
  sbx_file_list files;          /* startup files; present when create completes */
  sbx_kv_list metadata;         /* user metadata, stamped on backend resources */
  const sbx_resources* resources; /* NULL = no resource request */
  bool has_entrypoint;          /* false = provider default keep-alive process */
  sbx_str_list entrypoint;      /* argv of the sandbox's main process when has_entrypoint */
  sbx_port_list ports;          /* declared service ports (see ext/endpoint.h) */
  sbx_str provider_options;     /* JSON object text; unset = {}; unknown keys are an error */
  sbx_kv_list labels;           /* host labels (e.g. sbx.run, sbx.host) stamped on every backend
                                   resource the provider creates for this sandbox, for list-and-reap */
} sbx_spec;

SBX_EXTERN_C_END

#endif /* SBX_ABI_SPEC_H */
