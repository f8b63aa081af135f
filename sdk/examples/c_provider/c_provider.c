/* PLACEHOLDER for the plain-C provider example (replaced by the real one at merge): just enough of
 * a provider, on the C headers alone, for the packaging tests to build, load and run a command.
 * Sandboxes are temporary directories on the host and commands run there with /bin/sh (no
 * isolation). Every operation completes before its start function returns (and so returns NULL:
 * nothing left to cancel). Left out: exec's timeout, env, cwd and user; streaming order of stderr
 * (merged into stdout); the config is not checked. */
#define _GNU_SOURCE
#include <sbx/abi.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static sbx_str str_of(const char* text) {
  sbx_str s = {text, strlen(text)};
  return s;
}

static sbx_error error_of(sbx_status status, const char* message) {
  sbx_error e;
  memset(&e, 0, sizeof e);
  e.struct_size = sizeof e;
  e.status = status;
  e.message = str_of(message);
  return e;
}

/* `path` (sized, not NUL-terminated) inside the sandbox directory, or NULL for a path with "..". */
static char* inside(const sbx_sandbox* box, sbx_str path) {
  char* relative = strndup(path.data ? path.data : "", path.len);
  char* out = NULL;
  if (relative && strstr(relative, "..") == NULL) {
    const char* rest = relative;
    while (*rest == '/')
      ++rest;
    if (asprintf(&out, "%s/%s", (const char*)box->sandbox_data, rest) < 0) out = NULL;
  }
  free(relative);
  return out;
}

static int make_parents(char* path) {
  for (char* p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
    *p = '\0';
    const int rc = mkdir(path, 0755);
    *p = '/';
    if (rc != 0 && errno != EEXIST) return -1;
  }
  return 0;
}

static int remove_one(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static sbx_operation* SBX_ABI create(sbx_provider* provider, const sbx_spec* spec,
                                     const sbx_create_callbacks* cb) {
  (void)provider;
  if (!cb || !cb->on_complete) return NULL;
  char* dir = strdup("/tmp/c_provider-XXXXXX");
  if (!dir || !mkdtemp(dir)) {
    free(dir);
    sbx_error e = error_of(SBX_STATUS_CREATE_FAILED, "mkdtemp failed");
    cb->on_complete(cb->user_data, NULL, &e);
    return NULL;
  }
  sbx_sandbox* box = calloc(1, sizeof *box);
  box->struct_size = sizeof *box;
  box->id = str_of(dir);
  box->sandbox_data = dir;
  for (size_t i = 0; i < spec->files.count; ++i) {
    char* target = inside(box, spec->files.items[i].path);
    FILE* f = target && make_parents(target) == 0 ? fopen(target, "wb") : NULL;
    const sbx_bytes bytes = spec->files.items[i].contents;
    const int ok = f && fwrite(bytes.data, 1, bytes.len, f) == bytes.len;
    if (f) fclose(f);
    free(target);
    if (!ok) {
      sbx_error e = error_of(SBX_STATUS_CREATE_FAILED, "cannot write a startup file");
      nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
      free(dir);
      free(box);
      cb->on_complete(cb->user_data, NULL, &e);
      return NULL;
    }
  }
  cb->on_complete(cb->user_data, box, NULL);
  return NULL;
}

static sbx_operation* SBX_ABI exec(sbx_provider* provider, sbx_sandbox* box,
                                   const sbx_exec_request* req, const sbx_exec_callbacks* cb) {
  (void)provider;
  if (!cb || !cb->on_complete) return NULL;
  char* cmd = NULL;
  if (asprintf(&cmd, "cd '%s' && (%.*s) 2>&1", (const char*)box->sandbox_data,
               (int)req->command.len, req->command.data) < 0) {
    sbx_error e = error_of(SBX_STATUS_INTERNAL, "out of memory");
    cb->on_complete(cb->user_data, NULL, &e);
    return NULL;
  }
  FILE* pipe = popen(cmd, "r");
  free(cmd);
  sbx_exec_result result;
  memset(&result, 0, sizeof result);
  result.struct_size = sizeof result;
  if (!pipe) {
    result.return_code = SBX_EXEC_RETURN_CODE_NO_PROCESS;
    result.error_type = str_of(SBX_EXEC_ERROR_SANDBOX);
    cb->on_complete(cb->user_data, &result, NULL);
    return NULL;
  }
  uint8_t* all = NULL;
  size_t size = 0;
  uint8_t buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) {
    if (cb->on_output) {
      sbx_bytes chunk = {buffer, n};
      cb->on_output(cb->user_data, SBX_STREAM_STDOUT, chunk);
    } else {
      all = realloc(all, size + n);
      memcpy(all + size, buffer, n);
      size += n;
    }
  }
  const int status = pclose(pipe);
  result.return_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.stdout_bytes.data = all;
  result.stdout_bytes.len = size;
  cb->on_complete(cb->user_data, &result, NULL);
  free(all);
  return NULL;
}

static sbx_operation* SBX_ABI upload(sbx_provider* provider, sbx_sandbox* box,
                                     const sbx_upload_request* req, const sbx_done_callbacks* cb) {
  (void)provider;
  if (!cb || !cb->on_complete) return NULL;
  char* target = inside(box, req->remote_path);
  int fd =
      target && make_parents(target) == 0
          ? open(target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, req->mode ? req->mode : 0644)
          : -1;
  free(target);
  int ok = fd >= 0;
  uint8_t buffer[4096];
  for (int64_t n; ok && (n = req->source->read(req->source->ctx, buffer, sizeof buffer)) != 0;)
    ok = n > 0 && write(fd, buffer, (size_t)n) == n;
  if (fd >= 0) close(fd);
  sbx_error e = error_of(SBX_STATUS_INTERNAL, "upload failed");
  cb->on_complete(cb->user_data, ok ? NULL : &e);
  return NULL;
}

static sbx_operation* SBX_ABI download(sbx_provider* provider, sbx_sandbox* box,
                                       const sbx_download_request* req,
                                       const sbx_done_callbacks* cb) {
  (void)provider;
  if (!cb || !cb->on_complete) return NULL;
  char* source = inside(box, req->remote_path);
  struct stat st;
  FILE* f = source && lstat(source, &st) == 0 && S_ISREG(st.st_mode) ? fopen(source, "rb") : NULL;
  free(source);
  if (!f) {
    sbx_error e = error_of(SBX_STATUS_NOT_FOUND, "no such regular file");
    cb->on_complete(cb->user_data, &e);
    return NULL;
  }
  int ok = 1;
  uint8_t buffer[4096];
  for (size_t n; ok && (n = fread(buffer, 1, sizeof buffer, f)) > 0;) {
    sbx_bytes chunk = {buffer, n};
    ok = req->sink->write(req->sink->ctx, chunk) == 0;
  }
  fclose(f);
  sbx_error e = error_of(SBX_STATUS_CANCELLED, "the host stopped the download");
  cb->on_complete(cb->user_data, ok ? NULL : &e);
  return NULL;
}

static sbx_operation* SBX_ABI status(sbx_provider* provider, sbx_sandbox* box,
                                     const sbx_status_callbacks* cb) {
  (void)provider;
  if (!cb || !cb->on_complete) return NULL;
  struct stat st;
  const int there = stat((const char*)box->sandbox_data, &st) == 0;
  cb->on_complete(cb->user_data, there ? SBX_SANDBOX_RUNNING : SBX_SANDBOX_STOPPED, NULL);
  return NULL;
}

static sbx_operation* SBX_ABI close_sandbox(sbx_provider* provider, sbx_sandbox* box,
                                            const sbx_done_callbacks* cb) {
  (void)provider;
  if (!cb || !cb->on_complete) return NULL;
  nftw((const char*)box->sandbox_data, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  cb->on_complete(cb->user_data, NULL);
  return NULL;
}

static void SBX_ABI release_sandbox(sbx_provider* provider, sbx_sandbox* box) {
  (void)provider;
  free(box->sandbox_data);
  free(box);
}

static const void* SBX_ABI get_extension(const sbx_provider* provider, const char* id) {
  (void)provider, (void)id;
  return NULL;
}

static void SBX_ABI destroy(sbx_provider* provider) {
  free(provider);
}

static sbx_status SBX_ABI make_provider(const sbx_provider_factory* factory, const sbx_host* host,
                                        sbx_str config, sbx_provider** out,
                                        const sbx_error_sink* errors) {
  (void)factory, (void)host, (void)config, (void)errors;
  sbx_provider* p = calloc(1, sizeof *p);
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

static sbx_status SBX_ABI init(const sbx_host* host, const sbx_error_sink* errors) {
  (void)host, (void)errors;
  return SBX_STATUS_OK;
}

static void SBX_ABI deinit(void) {}

static const sbx_provider_factory factory = {sizeof(sbx_provider_factory), "c_provider",
                                             "Placeholder: a temp directory per sandbox, in C",
                                             "{\"type\": \"object\"}", make_provider};
static const sbx_provider_factory* const factories[] = {&factory};
static const sbx_plugin plugin = {sizeof(sbx_plugin),
                                  SBX_ABI_VERSION_INIT,
                                  "c_provider",
                                  "0.0.1",
                                  "Placeholder plain-C example",
                                  init,
                                  deinit,
                                  1,
                                  factories};

SBX_EXPORT const sbx_plugin* SBX_ABI sbx_plugin_entry(void) {
  return &plugin;
}
