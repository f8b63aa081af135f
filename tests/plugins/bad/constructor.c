/* A library whose loading itself goes wrong, before any sbx function is called: its constructor
 * crashes (CRASH) or never returns (HANG). The host must list it as broken and keep working,
 * which it can only do by never loading such a file into its own process. With
 * $SBX_TEST_HANG_RECORD set, HANG appends its process id to that file first. */
#include <sbx/abi/entry.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void on_load(void) {
#if defined(CRASH)
  raise(SIGSEGV);
#elif defined(HANG)
  /* For tests that count loads: one line with this process's id per load. */
  const char* record = getenv("SBX_TEST_HANG_RECORD");
  if (record && *record) {
    FILE* f = fopen(record, "a");
    if (f) {
      fprintf(f, "%d\n", (int)getpid());
      fclose(f);
    }
  }
  for (;;)
    pause();
#endif
}

static sbx_status SBX_ABI init(const sbx_host* host, const sbx_error_sink* errors) {
  (void)host;
  (void)errors;
  return SBX_STATUS_OK;
}
static void SBX_ABI deinit(void) {}

SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {
  static const sbx_plugin plugin = {sizeof(sbx_plugin),
                                    SBX_ABI_VERSION_INIT,
                                    "constructor",
                                    "0.0.1",
                                    "a library whose loading goes wrong",
                                    init,
                                    deinit,
                                    0,
                                    NULL};
  return &plugin;
}
