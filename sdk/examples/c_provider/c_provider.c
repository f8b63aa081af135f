/* c_provider: a complete sbx provider plugin in plain C11, written against the C headers alone
 * (sbx/abi.h), with no SDK. Copy it when you write a provider in C (or in any language that can
 * export a C function): it shows every duty the ABI puts on a plugin.
 *
 * What it provides: each sandbox is a private temporary directory on the host, each command a host
 * process (/bin/sh -c) running in it. There is NO isolation: a command can reach the whole host. It
 * is an example of the ABI, not a sandbox.
 *
 * The rules it follows are those of docs/sandbox-semantics.md; in short:
 *   - Paths: the sandbox path "/work/x" is "<dir>/work/x" on the host; a relative path is relative
 *     to the spec's workdir ("/" when none); a path that would leave <dir> is INVALID_ARGUMENT.
 *     Symbolic links are NOT resolved inside <dir>: the commands are unconfined anyway. A provider
 *     that isolates must resolve them inside its root (docs/sandbox-semantics.md, "Paths").
 *   - Every start function copies what it needs from its BORROWED arguments and returns at once;
 *     the work runs on a thread of its own, and on_complete is called EXACTLY ONCE.
 *   - Cancellation works for real: a cancelled exec kills its command within milliseconds.
 *   - A sandbox that is gone (closed, expired, its directory removed) answers NOT_FOUND to exec,
 *     upload and download, STOPPED to status, and success to close. An exec still running when its
 *     sandbox goes ends then: its command is killed and the exec completes with NOT_FOUND, not
 *     with a result (it checks at least every GONE_POLL_MS).
 *   - Honest declarations: `user` is not offered (UNIMPLEMENTED), no extension is offered, and a
 *     TTL is kept by a watchdog process in a session of its own (`sleep TTL; rm -rf DIR`), so it
 *     holds when the host process is gone; close stops the watchdog. While the host process lives
 *     the sandbox is gone from its expiry on, even before the watchdog has removed it.
 *
 * Threads: every operation but status runs on a joinable thread of its own. A finished thread is
 * joined by the next start call or by destroy, so that when destroy returns no thread of this
 * library runs (the host may unload it next).
 *
 * Memory: an operation (`op`) has two references, the host's (dropped by `release`) and its
 * thread's (dropped after on_complete); the last one frees it. Running out of memory aborts: an
 * example has no better answer to it.
 *
 * It builds against any ABI 1.x headers: sbx's tests build this same file a second time against
 * the frozen ABI 1.0 headers, as the plugin "v1_0_processes", to show that a 1.0 plugin works
 * under a newer host (tests/plugins/CMakeLists.txt). */
#define _GNU_SOURCE /* pipe2, mkostemp, posix_spawn_file_actions_add{chdir,closefrom}_np */

#include <sbx/abi.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The plugin's name and its provider's id (a string literal). */
#ifndef C_PROVIDER_ID
#define C_PROVIDER_ID "c_provider"
#endif

#define DEFAULT_TIMEOUT_MS (10LL * 60 * 1000)     /* an exec without a timeout */
#define MAX_TIMEOUT_MS (100LL * 24 * 3600 * 1000) /* deadline arithmetic never overflows */
#define CHUNK 65536                               /* bytes moved per read */
#define MESSAGE_MAX 512                           /* an error message; longer ones are cut */
#define GONE_POLL_MS 200                          /* a running exec checks its sandbox this often */

/* ---- Small helpers -------------------------------------------------------------------------- */

static void* xrealloc(void* p, size_t size) {
  p = realloc(p, size ? size : 1);
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

/* True for "{}" with any whitespace, or unset text: this provider has no settings and no
 * provider_options. */
static bool empty_object(sbx_str json) {
  size_t braces = 0;
  for (size_t i = 0; json.data && i < json.len; ++i) {
    const char c = json.data[i];
    if ((c == '{' && braces == 0) || (c == '}' && braces == 1)) {
      ++braces;
    } else if (c != ' ' && c != '\t' && c != '\r' && c != '\n') {
      return false;
    }
  }
  return !json.data || braces == 2;
}

/* An sbx_str that can become a C string: no NUL byte inside. */
static bool valid_text(sbx_str s) {
  return s.len == 0 || (s.data && !memchr(s.data, '\0', s.len));
}

/* Writes a message into `message` (MESSAGE_MAX bytes) and returns `status`. */
static sbx_status failf(char* message, sbx_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(message, MESSAGE_MAX, format, args);
  va_end(args);
  return status;
}

static sbx_error error_of(sbx_status status, const char* message) {
  sbx_error e;
  memset(&e, 0, sizeof e);
  e.struct_size = sizeof e;
  e.status = status;
  e.message = str_of(message);
  e.request_id = sbx_str_unset();
  return e;
}

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

/* A growable byte buffer: exec output kept for the result when the host does not stream. */
typedef struct buffer {
  uint8_t* data;
  size_t len, cap;
} buffer;

static void buffer_append(buffer* b, const uint8_t* data, size_t n) {
  if (b->len + n > b->cap) {
    b->cap = (b->len + n) * 2;
    b->data = xrealloc(b->data, b->cap);
  }
  memcpy(b->data + b->len, data, n);
  b->len += n;
}

/* An environment: a NULL-terminated array of malloc'ed "KEY=VALUE" strings. */
typedef struct env_list {
  char** items;
  size_t count;
} env_list;

static void env_free(env_list* v) {
  for (size_t i = 0; i < v->count; ++i)
    free(v->items[i]);
  free(v->items);
  v->items = NULL;
  v->count = 0;
}

/* Takes `entry`: replaces the entry with the same key, or appends it. */
static void env_put(env_list* v, char* entry) {
  const size_t key_len = strcspn(entry, "=") + 1;
  for (size_t i = 0; i < v->count; ++i) {
    if (strncmp(v->items[i], entry, key_len) == 0) {
      free(v->items[i]);
      v->items[i] = entry;
      return;
    }
  }
  v->items = xrealloc(v->items, (v->count + 2) * sizeof *v->items);
  v->items[v->count++] = entry;
  v->items[v->count] = NULL;
}

/* Copies a BORROWED key/value list over `v` (its values win). */
static sbx_status env_put_all(env_list* v, sbx_kv_list kvs, char* message) {
  for (size_t i = 0; i < kvs.count; ++i) {
    const sbx_kv kv = kvs.items[i];
    if (!valid_text(kv.key) || !valid_text(kv.value) || kv.key.len == 0 ||
        memchr(kv.key.data, '=', kv.key.len)) {
      return failf(message, SBX_STATUS_INVALID_ARGUMENT, "env has an invalid name or value");
    }
    char* entry = xrealloc(NULL, kv.key.len + kv.value.len + 2);
    sprintf(entry, "%.*s=%.*s", (int)kv.key.len, kv.key.data, (int)kv.value.len,
            kv.value.len ? kv.value.data : "");
    env_put(v, entry);
  }
  return SBX_STATUS_OK;
}

/* Starts argv[0] in a session of its own (so that killing its process group kills everything it
 * started), stdin from /dev/null, stdout and stderr to the given descriptors and no other file of
 * this process open, in `cwd` (NULL: ours). Returns the pid, or -1. */
static pid_t spawn(char* const argv[], char* const envp[], const char* cwd, int out, int err) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE); /* a host that ignores SIGPIPE must not pass that on */
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out, 1);
  posix_spawn_file_actions_adddup2(&actions, err, 2);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3); /* none of the host's open files */
  if (cwd) posix_spawn_file_actions_addchdir_np(&actions, cwd);
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, &attr, argv, envp) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return pid;
}

/* ---- The provider --------------------------------------------------------------------------- */

typedef struct worker {
  struct worker* next;
  pthread_t thread;
} worker;

typedef struct provider_state {
  sbx_provider c;        /* the table the host holds; c.provider_data points here */
  const sbx_host* host;  /* host-owned, valid until destroy returns */
  pthread_mutex_t mutex; /* guards the fields below */
  pthread_cond_t idle;   /* signalled when `running` drops */
  size_t running;        /* operation threads started and not finished */
  worker* finished;      /* finished threads, still to be joined */
} provider_state;

/* Logs through the host. log_enabled first: no formatting for a line nobody will see (the host
 * follows --log-level and SBX_LOG_LEVEL). */
static void logf_(const provider_state* p, int32_t level, const char* format, ...) {
  const sbx_host* h = p->host;
  if (!h->log || (h->log_enabled && !h->log_enabled(h, level))) return;
  char line[MESSAGE_MAX];
  va_list args;
  va_start(args, format);
  vsnprintf(line, sizeof line, format, args);
  va_end(args);
  h->log(h, level, str_of(line));
}

/* The host's monotonic clock (a host may control it in tests), in milliseconds. */
static int64_t now_ms(const provider_state* p) {
  if (p->host->now_ns) return p->host->now_ns(p->host) / 1000000;
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
  char* dir;             /* its host directory, also its id */
  char* workdir;         /* absolute sandbox path, "/" when the spec had none */
  env_list env;          /* the spec's env */
  int64_t expires_ms;    /* the TTL's expiry on now_ms()'s clock; INT64_MAX: no TTL */
  pthread_mutex_t mutex; /* guards the fields below */
  bool closed;
  pid_t watchdog; /* the TTL watchdog, or 0 */
  pid_t* groups;  /* process groups of running commands, killed by close */
  size_t group_count;
} sandbox_state;

static void sandbox_free(sandbox_state* s) {
  if (!s) return;
  free(s->dir);
  free(s->workdir);
  env_free(&s->env);
  free(s->groups);
  pthread_mutex_destroy(&s->mutex);
  free(s);
}

/* NULL while the sandbox exists; once it is gone, how it went (for messages: "sandbox X was
 * closed"): closed through this handle, its TTL passed, or its directory removed (by the TTL's
 * watchdog, or by anyone else). */
static const char* sandbox_gone(const provider_state* p, sandbox_state* s) {
  pthread_mutex_lock(&s->mutex);
  const bool closed = s->closed;
  pthread_mutex_unlock(&s->mutex);
  struct stat st;
  if (closed) return "was closed";
  if (now_ms(p) >= s->expires_ms) return "has expired";
  if (stat(s->dir, &st) != 0 || !S_ISDIR(st.st_mode)) return "was removed";
  return NULL;
}

/* Records a command's process group, for close to kill. Once the sandbox is closed it kills the
 * group at once instead (the exec then finds its sandbox gone). */
static void sandbox_track(sandbox_state* s, pid_t group) {
  pthread_mutex_lock(&s->mutex);
  const bool closed = s->closed;
  if (!closed) {
    s->groups = xrealloc(s->groups, (s->group_count + 1) * sizeof *s->groups);
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

/* Marks the sandbox closed, kills what runs in it (its execs then complete with NOT_FOUND) and
 * stops its TTL watchdog. The flag is set before the kill, so an exec whose output ends by it
 * already sees its sandbox gone. */
static void sandbox_mark_closed(sandbox_state* s) {
  pthread_mutex_lock(&s->mutex);
  s->closed = true;
  for (size_t i = 0; i < s->group_count; ++i)
    kill(-s->groups[i], SIGKILL);
  const pid_t watchdog = s->watchdog;
  s->watchdog = 0;
  pthread_mutex_unlock(&s->mutex);
  if (watchdog > 0) {
    kill(-watchdog, SIGKILL); /* its session's group: the shell and its sleep */
    waitpid(watchdog, NULL, 0);
  }
}

/* ---- Paths ---------------------------------------------------------------------------------- */

/* Turns a sandbox path into one relative to the sandbox's directory ("a/b"; "" is its root),
 * malloc'ed in *out. A relative `path` is relative to `base` (an absolute sandbox path). "." and
 * empty components are dropped and ".." goes up; going above the root is refused, and so is the
 * root itself when `file` is true. */
static sbx_status normalize(const char* base, sbx_str path, bool file, char** out, char* message) {
  if (!valid_text(path)) {
    return failf(message, SBX_STATUS_INVALID_ARGUMENT, "a sandbox path contains a NUL byte");
  }
  const int shown = (int)(path.len < 200 ? path.len : 200);
  const size_t base_len = path.len && path.data[0] == '/' ? 0 : strlen(base);
  char* joined = xrealloc(NULL, base_len + path.len + 2);
  sprintf(joined, "%.*s/%.*s", (int)base_len, base, (int)path.len, path.len ? path.data : "");
  char* rel = xrealloc(NULL, base_len + path.len + 2);
  size_t n = 0;
  bool escapes = false;
  for (const char* p = joined; *p && !escapes;) {
    const size_t len = strcspn(p, "/");
    if (len == 2 && p[0] == '.' && p[1] == '.') {
      escapes = n == 0;
      while (n > 0 && rel[n - 1] != '/') /* drop the last component */
        --n;
      if (n > 0) --n;
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
  char* path = xrealloc(NULL, strlen(dir) + strlen(rel) + 2);
  sprintf(path, "%s/%s", dir, rel);
  return path;
}

/* The host path of a sandbox path, inside the sandbox's directory. */
static sbx_status host_path(const sandbox_state* s, sbx_str path, bool file, char** out,
                            char* message) {
  char* rel;
  const sbx_status status = normalize(s->workdir, path, file, &rel, message);
  if (status != SBX_STATUS_OK) return status;
  *out = join_path(s->dir, rel);
  free(rel);
  return SBX_STATUS_OK;
}

/* mkdir -p of `path` below its first `from` bytes (the sandbox directory, which exists); with
 * `parent_only`, not its last component. Returns 0 or an errno. */
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
  (void)st, (void)type, (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* rm -rf without following links; a tree that is gone is success. Returns 0 or an errno. */
static int remove_tree(const char* dir) {
  if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 || errno == ENOENT) return 0;
  return errno;
}

/* ---- Operations ----------------------------------------------------------------------------- */

enum kind { KIND_CREATE, KIND_EXEC, KIND_DONE };

typedef struct startup_file {
  char* rel; /* relative to the sandbox directory */
  uint8_t* data;
  size_t len;
} startup_file;

typedef struct op op;
struct op {
  sbx_operation handle; /* given to the host; handle.plugin_data points here */
  atomic_int refs;      /* the host's (until release) and the thread's (until completion) */
  atomic_bool cancelled;
  int wake[2]; /* exec: cancel writes a byte to wake[1]; the exec's poll loop watches wake[0] */
  provider_state* provider;
  sandbox_state* sandbox;    /* the host's handle, BORROWED until on_complete */
  sbx_status (*run)(op* o);  /* the work, on the op's thread */
  char message[MESSAGE_MAX]; /* why it failed */
  /* The host's callbacks, copied from the start call's BORROWED struct. */
  enum kind kind;
  void* user_data;
  void(SBX_ABI* on_sandbox)(void*, sbx_sandbox*, const sbx_error*);
  void(SBX_ABI* on_output)(void*, int32_t, sbx_bytes);
  void(SBX_ABI* on_result)(void*, const sbx_exec_result*, const sbx_error*);
  void(SBX_ABI* on_done)(void*, const sbx_error*);
  /* create */
  sandbox_state* made; /* the new sandbox, until on_complete hands it to the host */
  startup_file* files;
  size_t file_count;
  int64_t ttl_ms; /* -1: none */
  /* exec */
  char* command;
  char* cwd; /* host path */
  env_list env;
  int64_t timeout_ms;
  int32_t return_code;
  const char* error_type; /* static text or NULL */
  buffer out, err;
  /* upload and download */
  char* path;                     /* host path */
  char* shown;                    /* the sandbox path as the host gave it, for messages */
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
  sandbox_free(o->made); /* set only when a create failed: nothing was handed to the host */
  free(o->command);
  free(o->cwd);
  env_free(&o->env);
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

/* sbx_operation.cancel: [thread-safe], idempotent, never blocks. The op's thread sees the flag
 * (an exec also the byte on its wake pipe, so it reacts at once, not at its next timeout). */
static void SBX_ABI op_cancel(sbx_operation* handle) {
  op* o = (op*)handle->plugin_data;
  if (atomic_exchange(&o->cancelled, true) || o->wake[1] < 0) return;
  const ssize_t ignored = write(o->wake[1], "x", 1); /* non-blocking pipe */
  (void)ignored;
}

/* sbx_operation.release: the host drops its reference (exactly once). */
static void SBX_ABI op_release(sbx_operation* handle) {
  op_unref((op*)handle->plugin_data);
}

static op* op_new(sbx_provider* p, sbx_sandbox* sandbox, enum kind kind, void* user_data,
                  sbx_status (*run)(op*)) {
  op* o = xrealloc(NULL, sizeof *o);
  memset(o, 0, sizeof *o);
  o->handle.struct_size = sizeof o->handle;
  o->handle.plugin_data = o;
  o->handle.cancel = op_cancel;
  o->handle.release = op_release;
  atomic_init(&o->refs, 1);
  atomic_init(&o->cancelled, false);
  o->wake[0] = o->wake[1] = -1;
  o->provider = (provider_state*)p->provider_data;
  o->sandbox = sandbox ? (sandbox_state*)sandbox->sandbox_data : NULL;
  o->kind = kind;
  o->user_data = user_data;
  o->run = run;
  return o;
}

/* The one call of on_complete. No lock of ours is held: the host may start new operations, or
 * release the sandbox, from inside it. */
static void complete(op* o, sbx_status status) {
  const sbx_error e = error_of(status, o->message);
  const sbx_error* error = status == SBX_STATUS_OK ? NULL : &e;
  if (o->kind == KIND_CREATE) {
    sandbox_state* s = error ? NULL : o->made;
    if (s) o->made = NULL; /* the host owns it from here on */
    o->on_sandbox(o->user_data, s ? &s->c : NULL, error);
  } else if (o->kind == KIND_EXEC) {
    sbx_exec_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.return_code = o->return_code;
    r.error_type = o->error_type ? str_of(o->error_type) : sbx_str_unset();
    r.stdout_bytes.data = o->out.data;
    r.stdout_bytes.len = o->out.len;
    r.stderr_bytes.data = o->err.data;
    r.stderr_bytes.len = o->err.len;
    o->on_result(o->user_data, error ? NULL : &r, error);
  } else {
    o->on_done(o->user_data, error);
  }
}

/* Every operation thread: runs the work, completes exactly once, then queues itself to be
 * joined. After on_complete it touches neither the op's arguments nor its sandbox. */
static void* worker_main(void* arg) {
  op* o = (op*)arg;
  provider_state* p = o->provider;
  worker* w = xrealloc(NULL, sizeof *w);
  w->thread = pthread_self();
  complete(o, o->run(o));
  op_unref(o); /* the op may be gone now; the provider is not (destroy waits for `running`) */
  pthread_mutex_lock(&p->mutex);
  w->next = p->finished;
  p->finished = w;
  p->running--;
  pthread_cond_broadcast(&p->idle);
  pthread_mutex_unlock(&p->mutex);
  return NULL;
}

/* Runs a prepared operation on a thread of its own and returns its handle; or, when `status`
 * (the preparation's) is a failure, completes it on the calling thread and returns NULL (an
 * operation that has completed cannot be cancelled). */
static sbx_operation* launch(op* o, sbx_status status) {
  provider_state* p = o->provider;
  if (status == SBX_STATUS_OK) {
    atomic_store(&o->refs, 2); /* the thread's and the host's */
    pthread_mutex_lock(&p->mutex);
    worker* finished = p->finished;
    p->finished = NULL;
    p->running++;
    pthread_mutex_unlock(&p->mutex);
    join_workers(finished); /* they are past their last lock: joining takes no time */
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker_main, o) == 0) return &o->handle;
    pthread_mutex_lock(&p->mutex);
    p->running--;
    pthread_cond_broadcast(&p->idle);
    pthread_mutex_unlock(&p->mutex);
    status = failf(o->message, SBX_STATUS_RESOURCE_EXHAUSTED, "cannot start a thread");
  }
  complete(o, status);
  op_free(o);
  return NULL;
}

/* What every operation on a sandbox checks first. */
static sbx_status require_sandbox(op* o) {
  if (!o->sandbox) return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "no sandbox given");
  const char* gone = sandbox_gone(o->provider, o->sandbox);
  if (gone) return failf(o->message, SBX_STATUS_NOT_FOUND, "sandbox %s %s", o->sandbox->dir, gone);
  return SBX_STATUS_OK;
}

/* ---- create --------------------------------------------------------------------------------- */

/* On the calling thread: copies from the BORROWED spec what the sandbox needs. */
static sbx_status prepare_create(op* o, const sbx_spec* spec) {
  if (!spec || !SBX_HAS_FIELD(spec, sbx_spec, labels)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the spec is too small");
  }
  if (!empty_object(spec->provider_options)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT,
                 "provider_options: " C_PROVIDER_ID " takes no options");
  }
  sandbox_state* s = o->made = xrealloc(NULL, sizeof *s);
  memset(s, 0, sizeof *s);
  s->c.struct_size = sizeof s->c;
  s->c.sandbox_data = s;
  s->expires_ms = INT64_MAX; /* run_create sets it when there is a TTL */
  pthread_mutex_init(&s->mutex, NULL);
  if (spec->workdir.len && spec->workdir.data[0] != '/') {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "workdir must be an absolute path");
  }
  char* rel;
  sbx_status status = normalize("/", spec->workdir, false, &rel, o->message);
  if (status != SBX_STATUS_OK) return status;
  s->workdir = join_path("", rel); /* "/" + rel */
  free(rel);
  status = env_put_all(&s->env, spec->env, o->message);
  if (status != SBX_STATUS_OK) return status;
  o->ttl_ms = spec->ttl_ms.set ? spec->ttl_ms.value : -1;
  o->files = xrealloc(NULL, (spec->files.count + 1) * sizeof *o->files);
  for (size_t i = 0; i < spec->files.count; ++i) {
    const sbx_file* f = &spec->files.items[i];
    startup_file* copy = &o->files[o->file_count];
    status = normalize(s->workdir, f->path, true, &copy->rel, o->message);
    if (status != SBX_STATUS_OK) return status;
    o->file_count++;
    copy->len = f->contents.len;
    copy->data = xrealloc(NULL, f->contents.len);
    if (f->contents.len) memcpy(copy->data, f->contents.data, f->contents.len);
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

/* The TTL: a watchdog in a session of its own removes the directory at expiry, also when the
 * host process has gone; close kills it first. The sandbox counts as gone from `expires_ms` on
 * (the watchdog rounds up to whole seconds), so a running exec ends at the expiry itself. */
static int start_watchdog(const provider_state* p, sandbox_state* s, int64_t ttl_ms) {
  const int64_t now = now_ms(p);
  s->expires_ms = ttl_ms < INT64_MAX - now ? now + ttl_ms : INT64_MAX;
  char seconds[32];
  snprintf(seconds, sizeof seconds, "%lld", (long long)((ttl_ms + 999) / 1000));
  char* argv[] = {
      "/bin/sh", "-c", "sleep \"$1\" && rm -rf -- \"$2\"", C_PROVIDER_ID "-ttl", seconds,
      s->dir,    NULL};
  char* envp[] = {"PATH=/usr/bin:/bin", NULL};
  const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (devnull < 0) return errno;
  s->watchdog = spawn(argv, envp, NULL, devnull, devnull);
  close(devnull);
  return s->watchdog > 0 ? 0 : EAGAIN;
}

/* On the op's thread: makes the directory, the workdir, the startup files and the watchdog. A
 * create that fails or is cancelled removes what it made. */
static sbx_status run_create(op* o) {
  sandbox_state* s = o->made;
  const char* tmp = getenv("TMPDIR");
  s->dir = join_path(tmp && *tmp ? tmp : "/tmp", C_PROVIDER_ID "-XXXXXX");
  if (!mkdtemp(s->dir)) {
    return failf(o->message, SBX_STATUS_CREATE_FAILED, "cannot create %s: %s", s->dir,
                 strerror(errno));
  }
  /* The id is the directory's name: unique, stable, and safe in a URL (sbx serve routes by it). */
  s->c.id = str_of(strrchr(s->dir, '/') + 1);
  char* workdir = join_path(s->dir, s->workdir + 1);
  int error = make_dirs(workdir, strlen(s->dir), false);
  free(workdir);
  sbx_status status = SBX_STATUS_OK;
  if (error) {
    status = failf(o->message, SBX_STATUS_CREATE_FAILED, "cannot create the workdir %s: %s",
                   s->workdir, strerror(error));
  }
  for (size_t i = 0; i < o->file_count && status == SBX_STATUS_OK; ++i) {
    if (atomic_load(&o->cancelled)) {
      status = failf(o->message, SBX_STATUS_CANCELLED, "create cancelled");
    } else if ((error = write_startup_file(s, &o->files[i])) != 0) {
      status = failf(o->message, SBX_STATUS_CREATE_FAILED, "cannot write /%s: %s", o->files[i].rel,
                     strerror(error));
    }
  }
  if (status == SBX_STATUS_OK && o->ttl_ms >= 0 &&
      (error = start_watchdog(o->provider, s, o->ttl_ms)) != 0) {
    status = failf(o->message, SBX_STATUS_CREATE_FAILED, "cannot start the TTL watchdog: %s",
                   strerror(error));
  }
  if (status != SBX_STATUS_OK) {
    remove_tree(s->dir);
  } else {
    logf_(o->provider, SBX_LOG_INFO, "created sandbox %s", s->dir);
  }
  return status;
}

/* ---- exec ----------------------------------------------------------------------------------- */

static sbx_status prepare_exec(op* o, const sbx_exec_request* req) {
  if (!req || !SBX_HAS_FIELD(req, sbx_exec_request, user)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the exec request is too small");
  }
  sbx_status status = require_sandbox(o);
  if (status != SBX_STATUS_OK) return status;
  if (sbx_str_is_set(req->user)) { /* declared: not offered */
    return failf(o->message, SBX_STATUS_UNIMPLEMENTED,
                 C_PROVIDER_ID
                 " runs commands as the host's user only; exec's user is not offered");
  }
  if (!valid_text(req->command)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the command contains a NUL byte");
  }
  const sandbox_state* s = o->sandbox;
  status = host_path(s, sbx_str_is_set(req->cwd) ? req->cwd : str_of(s->workdir), false, &o->cwd,
                     o->message);
  if (status != SBX_STATUS_OK) return status;
  o->command = copy_text(req->command.data, req->command.len);
  /* A small base environment, then the spec's, then the exec's: the later wins. */
  env_put(&o->env, copy_text("PATH=/usr/local/bin:/usr/bin:/bin", 33));
  char* home = xrealloc(NULL, strlen(s->dir) + 6);
  sprintf(home, "HOME=%s", s->dir);
  env_put(&o->env, home);
  for (size_t i = 0; i < s->env.count; ++i)
    env_put(&o->env, copy_text(s->env.items[i], strlen(s->env.items[i])));
  status = env_put_all(&o->env, req->env, o->message);
  if (status != SBX_STATUS_OK) return status;
  o->timeout_ms = req->timeout_ms.set ? req->timeout_ms.value : DEFAULT_TIMEOUT_MS;
  if (o->timeout_ms < 0) o->timeout_ms = 0;
  if (o->timeout_ms > MAX_TIMEOUT_MS) o->timeout_ms = MAX_TIMEOUT_MS;
  if (pipe2(o->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    return failf(o->message, SBX_STATUS_RESOURCE_EXHAUSTED, "pipe: %s", strerror(errno));
  }
  return SBX_STATUS_OK;
}

/* Output goes to the host as it arrives when it asked for a stream (on_output), one call at a
 * time and all before on_complete; otherwise it is kept for the result. */
static void deliver(op* o, int32_t stream, const uint8_t* data, size_t len) {
  if (o->on_output) {
    const sbx_bytes chunk = {data, len};
    o->on_output(o->user_data, stream, chunk);
  } else {
    buffer_append(stream == SBX_STREAM_STDOUT ? &o->out : &o->err, data, len);
  }
}

enum stop { RAN, TIMED_OUT, CANCELLED, GONE };

/* Moves output until both pipes end, the timeout passes, a cancel arrives or the sandbox goes
 * (GONE, with the message set). The caller then kills the command's process group, so a command
 * that closed its output and went on is ended too. The sandbox is checked on every turn and after
 * the output ends: close kills the command, and its output ending is then the sandbox going, not
 * the command's result. The poll wakes at least every GONE_POLL_MS for it: a TTL passing or a
 * removed directory makes no event on the pipes. */
static enum stop pump(op* o, int pipes[2]) {
  const int64_t deadline = now_ms(o->provider) + o->timeout_ms;
  uint8_t chunk[CHUNK];
  for (;;) {
    if (atomic_load(&o->cancelled)) return CANCELLED;
    const char* gone = sandbox_gone(o->provider, o->sandbox);
    if (gone) {
      failf(o->message, SBX_STATUS_NOT_FOUND, "sandbox %s %s while the command ran",
            o->sandbox->dir, gone);
      return GONE;
    }
    if (pipes[0] < 0 && pipes[1] < 0) return RAN;
    const int64_t left = deadline - now_ms(o->provider);
    if (left <= 0) return TIMED_OUT;
    struct pollfd fds[3] = {{pipes[0], POLLIN, 0}, {pipes[1], POLLIN, 0}, {o->wake[0], POLLIN, 0}};
    if (poll(fds, 3, (int)(left < GONE_POLL_MS ? left : GONE_POLL_MS)) < 0) continue; /* EINTR */
    for (int i = 0; i < 2; ++i) {
      if (pipes[i] < 0 || !fds[i].revents) continue;
      const ssize_t n = read(pipes[i], chunk, sizeof chunk);
      if (n > 0) {
        deliver(o, i == 0 ? SBX_STREAM_STDOUT : SBX_STREAM_STDERR, chunk, (size_t)n);
      } else if (n == 0 || errno != EINTR) {
        close(pipes[i]);
        pipes[i] = -1;
      }
    }
  }
}

/* The exec's outcomes (docs/abi/errors.md): a command that ran is a result with its exit status
 * (a non-zero one too); a timeout is 125/"timeout" with the output so far; a command the sandbox
 * could not start (e.g. a cwd that does not exist) is 125/"sandbox"; a cancel is CANCELLED; a
 * sandbox that went while the command ran (closed, expired, removed) is NOT_FOUND, no result
 * (docs/sandbox-semantics.md, "Closed and gone sandboxes"). */
static sbx_status run_exec(op* o) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  pid_t pid = -1;
  struct stat st;
  if (stat(o->cwd, &st) == 0 && S_ISDIR(st.st_mode) && pipe2(out, O_CLOEXEC) == 0 &&
      pipe2(err, O_CLOEXEC) == 0) {
    char* argv[] = {"/bin/sh", "-c", o->command, NULL};
    pid = spawn(argv, o->env.items, o->cwd, out[1], err[1]);
  }
  if (out[1] >= 0) close(out[1]); /* the command has its copies */
  if (err[1] >= 0) close(err[1]);
  int pipes[2] = {out[0], err[0]};
  enum stop why = RAN;
  int status = 0;
  if (pid > 0) {
    sandbox_track(o->sandbox, pid);
    why = pump(o, pipes);
    kill(-pid, SIGKILL); /* nothing the command started outlives the exec */
    /* Before the reaping: then the group's id may be another process's. */
    sandbox_untrack(o->sandbox, pid);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (pipes[0] >= 0) close(pipes[0]);
  if (pipes[1] >= 0) close(pipes[1]);
  if (why == CANCELLED) return failf(o->message, SBX_STATUS_CANCELLED, "exec cancelled");
  if (why == GONE) return SBX_STATUS_NOT_FOUND; /* pump wrote the message */
  if (pid <= 0 || why == TIMED_OUT) {
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
  if (!req || !SBX_HAS_FIELD(req, sbx_upload_request, mode) || !req->source || !req->source->read ||
      req->source->size < 0) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the upload request is unusable");
  }
  o->source = req->source; /* host-owned until on_complete */
  o->mode = req->mode ? (req->mode & 07777) : 0644;
  return prepare_transfer(o, req->remote_path);
}

/* Writes a temporary file next to the target, with the requested mode, and renames it into
 * place: a failed or cancelled upload leaves nothing behind. */
static sbx_status run_upload(op* o) {
  int error = make_dirs(o->path, strlen(o->sandbox->dir), true);
  if (error) {
    return failf(o->message, SBX_STATUS_INTERNAL, "cannot create the parents of %s: %s", o->shown,
                 strerror(error));
  }
  char* temp = xrealloc(NULL, strlen(o->path) + 32);
  sprintf(temp, "%s.upload-XXXXXX", o->path);
  const int fd = mkostemp(temp, O_CLOEXEC);
  sbx_status status = SBX_STATUS_OK;
  if (fd < 0) {
    status =
        failf(o->message, SBX_STATUS_INTERNAL, "cannot write %s: %s", o->shown, strerror(errno));
  }
  uint8_t chunk[CHUNK];
  for (int64_t total = 0; fd >= 0 && total < o->source->size && status == SBX_STATUS_OK;) {
    const int64_t left = o->source->size - total;
    const size_t want = left < CHUNK ? (size_t)left : CHUNK;
    const int64_t n = o->source->read(o->source->ctx, chunk, want);
    if (atomic_load(&o->cancelled)) {
      status = failf(o->message, SBX_STATUS_CANCELLED, "upload cancelled");
    } else if (n <= 0 || (uint64_t)n > want) {
      status = failf(o->message, SBX_STATUS_INTERNAL, "the upload's source failed after %lld bytes",
                     (long long)total);
    } else if (!write_all(fd, chunk, (size_t)n)) {
      status = failf(o->message, SBX_STATUS_INTERNAL, "writing %s: %s", o->shown, strerror(errno));
    }
    total += n;
  }
  if (fd >= 0) {
    if (status == SBX_STATUS_OK && fchmod(fd, (mode_t)o->mode) != 0) { /* not the umask's mode */
      status = failf(o->message, SBX_STATUS_INTERNAL, "chmod %s: %s", o->shown, strerror(errno));
    }
    if (close(fd) != 0 && status == SBX_STATUS_OK) {
      status = failf(o->message, SBX_STATUS_INTERNAL, "writing %s: %s", o->shown, strerror(errno));
    }
    if (status == SBX_STATUS_OK && rename(temp, o->path) != 0) {
      status =
          failf(o->message, errno == EISDIR ? SBX_STATUS_INVALID_ARGUMENT : SBX_STATUS_INTERNAL,
                "cannot write %s: %s", o->shown, strerror(errno));
    }
    if (status != SBX_STATUS_OK) unlink(temp);
  }
  free(temp);
  return status;
}

static sbx_status prepare_download(op* o, const sbx_download_request* req) {
  if (!req || !SBX_HAS_FIELD(req, sbx_download_request, sink) || !req->sink || !req->sink->write) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "the download request is unusable");
  }
  o->sink = req->sink; /* host-owned until on_complete */
  return prepare_transfer(o, req->remote_path);
}

/* Writes exactly one regular file to the sink. A directory or a symbolic link is refused with a
 * message naming it (the host discards what the sink received). */
static sbx_status run_download(op* o) {
  struct stat st;
  if (lstat(o->path, &st) != 0) {
    return failf(o->message,
                 errno == ENOENT || errno == ENOTDIR ? SBX_STATUS_NOT_FOUND : SBX_STATUS_INTERNAL,
                 "no such file in the sandbox: %s", o->shown);
  }
  if (!S_ISREG(st.st_mode)) {
    return failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "%s is not a regular file (%s)", o->shown,
                 S_ISDIR(st.st_mode)   ? "a directory"
                 : S_ISLNK(st.st_mode) ? "a symbolic link"
                                       : "a special file");
  }
  const int fd = open(o->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return failf(o->message, SBX_STATUS_INTERNAL, "open %s: %s", o->shown, strerror(errno));
  sbx_status status = SBX_STATUS_OK;
  uint8_t chunk[CHUNK];
  for (ssize_t n; status == SBX_STATUS_OK && (n = read(fd, chunk, sizeof chunk)) != 0;) {
    const sbx_bytes data = {chunk, n > 0 ? (size_t)n : 0};
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = failf(o->message, SBX_STATUS_INTERNAL, "read %s: %s", o->shown, strerror(errno));
    } else if (atomic_load(&o->cancelled)) {
      status = failf(o->message, SBX_STATUS_CANCELLED, "download cancelled");
    } else if (o->sink->write(o->sink->ctx, data) != 0) {
      status = failf(o->message, SBX_STATUS_CANCELLED, "the host aborted the download");
    }
  }
  close(fd);
  return status;
}

/* ---- close ---------------------------------------------------------------------------------- */

static sbx_status run_close(op* o) {
  const int error = remove_tree(o->sandbox->dir);
  if (!error) return SBX_STATUS_OK;
  return failf(o->message, SBX_STATUS_INTERNAL, "removing %s: %s", o->sandbox->dir,
               strerror(error));
}

/* ---- The provider table --------------------------------------------------------------------- */

/* Callbacks that cannot be reported to start nothing: the start function returns NULL. */
#define USABLE(cb, type) ((cb) && SBX_HAS_FIELD(cb, type, on_complete) && (cb)->on_complete)

static sbx_operation* SBX_ABI provider_create(sbx_provider* p, const sbx_spec* spec,
                                              const sbx_create_callbacks* cb) {
  if (!USABLE(cb, sbx_create_callbacks)) return NULL;
  op* o = op_new(p, NULL, KIND_CREATE, cb->user_data, run_create);
  o->on_sandbox = cb->on_complete;
  return launch(o, prepare_create(o, spec));
}

static sbx_operation* SBX_ABI provider_exec(sbx_provider* p, sbx_sandbox* sandbox,
                                            const sbx_exec_request* req,
                                            const sbx_exec_callbacks* cb) {
  if (!USABLE(cb, sbx_exec_callbacks)) return NULL;
  op* o = op_new(p, sandbox, KIND_EXEC, cb->user_data, run_exec);
  o->on_output = cb->on_output; /* may be NULL: then the output goes into the result */
  o->on_result = cb->on_complete;
  return launch(o, prepare_exec(o, req));
}

static sbx_operation* SBX_ABI provider_upload(sbx_provider* p, sbx_sandbox* sandbox,
                                              const sbx_upload_request* req,
                                              const sbx_done_callbacks* cb) {
  if (!USABLE(cb, sbx_done_callbacks)) return NULL;
  op* o = op_new(p, sandbox, KIND_DONE, cb->user_data, run_upload);
  o->on_done = cb->on_complete;
  return launch(o, prepare_upload(o, req));
}

static sbx_operation* SBX_ABI provider_download(sbx_provider* p, sbx_sandbox* sandbox,
                                                const sbx_download_request* req,
                                                const sbx_done_callbacks* cb) {
  if (!USABLE(cb, sbx_done_callbacks)) return NULL;
  op* o = op_new(p, sandbox, KIND_DONE, cb->user_data, run_download);
  o->on_done = cb->on_complete;
  return launch(o, prepare_download(o, req));
}

/* Quick enough to answer inline (and return NULL: nothing left to cancel). A sandbox that is gone
 * is STOPPED. */
static sbx_operation* SBX_ABI provider_status(sbx_provider* p, sbx_sandbox* sandbox,
                                              const sbx_status_callbacks* cb) {
  if (!USABLE(cb, sbx_status_callbacks)) return NULL;
  if (!sandbox) {
    const sbx_error e = error_of(SBX_STATUS_INVALID_ARGUMENT, "no sandbox given");
    cb->on_complete(cb->user_data, SBX_SANDBOX_UNKNOWN, &e);
    return NULL;
  }
  const bool gone = sandbox_gone((const provider_state*)p->provider_data,
                                 (sandbox_state*)sandbox->sandbox_data) != NULL;
  cb->on_complete(cb->user_data, gone ? SBX_SANDBOX_STOPPED : SBX_SANDBOX_RUNNING, NULL);
  return NULL;
}

/* Marks the sandbox closed and kills what runs in it at once (the execs under way complete with
 * NOT_FOUND); the op's thread removes the directory. Closing a sandbox that is gone, or closing
 * twice, is success. */
static sbx_operation* SBX_ABI provider_close(sbx_provider* p, sbx_sandbox* sandbox,
                                             const sbx_done_callbacks* cb) {
  if (!USABLE(cb, sbx_done_callbacks)) return NULL;
  op* o = op_new(p, sandbox, KIND_DONE, cb->user_data, run_close);
  o->on_done = cb->on_complete;
  if (!o->sandbox) {
    return launch(o, failf(o->message, SBX_STATUS_INVALID_ARGUMENT, "no sandbox given"));
  }
  sandbox_mark_closed(o->sandbox);
  return launch(o, SBX_STATUS_OK);
}

/* Frees the handle (no operation on it is pending); the sandbox itself stays. */
static void SBX_ABI provider_release_sandbox(sbx_provider* p, sbx_sandbox* sandbox) {
  (void)p;
  if (sandbox) sandbox_free((sandbox_state*)sandbox->sandbox_data);
}

/* No extension is offered: a NULL table says so, and the host reports them "not offered". */
static const void* SBX_ABI provider_get_extension(const sbx_provider* p, const char* id) {
  (void)p, (void)id;
  return NULL;
}

/* Called once every operation has completed and every sandbox has been released: waits for the
 * threads still returning from their last completion, and joins them all. */
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
  free(p);
}

/* ---- Factory and plugin descriptor ---------------------------------------------------------- */

static sbx_status report(const sbx_error_sink* errors, sbx_status status, const char* message) {
  if (errors && errors->report) {
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
    return report(errors, SBX_STATUS_INVALID_ARGUMENT, "the sbx_host is too small");
  }
  if (!empty_object(config_json)) {
    return report(errors, SBX_STATUS_INVALID_ARGUMENT, "$: " C_PROVIDER_ID " takes no settings");
  }
  provider_state* p = xrealloc(NULL, sizeof *p);
  memset(p, 0, sizeof *p);
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

/* Nothing plugin-wide to set up; a host of another ABI major is refused (the host checks too). */
static sbx_status SBX_ABI plugin_init(const sbx_host* host, const sbx_error_sink* errors) {
  if (!host) return report(errors, SBX_STATUS_INVALID_ARGUMENT, "no sbx_host");
  if (!sbx_version_is_compatible(host->abi_version)) {
    char message[MESSAGE_MAX];
    snprintf(message, sizeof message,
             C_PROVIDER_ID " speaks sbx ABI %u.%u and the host %u.%u: the major versions differ",
             (unsigned)SBX_ABI_VERSION_MAJOR, (unsigned)SBX_ABI_VERSION_MINOR,
             (unsigned)host->abi_version.major, (unsigned)host->abi_version.minor);
    return report(errors, SBX_STATUS_FAILED_PRECONDITION, message);
  }
  return SBX_STATUS_OK;
}

static void SBX_ABI plugin_deinit(void) {}

static const sbx_provider_factory factory = {
    sizeof(sbx_provider_factory), C_PROVIDER_ID,
    "Example in plain C: a temp directory per sandbox, commands as host processes",
    "{\"type\": \"object\", \"additionalProperties\": false}", factory_create};
static const sbx_provider_factory* const factories[] = {&factory};

/* The one exported symbol. The descriptor is static data, readable before init. */
SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {
  static const sbx_plugin plugin = {sizeof(sbx_plugin),
                                    SBX_ABI_VERSION_INIT,
                                    C_PROVIDER_ID,
                                    "1.0.0",
                                    "An example plugin in plain C",
                                    plugin_init,
                                    plugin_deinit,
                                    1,
                                    factories};
  return &plugin;
}
