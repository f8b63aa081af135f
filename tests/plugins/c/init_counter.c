/* init_counter: a plain-C plugin that checks that the host pairs init and deinit strictly
 * (tests/core/loader_stress_test.cpp). init refuses to run while an earlier init has not been
 * followed by its deinit, and a deinit without a live init aborts the process. Its provider does
 * nothing: every operation fails with UNIMPLEMENTED. */
#include <sbx/abi/entry.h>

#include <stdlib.h>
#include <string.h>

static int g_live = 0; /* inits not yet followed by a deinit */

static sbx_status SBX_ABI init(const sbx_host* host, const sbx_error_sink* errors) {
  (void)host;
  if (__atomic_fetch_add(&g_live, 1, __ATOMIC_SEQ_CST) != 0) {
    __atomic_fetch_sub(&g_live, 1, __ATOMIC_SEQ_CST);
    static const char message[] = "init called again before deinit";
    if (errors && errors->report) {
      sbx_error e;
      memset(&e, 0, sizeof e);
      e.struct_size = sizeof e;
      e.status = SBX_STATUS_INTERNAL;
      e.message.data = message;
      e.message.len = sizeof message - 1;
      errors->report(errors->ctx, &e);
    }
    return SBX_STATUS_INTERNAL;
  }
  return SBX_STATUS_OK;
}

static void SBX_ABI deinit(void) {
  if (__atomic_sub_fetch(&g_live, 1, __ATOMIC_SEQ_CST) < 0) abort();
}

/* The error every operation of this provider fails with. */
static sbx_error unimplemented(void) {
  static const char message[] = "init_counter does nothing";
  sbx_error e;
  memset(&e, 0, sizeof e);
  e.struct_size = sizeof e;
  e.status = SBX_STATUS_UNIMPLEMENTED;
  e.message.data = message;
  e.message.len = sizeof message - 1;
  return e;
}

static sbx_operation* SBX_ABI create(sbx_provider* p, const sbx_spec* spec,
                                     const sbx_create_callbacks* cb) {
  (void)p, (void)spec;
  const sbx_error e = unimplemented();
  cb->on_complete(cb->user_data, NULL, &e);
  return NULL;
}

static sbx_operation* SBX_ABI exec(sbx_provider* p, sbx_sandbox* s, const sbx_exec_request* r,
                                   const sbx_exec_callbacks* cb) {
  (void)p, (void)s, (void)r;
  const sbx_error e = unimplemented();
  cb->on_complete(cb->user_data, NULL, &e);
  return NULL;
}

static sbx_operation* SBX_ABI upload(sbx_provider* p, sbx_sandbox* s, const sbx_upload_request* r,
                                     const sbx_done_callbacks* cb) {
  (void)p, (void)s, (void)r;
  const sbx_error e = unimplemented();
  cb->on_complete(cb->user_data, &e);
  return NULL;
}

static sbx_operation* SBX_ABI download(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_download_request* r,
                                       const sbx_done_callbacks* cb) {
  (void)p, (void)s, (void)r;
  const sbx_error e = unimplemented();
  cb->on_complete(cb->user_data, &e);
  return NULL;
}

static sbx_operation* SBX_ABI status(sbx_provider* p, sbx_sandbox* s,
                                     const sbx_status_callbacks* cb) {
  (void)p, (void)s;
  cb->on_complete(cb->user_data, SBX_SANDBOX_UNKNOWN, NULL);
  return NULL;
}

static sbx_operation* SBX_ABI close_sandbox(sbx_provider* p, sbx_sandbox* s,
                                            const sbx_done_callbacks* cb) {
  (void)p, (void)s;
  cb->on_complete(cb->user_data, NULL);
  return NULL;
}

static void SBX_ABI release_sandbox(sbx_provider* p, sbx_sandbox* s) {
  (void)p, (void)s;
}
static const void* SBX_ABI get_extension(const sbx_provider* p, const char* id) {
  (void)p, (void)id;
  return NULL;
}
static void SBX_ABI destroy(sbx_provider* p) {
  free(p);
}

static sbx_status SBX_ABI factory_create(const sbx_provider_factory* f, const sbx_host* host,
                                         sbx_str config, sbx_provider** out,
                                         const sbx_error_sink* errors) {
  (void)f, (void)host, (void)config, (void)errors;
  sbx_provider* p = (sbx_provider*)calloc(1, sizeof *p);
  if (!p) return SBX_STATUS_RESOURCE_EXHAUSTED;
  p->struct_size = sizeof *p;
  p->create = create;
  p->exec = exec;
  p->upload = upload;
  p->download = download;
  p->status = status;
  p->close = close_sandbox;
  p->release_sandbox = release_sandbox;
  p->get_extension = get_extension;
  p->destroy = destroy;
  *out = p;
  return SBX_STATUS_OK;
}

static const sbx_provider_factory factory = {sizeof(sbx_provider_factory), "init_counter",
                                             "checks that init and deinit are paired", "{}",
                                             factory_create};
static const sbx_provider_factory* const factories[] = {&factory};

SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {
  static const sbx_plugin plugin = {sizeof(sbx_plugin),
                                    SBX_ABI_VERSION_INIT,
                                    "init_counter",
                                    "0.0.1",
                                    "checks that init and deinit are paired",
                                    init,
                                    deinit,
                                    1,
                                    factories};
  return &plugin;
}
