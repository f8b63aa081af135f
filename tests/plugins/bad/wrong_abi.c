/* A plugin built against a future ABI major version: the host must refuse it and name both
 * versions. Written in plain C, which is all the ABI needs. */
#include <sbx/abi/entry.h>

static sbx_status SBX_ABI init(const sbx_host* host, const sbx_error_sink* errors) {
  (void)host;
  (void)errors;
  return SBX_STATUS_OK;
}
static void SBX_ABI deinit(void) {}

SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {
  static const sbx_plugin plugin = {sizeof(sbx_plugin),
                                    {SBX_ABI_VERSION_MAJOR + 1, 0, 0},
                                    "wrong_abi",
                                    "9.9.9",
                                    "a plugin for another ABI major",
                                    init,
                                    deinit,
                                    0,
                                    NULL};
  return &plugin;
}
