/* Descriptors the host must refuse, one per build of this file (tests/plugins/CMakeLists.txt):
 *   BAD_ID        a provider id outside [a-z0-9_.-]
 *   EMPTY_ID      an empty provider id
 *   DUPLICATE_ID  the same provider id twice
 *   BAD_UTF8      a plugin name that is not UTF-8 */
#include <sbx/abi/entry.h>

#include <stddef.h>

static sbx_status SBX_ABI init(const sbx_host* host, const sbx_error_sink* errors) {
  (void)host;
  (void)errors;
  return SBX_STATUS_OK;
}
static void SBX_ABI deinit(void) {}

static sbx_status SBX_ABI never_called(const sbx_provider_factory* f, const sbx_host* host,
                                       sbx_str config, sbx_provider** out,
                                       const sbx_error_sink* errors) {
  (void)f, (void)host, (void)config, (void)errors;
  *out = NULL;
  return SBX_STATUS_INTERNAL;
}

#if defined(BAD_ID)
#define ID "Bad Id#x/y"
#elif defined(EMPTY_ID)
#define ID ""
#else
#define ID "fine"
#endif
#if defined(BAD_UTF8)
#define NAME "bad\xff\xfename"
#else
#define NAME "bad_descriptor"
#endif

static const sbx_provider_factory factory = {sizeof(sbx_provider_factory), ID, "refused", "{}",
                                             never_called};
#if defined(DUPLICATE_ID)
static const sbx_provider_factory* const factories[] = {&factory, &factory};
#else
static const sbx_provider_factory* const factories[] = {&factory};
#endif

SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {
  static const sbx_plugin plugin = {sizeof(sbx_plugin),
                                    SBX_ABI_VERSION_INIT,
                                    NAME,
                                    "0.0.1",
                                    "a descriptor the host refuses",
                                    init,
                                    deinit,
                                    sizeof factories / sizeof factories[0],
                                    factories};
  return &plugin;
}
