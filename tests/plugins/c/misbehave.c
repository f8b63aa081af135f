/* misbehave: a plain-C provider that breaks the ABI's promises on purpose, for the host's tests
 * (tests/core/hardening_test.cpp). It does no real work: create makes a handle, exec "runs"
 * nothing. What it gets wrong is chosen by its config, a JSON object with a "mode":
 *
 *   "twice"         every operation completes twice (inside the start call)
 *   "never"         create works; no other operation completes, and cancel is ignored
 *   "never_create"  create never completes, and cancel is ignored
 *   "late"          operations complete 300 ms after they start, on a thread of their own,
 *                   whatever the host did meanwhile (cancel is ignored)
 *   "short_sandbox" created sandboxes come in an sbx_sandbox smaller than ABI 1.0's
 *   "short_result"  exec results come in an sbx_exec_result smaller than ABI 1.0's
 *   "short_error"   exec fails with an sbx_error smaller than ABI 1.0's
 *   "output_after"  exec output arrives after on_complete
 *   "rc"            exec returns the return code given as "rc": N
 *   "short_handle"  exec returns an sbx_operation handle smaller than ABI 1.0's
 *   "no_provider"   the factory returns OK but no provider
 *   "slow_factory"  the factory takes a second (then the provider works)
 *   "renew"         works, and offers sbx.renew/1: the expiry asked for, rounded up to a second
 *                   (it ends nothing: it only lets the host's side of the extension be tested)
 *
 * Whatever the mode, release_sandbox logs whether it runs inside a callback this plugin is making
 * on a thread of its own ("late"), which the ABI's host never does: a plugin whose sandbox joins
 * that thread on release would join itself there.
 *
 * The config is read with strstr: it is the test's own, fixed text. */
#include <sbx/abi/entry.h>
#include <sbx/abi/ext/renew.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum mode {
  NORMAL,
  RENEW,
  TWICE,
  NEVER,
  NEVER_CREATE,
  LATE,
  SHORT_SANDBOX,
  SHORT_RESULT,
  SHORT_ERROR,
  OUTPUT_AFTER,
  RC,
  SHORT_HANDLE
};

typedef struct provider_state {
  sbx_provider c;
  enum mode mode;
  int32_t rc;
} provider_state;

static provider_state* state_of(sbx_provider* p) {
  return (provider_state*)p->provider_data;
}

static sbx_str str(const char* s) {
  sbx_str out = {s, strlen(s)};
  return out;
}

/* ---- sandboxes ---- */

typedef struct sandbox_state {
  sbx_sandbox c;
  char id[32];
} sandbox_state;

static sbx_sandbox* new_sandbox(uint32_t struct_size) {
  static int counter = 0;
  sandbox_state* s = (sandbox_state*)calloc(1, sizeof *s);
  if (!s) abort();
  snprintf(s->id, sizeof s->id, "mis-%d", __atomic_add_fetch(&counter, 1, __ATOMIC_SEQ_CST));
  s->c.struct_size = struct_size;
  s->c.id = str(s->id);
  s->c.sandbox_data = s;
  return &s->c;
}

static const sbx_host* g_host;         /* from init */
static __thread int t_in_own_callback; /* set on a "late" thread while it calls the host */

static void SBX_ABI release_sandbox(sbx_provider* p, sbx_sandbox* s) {
  (void)p;
  char line[128];
  snprintf(line, sizeof line, "misbehave: sandbox %.*s released %s", (int)s->id.len, s->id.data,
           t_in_own_callback ? "inside its own thread's callback" : "outside its callbacks");
  if (g_host) g_host->log(g_host, SBX_LOG_INFO, str(line));
  free(s);
}

/* ---- results ---- */

static void exec_ok(const sbx_exec_callbacks* cb, uint32_t struct_size, int32_t rc) {
  static const char out[] = "misbehaving\n";
  sbx_exec_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = struct_size;
  r.return_code = rc;
  r.stdout_bytes.data = (const uint8_t*)out;
  r.stdout_bytes.len = sizeof out - 1;
  cb->on_complete(cb->user_data, &r, NULL);
}

static sbx_error error_of(uint32_t struct_size) {
  sbx_error e;
  memset(&e, 0, sizeof e);
  e.struct_size = struct_size;
  e.status = SBX_STATUS_UNAVAILABLE;
  e.message = str("backend gone (injected)");
  return e;
}

/* ---- "late": completion from a thread of its own ---- */

typedef struct late_job {
  int kind; /* 0 create, 1 exec, 2 done (upload, download, close), 3 status */
  sbx_create_callbacks create;
  sbx_exec_callbacks exec;
  sbx_done_callbacks done;
  sbx_status_callbacks status;
} late_job;

static void* late_main(void* arg) {
  late_job* job = (late_job*)arg;
  struct timespec pause = {0, 300 * 1000 * 1000};
  nanosleep(&pause, NULL);
  t_in_own_callback = 1;
  switch (job->kind) {
    case 0:
      job->create.on_complete(job->create.user_data, new_sandbox(sizeof(sbx_sandbox)), NULL);
      break;
    case 1:
      exec_ok(&job->exec, sizeof(sbx_exec_result), 0);
      break;
    case 2:
      job->done.on_complete(job->done.user_data, NULL);
      break;
    default:
      job->status.on_complete(job->status.user_data, SBX_SANDBOX_RUNNING, NULL);
      break;
  }
  t_in_own_callback = 0;
  free(job);
  return NULL;
}

static void start_late(late_job* job) {
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&thread, &attr, late_main, job) != 0) abort();
  pthread_attr_destroy(&attr);
}

static late_job* new_job(int kind) {
  late_job* job = (late_job*)calloc(1, sizeof *job);
  if (!job) abort();
  job->kind = kind;
  return job;
}

/* ---- handles ---- */

static void SBX_ABI ignore_cancel(sbx_operation* op) {
  (void)op;
}
static void SBX_ABI release_nothing(sbx_operation* op) {
  (void)op;
}
/* One static handle for every operation: cancel does nothing, release nothing to free. */
static sbx_operation g_deaf_handle = {sizeof(sbx_operation), NULL, ignore_cancel, release_nothing};
static sbx_operation g_short_handle = {4, NULL, NULL, NULL};

/* ---- the provider ---- */

static sbx_operation* SBX_ABI create(sbx_provider* p, const sbx_spec* spec,
                                     const sbx_create_callbacks* cb) {
  (void)spec;
  switch (state_of(p)->mode) {
    case NEVER_CREATE:
      return &g_deaf_handle;
    case LATE: {
      late_job* job = new_job(0);
      job->create = *cb;
      start_late(job);
      return &g_deaf_handle;
    }
    case TWICE: {
      cb->on_complete(cb->user_data, new_sandbox(sizeof(sbx_sandbox)), NULL);
      cb->on_complete(cb->user_data, new_sandbox(sizeof(sbx_sandbox)), NULL);
      return NULL;
    }
    case SHORT_SANDBOX:
      cb->on_complete(cb->user_data, new_sandbox(8), NULL);
      return NULL;
    default:
      cb->on_complete(cb->user_data, new_sandbox(sizeof(sbx_sandbox)), NULL);
      return NULL;
  }
}

static sbx_operation* SBX_ABI exec(sbx_provider* p, sbx_sandbox* s, const sbx_exec_request* req,
                                   const sbx_exec_callbacks* cb) {
  (void)s;
  (void)req;
  provider_state* state = state_of(p);
  switch (state->mode) {
    case NEVER:
      return &g_deaf_handle;
    case LATE: {
      late_job* job = new_job(1);
      job->exec = *cb;
      start_late(job);
      return &g_deaf_handle;
    }
    case TWICE:
      exec_ok(cb, sizeof(sbx_exec_result), 0);
      exec_ok(cb, sizeof(sbx_exec_result), 1);
      return NULL;
    case SHORT_RESULT:
      exec_ok(cb, 4, 0);
      return NULL;
    case SHORT_ERROR: {
      const sbx_error e = error_of(6);
      cb->on_complete(cb->user_data, NULL, &e);
      return NULL;
    }
    case OUTPUT_AFTER: {
      static const char late[] = "after the end\n";
      sbx_bytes chunk = {(const uint8_t*)late, sizeof late - 1};
      exec_ok(cb, sizeof(sbx_exec_result), 0);
      if (cb->on_output) cb->on_output(cb->user_data, SBX_STREAM_STDOUT, chunk);
      return NULL;
    }
    case RC:
      exec_ok(cb, sizeof(sbx_exec_result), state->rc);
      return NULL;
    case SHORT_HANDLE:
      exec_ok(cb, sizeof(sbx_exec_result), 0);
      return &g_short_handle;
    default:
      exec_ok(cb, sizeof(sbx_exec_result), 0);
      return NULL;
  }
}

static sbx_operation* done_op(sbx_provider* p, const sbx_done_callbacks* cb) {
  switch (state_of(p)->mode) {
    case NEVER:
      return &g_deaf_handle;
    case LATE: {
      late_job* job = new_job(2);
      job->done = *cb;
      start_late(job);
      return &g_deaf_handle;
    }
    case TWICE:
      cb->on_complete(cb->user_data, NULL);
      cb->on_complete(cb->user_data, NULL);
      return NULL;
    default:
      cb->on_complete(cb->user_data, NULL);
      return NULL;
  }
}

static sbx_operation* SBX_ABI upload(sbx_provider* p, sbx_sandbox* s, const sbx_upload_request* req,
                                     const sbx_done_callbacks* cb) {
  (void)s;
  (void)req;
  return done_op(p, cb);
}

static sbx_operation* SBX_ABI download(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_download_request* req,
                                       const sbx_done_callbacks* cb) {
  (void)s;
  (void)req;
  return done_op(p, cb);
}

static sbx_operation* SBX_ABI status(sbx_provider* p, sbx_sandbox* s,
                                     const sbx_status_callbacks* cb) {
  (void)s;
  switch (state_of(p)->mode) {
    case NEVER:
      return &g_deaf_handle;
    case LATE: {
      late_job* job = new_job(3);
      job->status = *cb;
      start_late(job);
      return &g_deaf_handle;
    }
    case TWICE:
      cb->on_complete(cb->user_data, SBX_SANDBOX_RUNNING, NULL);
      cb->on_complete(cb->user_data, SBX_SANDBOX_STOPPED, NULL);
      return NULL;
    default:
      cb->on_complete(cb->user_data, SBX_SANDBOX_RUNNING, NULL);
      return NULL;
  }
}

static sbx_operation* SBX_ABI close_sandbox(sbx_provider* p, sbx_sandbox* s,
                                            const sbx_done_callbacks* cb) {
  (void)s;
  return done_op(p, cb);
}

static sbx_operation* SBX_ABI renew(sbx_provider* p, sbx_sandbox* s, int64_t expires_at_unix_ms,
                                    const sbx_renew_callbacks* cb) {
  (void)p;
  (void)s;
  const int64_t rounded = (expires_at_unix_ms + 999) / 1000 * 1000;
  cb->on_complete(cb->user_data, rounded, NULL);
  return NULL;
}

static const sbx_provider_renew g_renew = {sizeof(sbx_provider_renew), renew};

static const void* SBX_ABI get_extension(const sbx_provider* p, const char* id) {
  if (state_of((sbx_provider*)p)->mode == RENEW && strcmp(id, SBX_EXT_RENEW) == 0) return &g_renew;
  return NULL;
}

static void SBX_ABI destroy(sbx_provider* p) {
  free(state_of(p));
}

static sbx_status SBX_ABI factory_create(const sbx_provider_factory* f, const sbx_host* host,
                                         sbx_str config, sbx_provider** out,
                                         const sbx_error_sink* errors) {
  (void)f;
  (void)host;
  (void)errors;
  char text[256] = {0};
  memcpy(text, config.data, config.len < sizeof text - 1 ? config.len : sizeof text - 1);
  if (strstr(text, "\"slow_factory\"")) {
    struct timespec second = {1, 0};
    nanosleep(&second, NULL);
  }
  if (strstr(text, "\"no_provider\"")) {
    *out = NULL;
    return SBX_STATUS_OK;
  }
  provider_state* state = (provider_state*)calloc(1, sizeof *state);
  if (!state) return SBX_STATUS_RESOURCE_EXHAUSTED;
  static const struct {
    const char* token;
    enum mode mode;
  } modes[] = {{"\"twice\"", TWICE},
               {"\"never\"", NEVER},
               {"\"never_create\"", NEVER_CREATE},
               {"\"short_sandbox\"", SHORT_SANDBOX},
               {"\"late\"", LATE},
               {"\"short_result\"", SHORT_RESULT},
               {"\"short_error\"", SHORT_ERROR},
               {"\"output_after\"", OUTPUT_AFTER},
               {"\"rc\"", RC},
               {"\"short_handle\"", SHORT_HANDLE},
               {"\"renew\"", RENEW}};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; ++i) {
    if (strstr(text, modes[i].token)) state->mode = modes[i].mode;
  }
  const char* rc = strstr(text, "\"rc\":");
  if (rc) state->rc = (int32_t)strtol(rc + 5, NULL, 10);
  state->c.struct_size = sizeof(sbx_provider);
  state->c.provider_data = state;
  state->c.create = create;
  state->c.exec = exec;
  state->c.upload = upload;
  state->c.download = download;
  state->c.status = status;
  state->c.close = close_sandbox;
  state->c.release_sandbox = release_sandbox;
  state->c.get_extension = get_extension;
  state->c.destroy = destroy;
  *out = &state->c;
  return SBX_STATUS_OK;
}

static sbx_status SBX_ABI init(const sbx_host* host, const sbx_error_sink* errors) {
  (void)errors;
  g_host = host;
  return SBX_STATUS_OK;
}
static void SBX_ABI deinit(void) {}

static const sbx_provider_factory factory = {sizeof(sbx_provider_factory), "misbehave",
                                             "breaks the ABI's promises on purpose", "{}",
                                             factory_create};
static const sbx_provider_factory* const factories[] = {&factory};

SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {
  static const sbx_plugin plugin = {sizeof(sbx_plugin),
                                    SBX_ABI_VERSION_INIT,
                                    "misbehave",
                                    "0.0.1",
                                    "a provider that breaks the ABI's promises on purpose",
                                    init,
                                    deinit,
                                    1,
                                    factories};
  return &plugin;
}
