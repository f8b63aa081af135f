/* A plugin whose init refuses to run, reporting why through the error sink. */
#include <sbx/abi/entry.h>

#include <string.h>

static sbx_status SBX_ABI init(const sbx_host* host, const sbx_error_sink* errors) {
  (void)host;
  static const char message[] = "backend library missing (injected)";
  if (errors && errors->report) {
    sbx_error error;
    memset(&error, 0, sizeof error);
    error.struct_size = sizeof error;
    error.status = SBX_STATUS_FAILED_PRECONDITION;
    error.message.data = message;
    error.message.len = sizeof message - 1;
    errors->report(errors->ctx, &error);
  }
  return SBX_STATUS_FAILED_PRECONDITION;
}
static void SBX_ABI deinit(void) {}

SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {
  static const sbx_plugin plugin = {sizeof(sbx_plugin),
                                    SBX_ABI_VERSION_INIT,
                                    "init_fails",
                                    "0.0.1",
                                    "a plugin whose init fails",
                                    init,
                                    deinit,
                                    0,
                                    NULL};
  return &plugin;
}
