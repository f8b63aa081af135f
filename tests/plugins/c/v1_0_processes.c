/* v1_0_processes: a complete plain-C provider built against the frozen ABI 1.0 headers
 * (tests/abi/v1_0/, never sdk/include/). It exists for ABI compatibility: it shows that a plugin
 * built for 1.0 loads and passes the base conformance suite under a 1.1 host
 * (conformance.v1_0_processes). It offers no extension, so the suite's 1.1 cases report that it
 * does not offer them, and it never reports a status 1.0 does not define.
 *
 * Behaviour follows test_processes (tests/plugins/test_processes) without its fault injection and
 * its 1.1 extensions. Each sandbox is a private directory <$TMPDIR or /tmp>/sbx-v10-XXXXXX and each
 * command a host process (/bin/sh -c) in its own process group. There is NO isolation. A sandbox
 * path "/a/b" is "<dir>/a/b", a relative one is relative to the spec's workdir (or "/"), and one
 * that would leave the directory is refused with INVALID_ARGUMENT. Commands run as the host's user
 * and nothing ends a sandbox at a TTL, so an exec with a `user` and a spec with a `ttl_ms` are
 * refused with UNIMPLEMENTED, which is how a provider declares that it does not offer them
 * (docs/conformance.md); the spec's image, resources, entrypoint and ports are ignored.
 *
 * Threads: status completes inline, every other operation runs on a thread of its own. These
 * threads are joinable, not detached: a finished one is joined by the next start call or by
 * destroy, so that when destroy returns no thread runs this library's code (the host may unload it
 * next, and a detached thread could still be returning from its last function).
 *
 * Ownership (docs/abi/ownership.md): what a start call receives is borrowed for the call, so it
 * copies what the operation needs into an `op`; only the upload/download streams and the sandbox
 * handle stay borrowed, until on_complete. An `op` is freed once the host has released its handle
 * and the operation has completed (a reference count of two). Running out of memory aborts the
 * process, as in the other plain-C test plugins: a test plugin has no better answer to it. */
#define _GNU_SOURCE /* pipe2, mkostemp, posix_spawn_file_actions_addchdir_np */

#include <sbx/abi/entry.h>

#if SBX_ABI_VERSION_MAJOR != 1 || SBX_ABI_VERSION_MINOR != 0
#error "v1_0_processes must be built against the ABI 1.0 headers (-I tests/abi/v1_0) only"
#endif

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

#define DEFAULT_TIMEOUT_MS 60000
#define MAX_TIMEOUT_MS (100LL * 24 * 3600 * 1000) /* deadline arithmetic never overflows */
#define DRAIN_MS 2000   /* after a kill, how long output from stray pipe holders is awaited */
#define CHUNK 65536     /* bytes moved per read */
#define MESSAGE_MAX 512 /* an error message; longer ones are cut */

/* ---- Helpers ------------------------------------------------------------------------------- */

static void* xrealloc(void* p, size_t size) {
  p = realloc(p, size ? size : 1);
  if (!p) abort();
  return p;
}

static void* xcalloc(size_t count, size_t size) {
  void* p = calloc(count ? count : 1, size);
  if (!p) abort();
  return p;
}

/* A NUL-terminated, malloc'ed copy of `len` bytes. */
static char* copy_text(const char* data, size_t len) {
  char* s = xrealloc(NULL, len + 1);
  if (len) memcpy(s, data, len);
  s[len] = '\0';
  return s;
}

static sbx_str str_of(const char* s) {
  sbx_str out = {s, strlen(s)};
  return out;
}

/* A sized string that can become a C string: readable and without NUL bytes. */
static bool valid_text(sbx_str s) {
  return s.len == 0 || (s.data && !memchr(s.data, '\0', s.len));
}

/* Writes an error message into `message` (MESSAGE_MAX bytes) and returns `status`. */
static sbx_status failf(char* message, sbx_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(message, MESSAGE_MAX, format, args);
  va_end(args);
  return status;
}

static sbx_status status_of_errno(int error) {
  if (error == ENOSPC || error == EDQUOT || error == EMFILE || error == ENFILE) {
    return SBX_STATUS_RESOURCE_EXHAUSTED;
  }
  if (error == EACCES || error == EPERM || error == EROFS) return SBX_STATUS_PERMISSION_DENIED;
  return SBX_STATUS_INTERNAL;
}

static sbx_error error_of(sbx_status status, const char* message) {
  sbx_error e;
  memset(&e, 0, sizeof e);
  e.struct_size = sizeof e;
  e.status = status;
  e.message = str_of(message);
  e.retryable = status == SBX_STATUS_RESOURCE_EXHAUSTED;
  e.request_id = sbx_str_unset();
  return e;
}

/* Writes all of `data`; false with errno set on failure. */
static bool write_all(int fd, const uint8_t* data, size_t len) {
  while (len > 0) {
    const ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    len -= (size_t)n;
  }
  return true;
}

/* A growable byte buffer (exec output kept for the result). */
typedef struct buffer {
  uint8_t* data;
  size_t len, cap;
} buffer;

static void buffer_append(buffer* b, const uint8_t* data, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : CHUNK;
    while (cap < b->len + n)
      cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
  }
  memcpy(b->data + b->len, data, n);
  b->len += n;
}

/* An environment: a growable, NULL-terminated array of owned "KEY=VALUE" strings. */
typedef struct strv {
  char** items;
  size_t count, cap;
} strv;

static void strv_free(strv* v) {
  for (size_t i = 0; i < v->count; ++i)
    free(v->items[i]);
  free(v->items);
}

/* Takes `entry` (malloc'ed "KEY=VALUE"): replaces the entry with its key, or appends it. */
static void strv_put(strv* v, char* entry) {
  const size_t key_len = strcspn(entry, "=") + 1; /* the key and its '=' */
  for (size_t i = 0; i < v->count; ++i) {
    if (strncmp(v->items[i], entry, key_len) == 0) {
      free(v->items[i]);
      v->items[i] = entry;
      return;
    }
  }
  if (v->count + 2 > v->cap) {
    v->cap = v->cap ? v->cap * 2 : 32;
    v->items = xrealloc(v->items, v->cap * sizeof *v->items);
  }
  v->items[v->count++] = entry;
  v->items[v->count] = NULL;
}

/* Copies a borrowed key/value list over `v` (its values win); refuses names and values that an
 * environment cannot hold. */
static sbx_status strv_put_all(strv* v, sbx_kv_list env, char* message) {
  for (size_t i = 0; i < env.count && env.items; ++i) {
    const sbx_kv kv = env.items[i];
    if (!valid_text(kv.key) || !valid_text(kv.value) || kv.key.len == 0 ||
        memchr(kv.key.data, '=', kv.key.len)) {
      return failf(message, SBX_STATUS_INVALID_ARGUMENT, "env has an invalid name or value");
    }
    char* entry = xrealloc(NULL, kv.key.len + kv.value.len + 2);
    memcpy(entry, kv.key.data, kv.key.len);
    entry[kv.key.len] = '=';
    if (kv.value.len) memcpy(entry + kv.key.len + 1, kv.value.data, kv.value.len);
    entry[kv.key.len + 1 + kv.value.len] = '\0';
    strv_put(v, entry);
  }
  return SBX_STATUS_OK;
}

static const char* skip_space(const char* p, const char* end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
    ++p;
  return p;
}

/* True for an empty JSON object, or for unset text (which means {}). */
static bool empty_object(sbx_str json) {
  if (!json.data) return true;
  const char* end = json.data + json.len;
  const char* p = skip_space(json.data, end);
  if (p == end || *p++ != '{') return false;
  p = skip_space(p, end);
  if (p == end || *p++ != '}') return false;
  return skip_space(p, end) == end;
}

/* ---- The provider and its threads ----------------------------------------------------------- */

typedef struct worker {
  struct worker* next;
  pthread_t thread;
  struct op* op;
} worker;

typedef struct provider_state {
  sbx_provider c;        /* the table the host holds; c.provider_data points here */
  const sbx_host* host;  /* host-owned, valid until destroy returns */
  char* root;            /* where sandbox directories are made */
  pthread_mutex_t mutex; /* guards the fields below */
  pthread_cond_t idle;   /* signalled when `running` drops */
  size_t running;        /* operation threads started and not finished */
  worker* finished;      /* finished threads, not joined yet */
} provider_state;

static int64_t now_ms(const provider_state* p) {
  const sbx_host* h = p->host;
  if (SBX_HAS_FIELD(h, sbx_host, now_ns) && h->now_ns) return h->now_ns(h) / 1000000;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void join_workers(worker* list) {
  while (list) {
    worker* next = list->next;
    pthread_join(list->thread, NULL);
    free(list);
    list = next;
  }
}

/* ---- Sandboxes ------------------------------------------------------------------------------ */

typedef struct sandbox_state {
  sbx_sandbox c;         /* the handle the host holds; c.sandbox_data points here */
  char* dir;             /* host directory, NULL until create made it */
  const char* id;        /* its last component, e.g. "sbx-v10-a1B2c3" (points into dir) */
  char* workdir;         /* absolute sandbox path, "/" when the spec had none */
  strv env;              /* the spec's env */
  pthread_mutex_t mutex; /* guards closed and groups */
  bool closed;
  pid_t* groups; /* process groups of running commands, killed by close */
  size_t group_count, group_cap;
} sandbox_state;

static sandbox_state* sandbox_new(void) {
  sandbox_state* s = xcalloc(1, sizeof *s);
  s->c.struct_size = sizeof s->c;
  s->c.sandbox_data = s;
  pthread_mutex_init(&s->mutex, NULL);
  return s;
}

static void sandbox_free(sandbox_state* s) {
  if (!s) return;
  free(s->dir);
  free(s->workdir);
  strv_free(&s->env);
  free(s->groups);
  pthread_mutex_destroy(&s->mutex);
  free(s);
}

/* Closed through this handle, or its directory removed behind its back. */
static bool sandbox_gone(sandbox_state* s) {
  pthread_mutex_lock(&s->mutex);
  const bool closed = s->closed;
  pthread_mutex_unlock(&s->mutex);
  struct stat st;
  return closed || stat(s->dir, &st) != 0 || !S_ISDIR(st.st_mode);
}

/* Records a running command's process group; one started while close ran is killed at once. */
static void sandbox_track(sandbox_state* s, pid_t group) {
  pthread_mutex_lock(&s->mutex);
  const bool closed = s->closed;
  if (!closed) {
    if (s->group_count == s->group_cap) {
      s->group_cap = s->group_cap ? s->group_cap * 2 : 8;
      s->groups = xrealloc(s->groups, s->group_cap * sizeof *s->groups);
    }
    s->groups[s->group_count++] = group;
  }
  pthread_mutex_unlock(&s->mutex);
  if (closed) kill(-group, SIGKILL);
}

static void sandbox_untrack(sandbox_state* s, pid_t group) {
  pthread_mutex_lock(&s->mutex);
  for (size_t i = 0; i < s->group_count; ++i) {
    if (s->groups[i] == group) {
      s->groups[i] = s->groups[--s->group_count];
      break;
    }
  }
  pthread_mutex_unlock(&s->mutex);
}

/* Marks the sandbox closed and kills every command running in it. */
static void sandbox_mark_closed(sandbox_state* s) {
  pthread_mutex_lock(&s->mutex);
  s->closed = true;
  for (size_t i = 0; i < s->group_count; ++i)
    kill(-s->groups[i], SIGKILL);
  pthread_mutex_unlock(&s->mutex);
}

/* ---- Paths ---------------------------------------------------------------------------------- */

/* Normalises a sandbox path into one relative to the sandbox directory ("a/b"; "" is its root).
 * A relative `path` is relative to `base`, an absolute sandbox path. "." and empty components
 * are dropped and ".." goes up; a path that would go above the root is refused. With `file`, a
 * path that names the root itself is refused too. */
static sbx_status normalize(const char* base, sbx_str path, bool file, char** out, char* message) {
  const int shown = (int)(path.len < 200 ? path.len : 200);
  if (!valid_text(path)) {
    return failf(message, SBX_STATUS_INVALID_ARGUMENT, "a sandbox path contains a NUL byte");
  }
  const size_t base_len = path.len && path.data[0] == '/' ? 0 : strlen(base);
  char* joined = xrealloc(NULL, base_len + path.len + 2);
  char* rel = xrealloc(NULL, base_len + path.len + 2);
  memcpy(joined, base, base_len);
  joined[base_len] = '/';
  if (path.len) memcpy(joined + base_len + 1, path.data, path.len);
  joined[base_len + 1 + path.len] = '\0';
  size_t n = 0;
  bool escapes = false;
  for (const char* p = joined; *p && !escapes;) {
    const size_t len = strcspn(p, "/");
    if (len == 2 && p[0] == '.' && p[1] == '.') {
      escapes = n == 0;
      while (n > 0 && rel[n - 1] != '/')
        --n;
      if (n > 0) --n; /* the '/' before the dropped component */
    } else if (len > 0 && !(len == 1 && p[0] == '.')) {
      if (n > 0) rel[n++] = '/';
      memcpy(rel + n, p, len);
      n += len;
    }
    p += len;
    if (*p == '/') ++p;
  }
  rel[n] = '\0';
  free(joined);
  if (escapes || (file && n == 0)) {
    free(rel);
    return failf(message, SBX_STATUS_INVALID_ARGUMENT, "path %.*s %s", shown, path.data,
                 escapes ? "leaves the sandbox" : "is the sandbox's root directory");
  }
  *out = rel;
  return SBX_STATUS_OK;
}

/* "<dir>/<rel>", malloc'ed. */
static char* join_path(const char* dir, const char* rel) {
  const size_t dir_len = strlen(dir), rel_len = strlen(rel);
  char* path = xrealloc(NULL, dir_len + rel_len + 2);
  memcpy(path, dir, dir_len);
  path[dir_len] = '/';
  memcpy(path + dir_len + 1, rel, rel_len + 1);
  return path;
}

/* The host path of a sandbox path: mapped into the sandbox's directory. */
static sbx_status host_path(const sandbox_state* s, sbx_str path, bool file, char** out,
                            char* message) {
  char* rel;
  const sbx_status status = normalize(s->workdir, path, file, &rel, message);
  if (status != SBX_STATUS_OK) return status;
  *out = join_path(s->dir, rel);
  free(rel);
  return SBX_STATUS_OK;
}

/* Creates the missing directories of `path` below its first `from` bytes (the sandbox's
 * directory); with `parent_only`, not the last component. Returns 0 or an errno. */
static int make_dirs(const char* path, size_t from, bool parent_only) {
  char* p = copy_text(path, strlen(path));
  int error = 0;
  for (char* c = p + from + 1; !error; ++c) {
    const char saved = *c;
    if (saved != '/' && saved != '\0') continue;
    if (saved == '\0' && parent_only) break;
    *c = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST) error = errno;
    *c = saved;
    if (saved == '\0') break;
  }
  free(p);
  return error;
}

static int remove_entry(const char* path, const struct stat* st, int type, struct FTW* ftw) {
  (void)st;
  (void)type;
  (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* rm -rf; a tree that is gone already is success. A command killed a moment ago may still add a
 * file meanwhile, hence the retries. Returns 0 or an errno. */
static int remove_tree(const char* dir) {
  int error = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 || errno == ENOENT) return 0;
    error = errno;
  }
  return error;
}

/* ---- Operations ----------------------------------------------------------------------------- */

enum kind { KIND_CREATE, KIND_EXEC, KIND_DONE };

/* The host's callbacks of one operation, copied from the start call's borrowed struct. */
typedef struct callbacks {
  enum kind kind;
  void* user_data;
  void(SBX_ABI* on_sandbox)(void* user_data, sbx_sandbox* sandbox, const sbx_error* error);
  void(SBX_ABI* on_output)(void* user_data, int32_t stream, sbx_bytes chunk);
  void(SBX_ABI* on_result)(void* user_data, const sbx_exec_result* result, const sbx_error* error);
  void(SBX_ABI* on_done)(void* user_data, const sbx_error* error);
} callbacks;

typedef struct startup_file {
  char* rel; /* normalised, relative to the sandbox directory */
  uint8_t* data;
  size_t len;
} startup_file;

typedef struct op op;

struct op {
  sbx_operation handle; /* given to the host; handle.plugin_data points here */
  atomic_int refs;      /* the host's (until release) and the worker's (until completion) */
  atomic_bool cancelled;
  int wake[2]; /* exec: cancel writes a byte to wake[1], the exec loop polls wake[0] */
  provider_state* provider;
  sandbox_state* sandbox; /* the host's handle (not create's): borrowed until completion */
  callbacks cb;
  sbx_status (*run)(op* o);  /* the work, on the op's thread */
  char message[MESSAGE_MAX]; /* why the operation failed */
  /* create */
  sandbox_state* made; /* the new sandbox; the host owns it once on_complete has it */
  startup_file* files;
  size_t file_count;
  /* exec */
  char* command;
  char* cwd; /* host path */
  strv env;
  int64_t timeout_ms;
  int32_t return_code;
  const char* error_type; /* static text or NULL */
  buffer out, err;        /* output kept for the result when the host has no on_output */
  /* upload and download */
  char* path;                     /* host path of the remote file */
  char* shown;                    /* the remote path as the host gave it, for messages */
  const sbx_input_stream* source; /* host-owned, valid until on_complete returns */
  const sbx_output_stream* sink;  /* idem */
  uint32_t mode;
};

static void op_free(op* o) {
  for (size_t i = 0; i < o->file_count; ++i) {
    free(o->files[i].rel);
    free(o->files[i].data);
  }
  free(o->files);
  sandbox_free(o->made); /* only when it was not handed to the host */
  free(o->command);
  free(o->cwd);
  strv_free(&o->env);
  free(o->out.data);
  free(o->err.data);
  free(o->path);
  free(o->shown);
  if (o->wake[0] >= 0) close(o->wake[0]);
  if (o->wake[1] >= 0) close(o->wake[1]);
  free(o);
}

static void op_unref(op* o) {
  if (atomic_fetch_sub(&o->refs, 1) == 1) op_free(o);
}

/* [thread-safe], idempotent, non-blocking: the op's thread sees the flag (exec: its pipe too). */
static void SBX_ABI op_cancel(sbx_operation* handle) {
  op* o = (op*)handle->plugin_data;
  if (atomic_exchange(&o->cancelled, true) || o->wake[1] < 0) return;
  const char byte = 1;
  const ssize_t ignored = write(o->wake[1], &byte, 1); /* non-blocking */
  (void)ignored;
}

static void SBX_ABI op_release(sbx_operation* handle) {
  op_unref((op*)handle->plugin_data);
}

static op* op_new(sbx_provider* p, sbx_sandbox* sandbox, callbacks cb, sbx_status (*run)(op*)) {
  op* o = xcalloc(1, sizeof *o);
  o->handle.struct_size = sizeof o->handle;
  o->handle.plugin_data = o;
  o->handle.cancel = op_cancel;
  o->handle.release = op_release;
  atomic_init(&o->refs, 1);
  atomic_init(&o->cancelled, false);
  o->wake[0] = o->wake[1] = -1;
  o->provider = (provider_state*)p->provider_data;
  o->sandbox = sandbox ? (sandbox_state*)sandbox->sandbox_data : NULL;
  o->cb = cb;
  o->run = run;
  return o;
}

static void complete_error(const callbacks* cb, sbx_status status, const char* message) {
  const sbx_error e = error_of(status, message);
  switch (cb->kind) {
    case KIND_CREATE:
      cb->on_sandbox(cb->user_data, NULL, &e);
      break;
    case KIND_EXEC:
      cb->on_result(cb->user_data, NULL, &e);
      break;
    case KIND_DONE:
      cb->on_done(cb->user_data, &e);
      break;
  }
}

static void complete_ok(op* o) {
  sbx_exec_result r;
  switch (o->cb.kind) {
    case KIND_CREATE: {
      sandbox_state* s = o->made;
      o->made = NULL; /* the host owns it from here on */
      o->cb.on_sandbox(o->cb.user_data, &s->c, NULL);
      break;
    }
    case KIND_EXEC:
      memset(&r, 0, sizeof r);
      r.struct_size = sizeof r;
      r.return_code = o->return_code;
      r.error_type = o->error_type ? str_of(o->error_type) : sbx_str_unset();
      r.stdout_bytes.data = o->out.data;
      r.stdout_bytes.len = o->out.len;
      r.stderr_bytes.data = o->err.data;
      r.stderr_bytes.len = o->err.len;
      o->cb.on_result(o->cb.user_data, &r, NULL);
      break;
    case KIND_DONE:
      o->cb.on_done(o->cb.user_data, NULL);
      break;
  }
}

/* Every operation thread: runs, completes exactly once, then leaves itself to be joined. */
static void* worker_main(void* arg) {
  worker* w = (worker*)arg;
  op* o = w->op;
  provider_state* p = o->provider;
  const sbx_status status = o->run(o);
  if (status == SBX_STATUS_OK) {
    complete_ok(o);
  } else {
    complete_error(&o->cb, status, o->message);
  }
  op_unref(o); /* the op may be gone now; the provider is not (destroy waits for `running`) */
  pthread_mutex_lock(&p->mutex);
  w->thread = pthread_self();
  w->next = p->finished;
  p->finished = w;
  p->running--;
  pthread_cond_broadcast(&p->idle);
  pthread_mutex_unlock(&p->mutex);
  return NULL;
}

static bool start_thread(op* o) {
  provider_state* p = o->provider;
  worker* w = xcalloc(1, sizeof *w);
  w->op = o;
  pthread_mutex_lock(&p->mutex);
  worker* finished = p->finished;
  p->finished = NULL;
  p->running++;
  pthread_mutex_unlock(&p->mutex);
  join_workers(finished); /* they are past their last lock: joining them takes no time */
  pthread_t thread;
  if (pthread_create(&thread, NULL, worker_main, w) == 0) return true;
  pthread_mutex_lock(&p->mutex);
  p->running--;
  pthread_cond_broadcast(&p->idle);
  pthread_mutex_unlock(&p->mutex);
  free(w);
  return false;
}

/* Runs a prepared operation on a thread of its own; or, when `status` (the preparation's) is a
 * failure, completes it inline with o->message and returns no handle. */
static sbx_operation* launch(op* o, sbx_status status) {
  if (status == SBX_STATUS_OK) {
    atomic_store(&o->refs, 2); /* the worker's and the host's */
    if (start_thread(o)) return &o->handle;
    status = failf(o->message, SBX_STATUS_RESOURCE_EXHAUSTED, "cannot start a thread");
  }
  complete_error(&o->cb, status, o->message);
  op_free(o);
  return NULL;
}

/* What every operation on a sandbox checks when it starts. */
static sbx_status require_sandbox(op* o) {
  if (!o->sandbox) return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "no sandbox given");
  if (sandbox_gone(o->sandbox)) {
    return failf(o->message, SBX_STATUS_NOT_FOUND, "sandbox %s no longer exists", o->sandbox->id);
  }
  return SBX_STATUS_OK;
}

/* ---- create --------------------------------------------------------------------------------- */

/* Copies from the borrowed spec what the sandbox and its creation need. */
static sbx_status prepare_create(op* o, const sbx_spec* spec) {
  if (!spec || !SBX_HAS_FIELD(spec, sbx_spec, labels)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the spec is smaller than ABI 1.0's");
  }
  if (!valid_text(spec->provider_options) || !empty_object(spec->provider_options)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT,
                 "provider_options: v1_0_processes takes no options");
  }
  if (spec->ttl_ms.set) {
    return failf(o->message, SBX_STATUS_UNIMPLEMENTED,
                 "v1_0_processes cannot end a sandbox at a TTL; create it without ttl_s");
  }
  sandbox_state* s = o->made = sandbox_new();
  char* rel;
  sbx_status status = normalize("/", spec->workdir, false, &rel, o->message);
  if (status != SBX_STATUS_OK) return status;
  s->workdir = join_path("", rel); /* "/" + rel */
  free(rel);
  status = strv_put_all(&s->env, spec->env, o->message);
  if (status != SBX_STATUS_OK) return status;
  const size_t count = spec->files.items ? spec->files.count : 0;
  o->files = xcalloc(count, sizeof *o->files);
  o->file_count = count; /* entries stay zeroed when a copy stops early: op_free copes */
  for (size_t i = 0; i < count; ++i) {
    const sbx_file* f = &spec->files.items[i];
    status = normalize(s->workdir, f->path, true, &o->files[i].rel, o->message);
    if (status != SBX_STATUS_OK) return status;
    if (f->contents.len && !f->contents.data) {
      return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "a startup file has no contents");
    }
    o->files[i].len = f->contents.len;
    o->files[i].data = xrealloc(NULL, f->contents.len);
    if (f->contents.len) memcpy(o->files[i].data, f->contents.data, f->contents.len);
  }
  return SBX_STATUS_OK;
}

static int write_startup_file(const sandbox_state* s, const startup_file* f) {
  char* path = join_path(s->dir, f->rel);
  int error = make_dirs(path, strlen(s->dir), true);
  if (!error) {
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 || !write_all(fd, f->data, f->len)) error = errno;
    if (fd >= 0 && close(fd) != 0 && !error) error = errno;
  }
  free(path);
  return error;
}

/* The sandbox's workdir and startup files. */
static sbx_status fill_sandbox(op* o) {
  const sandbox_state* s = o->made;
  char* workdir = join_path(s->dir, s->workdir + 1);
  const int error = make_dirs(workdir, strlen(s->dir), false);
  free(workdir);
  if (error) {
    return failf(o->message, SBX_STATUS_CREATE_FAILED, "cannot create the workdir %s: %s",
                 s->workdir, strerror(error));
  }
  for (size_t i = 0; i < o->file_count; ++i) {
    if (atomic_load(&o->cancelled)) {
      return failf(o->message, SBX_STATUS_CANCELLED, "create cancelled");
    }
    const int file_error = write_startup_file(s, &o->files[i]);
    if (file_error) {
      return failf(o->message, SBX_STATUS_CREATE_FAILED, "cannot write the startup file /%s: %s",
                   o->files[i].rel, strerror(file_error));
    }
  }
  return SBX_STATUS_OK;
}

static sbx_status run_create(op* o) {
  sandbox_state* s = o->made;
  const char* root = o->provider->root;
  static const char name[] = "/sbx-v10-XXXXXX";
  char* dir = xrealloc(NULL, strlen(root) + sizeof name);
  strcpy(dir, root);
  strcat(dir, name);
  if (!mkdtemp(dir)) {
    const int error = errno;
    free(dir);
    return failf(o->message, SBX_STATUS_CREATE_FAILED,
                 "cannot create a sandbox directory under %s: %s", root, strerror(error));
  }
  s->dir = dir;
  s->id = strrchr(dir, '/') + 1;
  s->c.id = str_of(s->id);
  const sbx_status status = fill_sandbox(o);
  if (status != SBX_STATUS_OK) remove_tree(s->dir); /* a failed create leaves nothing behind */
  return status;
}

/* ---- exec ----------------------------------------------------------------------------------- */

static sbx_status prepare_exec(op* o, const sbx_exec_request* req) {
  if (!req || !SBX_HAS_FIELD(req, sbx_exec_request, user)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the exec request is too small");
  }
  sbx_status status = require_sandbox(o);
  if (status != SBX_STATUS_OK) return status;
  if (sbx_str_is_set(req->user)) {
    return failf(o->message, SBX_STATUS_UNIMPLEMENTED,
                 "v1_0_processes runs commands as the host's user only; leave `user` unset");
  }
  if (!valid_text(req->command)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the command contains a NUL byte");
  }
  const sandbox_state* s = o->sandbox;
  const sbx_str cwd = sbx_str_is_set(req->cwd) ? req->cwd : str_of(s->workdir);
  status = host_path(s, cwd, false, &o->cwd, o->message);
  if (status != SBX_STATUS_OK) return status;
  o->command = copy_text(req->command.data, req->command.len);
  /* The environment: the host process's, then the spec's, then the exec's; the later wins. */
  for (char** e = environ; e && *e; ++e)
    strv_put(&o->env, copy_text(*e, strlen(*e)));
  for (size_t i = 0; i < s->env.count; ++i) {
    strv_put(&o->env, copy_text(s->env.items[i], strlen(s->env.items[i])));
  }
  status = strv_put_all(&o->env, req->env, o->message);
  if (status != SBX_STATUS_OK) return status;
  o->timeout_ms = req->timeout_ms.set ? req->timeout_ms.value : DEFAULT_TIMEOUT_MS;
  if (o->timeout_ms < 0) o->timeout_ms = 0;
  if (o->timeout_ms > MAX_TIMEOUT_MS) o->timeout_ms = MAX_TIMEOUT_MS;
  if (pipe2(o->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    return failf(o->message, status_of_errno(errno), "pipe: %s", strerror(errno));
  }
  return SBX_STATUS_OK;
}

/* Starts `/bin/sh -c command` in a process group of its own, stdin from /dev/null, stdout and
 * stderr into the given pipes, with the op's cwd and environment. Returns its pid, or -1. */
static pid_t spawn_shell(op* o, int out_fd, int err_fd) {
  static char sh[] = "/bin/sh", dash_c[] = "-c";
  char* argv[] = {sh, dash_c, o->command, NULL};
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE); /* a host that ignores SIGPIPE must not pass that on */
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err_fd, 2);
  posix_spawn_file_actions_addchdir_np(&actions, o->cwd);
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, sh, &actions, &attr, argv, o->env.items);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return rc == 0 ? pid : -1;
}

/* Hands a chunk of output to the host as it arrives, or keeps it for the result. */
static void deliver(op* o, int32_t stream, const uint8_t* data, size_t len) {
  if (o->cb.on_output) {
    const sbx_bytes chunk = {data, len};
    o->cb.on_output(o->cb.user_data, stream, chunk); /* no lock of ours is held */
  } else {
    buffer_append(stream == SBX_STREAM_STDOUT ? &o->out : &o->err, data, len);
  }
}

enum stop { RAN, TIMED_OUT, CANCELLED };

/* Moves output until the command has ended (its pipes closed and the shell exited) or it is
 * stopped by its timeout or a cancel. A stopped command's process group is killed, and what it
 * still writes is read for DRAIN_MS at most (a process outside the group may hold the pipes). */
static enum stop pump(op* o, int pipes[2], pid_t pid) {
  const int64_t deadline = now_ms(o->provider) + o->timeout_ms;
  int64_t drain_until = -1;
  enum stop why = RAN;
  uint8_t chunk[CHUNK];
  for (;;) {
    const int64_t now = now_ms(o->provider);
    if (why == RAN && atomic_load(&o->cancelled)) why = CANCELLED;
    if (why == RAN && now >= deadline) why = TIMED_OUT;
    if (why != RAN && drain_until < 0) {
      kill(-pid, SIGKILL);
      drain_until = now + DRAIN_MS;
    }
    const bool open = pipes[0] >= 0 || pipes[1] >= 0;
    if ((!open && why != RAN) || (drain_until >= 0 && now >= drain_until)) break;
    if (!open) { /* output ended: has the shell exited? (WNOWAIT: it is reaped by the caller) */
      siginfo_t info;
      info.si_pid = 0;
      if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid) break;
    }
    int64_t timeout = (drain_until >= 0 ? drain_until : deadline) - now + 1;
    if (!open && timeout > 20) timeout = 20; /* no pipe wakes us when the shell exits */
    struct pollfd fds[3] = {
        {pipes[0], POLLIN, 0}, {pipes[1], POLLIN, 0}, {why == RAN ? o->wake[0] : -1, POLLIN, 0}};
    if (poll(fds, 3, (int)(timeout < INT_MAX ? timeout : INT_MAX)) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (pipes[i] < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = read(pipes[i], chunk, sizeof chunk);
      if (n > 0) {
        deliver(o, i == 0 ? SBX_STREAM_STDOUT : SBX_STREAM_STDERR, chunk, (size_t)n);
      } else if (n == 0 || errno != EINTR) {
        close(pipes[i]);
        pipes[i] = -1;
      }
    }
  }
  return why;
}

static sbx_status run_exec(op* o) {
  struct stat st;
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  pid_t pid = -1;
  if (stat(o->cwd, &st) == 0 && S_ISDIR(st.st_mode) && pipe2(out, O_CLOEXEC) == 0 &&
      pipe2(err, O_CLOEXEC) == 0) {
    pid = spawn_shell(o, out[1], err[1]);
  }
  if (out[1] >= 0) close(out[1]); /* the child has its copies */
  if (err[1] >= 0) close(err[1]);
  int pipes[2] = {out[0], err[0]};
  enum stop why = RAN;
  int status = 0;
  if (pid > 0) {
    sandbox_track(o->sandbox, pid);
    why = pump(o, pipes, pid);
    kill(-pid, SIGKILL); /* nothing of the command outlives the exec */
    sandbox_untrack(o->sandbox, pid);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (pipes[0] >= 0) close(pipes[0]);
  if (pipes[1] >= 0) close(pipes[1]);
  if (why == CANCELLED) return failf(o->message, SBX_STATUS_CANCELLED, "exec cancelled");
  if (pid <= 0 || why == TIMED_OUT) { /* the sandbox could not run it, or the timeout hit */
    o->return_code = SBX_EXEC_RETURN_CODE_NO_PROCESS;
    o->error_type = pid <= 0 ? SBX_EXEC_ERROR_SANDBOX : SBX_EXEC_ERROR_TIMEOUT;
  } else {
    o->return_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return SBX_STATUS_OK;
}

/* ---- upload and download -------------------------------------------------------------------- */

static sbx_status prepare_transfer(op* o, sbx_str remote_path) {
  const sbx_status status = require_sandbox(o);
  if (status != SBX_STATUS_OK) return status;
  o->shown = copy_text(remote_path.data, valid_text(remote_path) ? remote_path.len : 0);
  return host_path(o->sandbox, remote_path, true, &o->path, o->message);
}

static sbx_status prepare_upload(op* o, const sbx_upload_request* req) {
  if (!req || !SBX_HAS_FIELD(req, sbx_upload_request, mode)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the upload request is too small");
  }
  const sbx_input_stream* source = req->source;
  if (!source || !SBX_HAS_FIELD(source, sbx_input_stream, read) || !source->read ||
      source->size < 0) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the upload has no usable source");
  }
  o->source = source;
  o->mode = req->mode ? (req->mode & 07777) : 0644;
  return prepare_transfer(o, req->remote_path);
}

/* Reads exactly source->size bytes from the host's stream into `fd`. */
static sbx_status copy_source(op* o, int fd) {
  const int64_t size = o->source->size;
  int64_t total = 0;
  uint8_t chunk[CHUNK];
  while (total < size) {
    if (atomic_load(&o->cancelled)) return failf(o->message, SBX_STATUS_CANCELLED, "cancelled");
    const size_t want = size - total < CHUNK ? (size_t)(size - total) : CHUNK;
    const int64_t n = o->source->read(o->source->ctx, chunk, want);
    if (n <= 0 || (uint64_t)n > want) {
      const char* what = n < 0 ? "failed" : n == 0 ? "ended" : "overran";
      return failf(o->message, SBX_STATUS_INTERNAL,
                   "the upload's source %s after %lld of %lld bytes", what, (long long)total,
                   (long long)size);
    }
    if (!write_all(fd, chunk, (size_t)n)) {
      return failf(o->message, status_of_errno(errno), "writing %s: %s", o->shown, strerror(errno));
    }
    total += n;
  }
  return SBX_STATUS_OK;
}

/* Writes a temporary file next to the target and renames it into place: a failed upload leaves
 * nothing partial. */
static sbx_status run_upload(op* o) {
  const int error = make_dirs(o->path, strlen(o->sandbox->dir), true);
  if (error) {
    return failf(o->message, status_of_errno(error), "cannot create the parents of %s: %s",
                 o->shown, strerror(error));
  }
  static const char suffix[] = ".sbx-upload-XXXXXX";
  char* temp = xrealloc(NULL, strlen(o->path) + sizeof suffix);
  strcpy(temp, o->path);
  strcat(temp, suffix);
  const int fd = mkostemp(temp, O_CLOEXEC);
  sbx_status status = SBX_STATUS_OK;
  if (fd < 0) {
    status =
        failf(o->message, status_of_errno(errno), "cannot write %s: %s", o->shown, strerror(errno));
  } else {
    status = copy_source(o, fd);
    if (status == SBX_STATUS_OK && fchmod(fd, (mode_t)o->mode) != 0) {
      status = failf(o->message, status_of_errno(errno), "chmod %s: %s", o->shown, strerror(errno));
    }
    if (close(fd) != 0 && status == SBX_STATUS_OK) {
      status =
          failf(o->message, status_of_errno(errno), "writing %s: %s", o->shown, strerror(errno));
    }
    if (status == SBX_STATUS_OK && rename(temp, o->path) != 0) {
      const int e = errno;
      status = failf(o->message, e == EISDIR ? SBX_STATUS_INVALID_ARGUMENT : status_of_errno(e),
                     "cannot write %s: %s", o->shown, strerror(e));
    }
    if (status != SBX_STATUS_OK) unlink(temp);
  }
  free(temp);
  return status;
}

static sbx_status prepare_download(op* o, const sbx_download_request* req) {
  if (!req || !SBX_HAS_FIELD(req, sbx_download_request, sink)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the download request is too small");
  }
  const sbx_output_stream* sink = req->sink;
  if (!sink || !SBX_HAS_FIELD(sink, sbx_output_stream, write) || !sink->write) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the download has no usable sink");
  }
  o->sink = sink;
  return prepare_transfer(o, req->remote_path);
}

/* Writes one regular file to the host's sink; a link or a directory is refused. */
static sbx_status run_download(op* o) {
  struct stat st;
  if (lstat(o->path, &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return failf(o->message, SBX_STATUS_NOT_FOUND, "no such file in the sandbox: %s", o->shown);
    }
    return failf(o->message, status_of_errno(errno), "%s: %s", o->shown, strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "%s is not a regular file", o->shown);
  }
  const int fd = open(o->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return failf(o->message, status_of_errno(errno), "open %s: %s", o->shown, strerror(errno));
  }
  sbx_status status = SBX_STATUS_OK;
  uint8_t chunk[CHUNK];
  for (;;) {
    if (atomic_load(&o->cancelled)) {
      status = failf(o->message, SBX_STATUS_CANCELLED, "download cancelled");
      break;
    }
    const ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = failf(o->message, status_of_errno(errno), "read %s: %s", o->shown, strerror(errno));
    }
    if (n <= 0) break;
    const sbx_bytes data = {chunk, (size_t)n};
    if (o->sink->write(o->sink->ctx, data) != 0) {
      status = failf(o->message, SBX_STATUS_CANCELLED, "the host aborted the download");
      break;
    }
  }
  close(fd);
  return status;
}

/* ---- close ---------------------------------------------------------------------------------- */

static sbx_status run_close(op* o) {
  const int error = remove_tree(o->sandbox->dir);
  if (!error) return SBX_STATUS_OK;
  return failf(o->message, status_of_errno(error), "removing sandbox %s: %s", o->sandbox->id,
               strerror(error));
}

/* ---- The provider table --------------------------------------------------------------------- */

/* Callbacks that cannot be reported to start nothing: the start function returns NULL. */
#define USABLE(cb, type) ((cb) && SBX_HAS_FIELD(cb, type, on_complete) && (cb)->on_complete)

static callbacks done_callbacks(const sbx_done_callbacks* cb) {
  const callbacks c = {KIND_DONE, cb->user_data, NULL, NULL, NULL, cb->on_complete};
  return c;
}

static sbx_operation* SBX_ABI provider_create(sbx_provider* p, const sbx_spec* spec,
                                              const sbx_create_callbacks* cb) {
  if (!USABLE(cb, sbx_create_callbacks)) return NULL;
  const callbacks c = {KIND_CREATE, cb->user_data, cb->on_complete, NULL, NULL, NULL};
  op* o = op_new(p, NULL, c, run_create);
  return launch(o, prepare_create(o, spec));
}

static sbx_operation* SBX_ABI provider_exec(sbx_provider* p, sbx_sandbox* sandbox,
                                            const sbx_exec_request* req,
                                            const sbx_exec_callbacks* cb) {
  if (!USABLE(cb, sbx_exec_callbacks)) return NULL;
  const callbacks c = {KIND_EXEC, cb->user_data, NULL, cb->on_output, cb->on_complete, NULL};
  op* o = op_new(p, sandbox, c, run_exec);
  return launch(o, prepare_exec(o, req));
}

static sbx_operation* SBX_ABI provider_upload(sbx_provider* p, sbx_sandbox* sandbox,
                                              const sbx_upload_request* req,
                                              const sbx_done_callbacks* cb) {
  if (!USABLE(cb, sbx_done_callbacks)) return NULL;
  op* o = op_new(p, sandbox, done_callbacks(cb), run_upload);
  return launch(o, prepare_upload(o, req));
}

static sbx_operation* SBX_ABI provider_download(sbx_provider* p, sbx_sandbox* sandbox,
                                                const sbx_download_request* req,
                                                const sbx_done_callbacks* cb) {
  if (!USABLE(cb, sbx_done_callbacks)) return NULL;
  op* o = op_new(p, sandbox, done_callbacks(cb), run_download);
  return launch(o, prepare_download(o, req));
}

/* Completes inline: RUNNING while the directory exists and the sandbox is not closed. */
static sbx_operation* SBX_ABI provider_status(sbx_provider* p, sbx_sandbox* sandbox,
                                              const sbx_status_callbacks* cb) {
  (void)p;
  if (!USABLE(cb, sbx_status_callbacks)) return NULL;
  if (!sandbox) {
    const sbx_error e = error_of(SBX_STATUS_INVALID_ARGUMENT, "no sandbox given");
    cb->on_complete(cb->user_data, SBX_SANDBOX_UNKNOWN, &e);
    return NULL;
  }
  const bool gone = sandbox_gone((sandbox_state*)sandbox->sandbox_data);
  cb->on_complete(cb->user_data, gone ? SBX_SANDBOX_STOPPED : SBX_SANDBOX_RUNNING, NULL);
  return NULL;
}

/* Marks the sandbox closed and kills what runs in it at once; the op's thread removes the
 * directory. Closing twice is success (the directory is gone). */
static sbx_operation* SBX_ABI provider_close(sbx_provider* p, sbx_sandbox* sandbox,
                                             const sbx_done_callbacks* cb) {
  if (!USABLE(cb, sbx_done_callbacks)) return NULL;
  op* o = op_new(p, sandbox, done_callbacks(cb), run_close);
  if (!o->sandbox) {
    return launch(o, failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "no sandbox given"));
  }
  sandbox_mark_closed(o->sandbox);
  return launch(o, SBX_STATUS_OK);
}

/* Frees the handle; the sandbox (its directory) stays as it is. */
static void SBX_ABI provider_release_sandbox(sbx_provider* p, sbx_sandbox* sandbox) {
  (void)p;
  if (sandbox) sandbox_free((sandbox_state*)sandbox->sandbox_data);
}

/* No extension: this provider knows none of 1.0's, and 1.1's ids did not exist for it. */
static const void* SBX_ABI provider_get_extension(const sbx_provider* p, const char* id) {
  (void)p;
  (void)id;
  return NULL;
}

/* Called once every operation completed and every sandbox was released: waits for the threads
 * still returning from their last completion, and joins them all. */
static void SBX_ABI provider_destroy(sbx_provider* provider) {
  provider_state* p = (provider_state*)provider->provider_data;
  pthread_mutex_lock(&p->mutex);
  while (p->running > 0)
    pthread_cond_wait(&p->idle, &p->mutex);
  worker* finished = p->finished;
  p->finished = NULL;
  pthread_mutex_unlock(&p->mutex);
  join_workers(finished);
  pthread_cond_destroy(&p->idle);
  pthread_mutex_destroy(&p->mutex);
  free(p->root);
  free(p);
}

/* ---- Factory and plugin descriptor ---------------------------------------------------------- */

static sbx_status report(const sbx_error_sink* errors, sbx_status status, const char* message) {
  if (errors && SBX_HAS_FIELD(errors, sbx_error_sink, report) && errors->report) {
    const sbx_error e = error_of(status, message);
    errors->report(errors->ctx, &e);
  }
  return status;
}

static sbx_status SBX_ABI factory_create(const sbx_provider_factory* factory, const sbx_host* host,
                                         sbx_str config_json, sbx_provider** out,
                                         const sbx_error_sink* errors) {
  (void)factory;
  if (!out) return report(errors, SBX_STATUS_INVALID_ARGUMENT, "no place for the provider");
  *out = NULL;
  if (!host || !SBX_HAS_FIELD(host, sbx_host, get_extension)) {
    return report(errors, SBX_STATUS_INVALID_ARGUMENT, "the sbx_host is smaller than ABI 1.0's");
  }
  if (!valid_text(config_json) || !empty_object(config_json)) {
    return report(errors, SBX_STATUS_INVALID_ARGUMENT,
                  "$: v1_0_processes takes no configuration (expected {})");
  }
  provider_state* p = xcalloc(1, sizeof *p);
  const char* tmp = getenv("TMPDIR");
  p->root = tmp && *tmp ? copy_text(tmp, strlen(tmp)) : copy_text("/tmp", 4);
  p->host = host;
  pthread_mutex_init(&p->mutex, NULL);
  pthread_cond_init(&p->idle, NULL);
  p->c.struct_size = sizeof p->c;
  p->c.provider_data = p;
  p->c.create = provider_create;
  p->c.exec = provider_exec;
  p->c.upload = provider_upload;
  p->c.download = provider_download;
  p->c.status = provider_status;
  p->c.close = provider_close;
  p->c.release_sandbox = provider_release_sandbox;
  p->c.get_extension = provider_get_extension;
  p->c.destroy = provider_destroy;
  *out = &p->c;
  return SBX_STATUS_OK;
}

/* Refuses a host of another major version; a 1.1 host is welcome (same major). */
static sbx_status SBX_ABI plugin_init(const sbx_host* host, const sbx_error_sink* errors) {
  if (!host || !SBX_HAS_FIELD(host, sbx_host, abi_version)) {
    return report(errors, SBX_STATUS_INVALID_ARGUMENT, "the sbx_host is smaller than ABI 1.0's");
  }
  if (!sbx_version_is_compatible(host->abi_version)) {
    return report(errors, SBX_STATUS_FAILED_PRECONDITION, "the host's ABI major version is not 1");
  }
  return SBX_STATUS_OK;
}

static void SBX_ABI plugin_deinit(void) {}

static const sbx_provider_factory factory = {
    sizeof(sbx_provider_factory), "v1_0_processes",
    "Sandboxes as host processes in private directories, built against ABI 1.0 (tests only)",
    "{\"type\": \"object\", \"additionalProperties\": false}", factory_create};
static const sbx_provider_factory* const factories[] = {&factory};

SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {
  static const sbx_plugin plugin = {sizeof(sbx_plugin),
                                    SBX_ABI_VERSION_INIT,
                                    "v1_0_processes",
                                    "0.1.0",
                                    "a plain-C ABI 1.0 provider for the compatibility test",
                                    plugin_init,
                                    plugin_deinit,
                                    1,
                                    factories};
  return &plugin;
}
