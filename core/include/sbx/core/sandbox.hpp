// sbx::Sandbox: one sandbox, RAII. Every call has a synchronous form and an asynchronous *_async
// form returning an Operation. Destroying a Sandbox that was not closed or detached closes it
// (unless Host::move_to_current moved the sandbox to another handle).
// An empty Sandbox (default-constructed, moved from, or detached) raises FailedPreconditionError
// "Sandbox has not been started" from every call but status() (UNKNOWN, as in NeMo Gym), close()
// and detach() (which do nothing).
//
// THREADING: a Sandbox may be used from several threads at once (e.g. concurrent execs).
#pragma once

#include <sbx/core/operation.hpp>
#include <sbx/core/spec.hpp>
#include <sbx/core/terminal.hpp>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

namespace sbx {

namespace detail {
struct SandboxState;
}

class Host;
class Sandbox;
namespace plugin_checks {
void close_behind_host(Sandbox& box);  // sbx/core/plugin_checks.hpp
class FailingUpload;
}  // namespace plugin_checks

class Sandbox {
 public:
  Sandbox() = default;
  explicit Sandbox(std::shared_ptr<detail::SandboxState> state);
  Sandbox(Sandbox&&) noexcept = default;
  Sandbox& operator=(Sandbox&& other) noexcept;
  ~Sandbox();

  bool valid() const noexcept { return state_ != nullptr; }
  const std::string& id() const;
  const std::string& provider_name() const;
  bool closed() const;
  // Whether the generation that made this sandbox (Host::reload) offers `extension_id` (e.g.
  // "sbx.pause/1"): what its calls need, whatever the block's current generation offers.
  bool supports(std::string_view extension_id) const;

  // Runs a shell command. cwd defaults to the spec's workdir. A non-zero exit, a timeout (125,
  // "timeout") and a command the sandbox could not start (125, "sandbox") are results; errors
  // (unreachable backend, sandbox gone, closed sandbox) throw.
  ExecResult exec(std::string_view command, ExecOptions options = {});
  Operation<ExecResult> exec_async(std::string command, ExecOptions options = {});
  // Runs a program with its arguments, without a shell (argv[0] looked up in PATH when it has no
  // '/'), on a provider that can (ABI 1.3's sbx_exec_request.argv): an image without a shell runs
  // it. A provider that runs only command lines gets the same argv as one (each word quoted) and
  // runs it through its shell. Outcomes as exec(); an empty argv or argv[0] is
  // InvalidArgumentError.
  ExecResult exec_argv(std::vector<std::string> argv, ExecOptions options = {});
  Operation<ExecResult> exec_argv_async(std::vector<std::string> argv, ExecOptions options = {});

  // Copies a local file in, with the local file's permission bits (0777 of its mode: a script
  // uploaded with 0755 runs); missing parent directories are created. upload_bytes writes 0644.
  void upload(const std::filesystem::path& local_path, std::string_view remote_path);
  Operation<void> upload_async(std::filesystem::path local_path, std::string remote_path);
  void upload_bytes(std::string_view contents, std::string_view remote_path);
  Operation<void> upload_bytes_async(std::string contents, std::string remote_path);

  // Copies one sandbox file to a local path, as cp writes it. A regular file (or a new one;
  // missing parent directories are created) appears complete or not at all: it is written to a
  // temporary name next to the target and renamed over it on success. A symbolic link at the path
  // is followed: the file it leads to is replaced that way (a dangling link's target is made; its
  // directory must exist). A FIFO or a character device is opened (a FIFO without a reader waits
  // for one, in this call) and written into: no temporary file; a failure (the reader went away:
  // EPIPE) is reported, and what was written is the reader's. A directory, a socket or a block
  // device is refused with InvalidArgumentError naming the path, before the download starts.
  void download(std::string_view remote_path, const std::filesystem::path& local_path);
  Operation<void> download_async(std::string remote_path, std::filesystem::path local_path);
  std::string download_bytes(std::string_view remote_path);
  // Streams the file to `sink` as it arrives: nothing is kept on the host. The operation succeeds
  // once all of it was given to on_data; a failure after some bytes were given is an error, and
  // what was given is not the file. Its output can be held (Operation::hold_output) when the
  // provider offers sbx.flow/1 for downloads. InvalidArgumentError without on_data.
  Operation<void> download_to_async(std::string remote_path, DownloadSink sink);

  // STOPPED once closed (without asking the provider).
  SandboxStatus status();
  Operation<SandboxStatus> status_async();

  // A route to a service on a declared port (spec.ports). Throws InvalidArgumentError for a port
  // outside 1..65535 or not declared, UnimplementedError if the provider has no endpoints (the
  // asynchronous form throws these before it starts).
  Endpoint endpoint(int64_t port);
  Operation<Endpoint> endpoint_async(int64_t port);

  // sbx.pause/1: freezes every process of the sandbox; while paused, status() is `paused` and exec,
  // upload and download fail at once with FailedPreconditionError. UnimplementedError when the
  // provider cannot pause.
  void pause();
  Operation<void> pause_async();
  void resume();
  Operation<void> resume_async();

  // sbx.connect/1: a descriptor (JSON text, see sbx/abi/ext/connect.h) that Provider::connect turns
  // back into a working Sandbox, in this process or another. The descriptor holds no secret.
  std::string serialize();
  Operation<std::string> serialize_async();

  // sbx.renew/1: moves the sandbox's expiry to `ttl_s` from now (or to `expires_at`); returns the
  // expiry now in force. The backend honours it without a host process, as it does spec.ttl_s.
  std::chrono::system_clock::time_point renew(double ttl_s);
  Operation<std::chrono::system_clock::time_point> renew_async(
      std::chrono::system_clock::time_point expires_at);

  // sbx.session/1: a persistent shell (sbx/core/terminal.hpp). UnimplementedError when the
  // provider has none.
  Session open_session(SessionOptions options = {});
  Operation<Session> open_session_async(SessionOptions options = {});
  // A session opened before (by this or another client), by its id; no call to the provider.
  Session session(std::string id);

  // sbx.pty/1: a terminal (sbx/core/terminal.hpp), running once this returns. UnimplementedError
  // when the provider has none.
  Pty open_pty(PtyOptions options = {});
  Operation<Pty> open_pty_async(PtyOptions options = {});
  // A terminal opened before (by this or another client), by its id; no call to the provider.
  Pty pty(std::string id);

  // Ends the sandbox. Safe to call twice; the second call does nothing.
  void close();
  Operation<void> close_async();

  // Gives up ownership without closing: the sandbox lives on (until its TTL) and this object
  // becomes empty.
  void detach();

 private:
  friend void plugin_checks::close_behind_host(Sandbox& box);
  friend class plugin_checks::FailingUpload;
  friend class Host;  // Host::move_to_current
  Operation<ExecResult> exec_request_async(std::string command, std::vector<std::string> argv,
                                           ExecOptions options);
  std::shared_ptr<detail::SandboxState> state_;
};

}  // namespace sbx
