// Runs a BlockingProvider behind the asynchronous Provider interface, one pool task per operation.

#include <sbx/sdk/blocking.hpp>
#include <sbx/sdk/shell_sessions.hpp>

#include <cstring>
#include <type_traits>

namespace sbx::sdk {
namespace {

// An sbx_input_stream over bytes in memory (startup files).
struct MemoryStream {
  std::string_view data;
  size_t offset = 0;

  static int64_t SBX_ABI read(void* ctx, uint8_t* buffer, size_t capacity) {
    auto* self = static_cast<MemoryStream*>(ctx);
    const size_t n = std::min(capacity, self->data.size() - self->offset);
    std::memcpy(buffer, self->data.data() + self->offset, n);
    self->offset += n;
    return static_cast<int64_t>(n);
  }
};

class BlockingAdapter final : public Provider,
                              public EndpointExtension,
                              public ListReapExtension,
                              public PauseExtension,
                              public ConnectExtension,
                              public RenewExtension,
                              public PtyExtension {
 public:
  BlockingAdapter(std::unique_ptr<BlockingProvider> impl, Logger log)
      : impl_(std::move(impl)),
        endpoint_(dynamic_cast<BlockingEndpoint*>(impl_.get())),
        list_reap_(dynamic_cast<BlockingListReap*>(impl_.get())),
        pause_(dynamic_cast<BlockingPause*>(impl_.get())),
        connect_(dynamic_cast<BlockingConnect*>(impl_.get())),
        renew_(dynamic_cast<BlockingRenew*>(impl_.get())),
        async_exec_(dynamic_cast<AsyncExec*>(impl_.get())),
        pty_(dynamic_cast<BlockingPty*>(impl_.get())),
        sessions_(dynamic_cast<BlockingShellSessions*>(impl_.get())
                      ? std::make_unique<Sessions>(*this)
                      : nullptr),
        log_(log),
        pool_(impl_->pool_options()) {
    if (pty_ && !pty_->offers_pty()) pty_ = nullptr;
  }

  void create(Spec spec, Completion<std::unique_ptr<Sandbox>> done) override {
    run(std::move(done), [this, spec = std::move(spec)](const CancelToken& cancel) {
      std::unique_ptr<Sandbox> sandbox = impl_->create(spec, cancel);
      if (!sandbox) throw Error::internal("the provider created no sandbox");
      if (!spec.files.empty()) write_files_or_close(*sandbox, spec.files, cancel);
      return sandbox;
    });
  }

  void exec(Sandbox& sandbox, ExecRequest request, ExecCompletion done) override {
    if (async_exec_ && async_exec_->takes_exec(sandbox)) {
      async_exec_->exec_async(sandbox, std::move(request), std::move(done));
      return;
    }
    OutputSink& out = done.output();
    // The command's writes from this exec's own pool thread wait while the host holds its output
    // (sbx.flow/1); writes from another thread (a provider's event loop) never do.
    done.hold_by_blocking_writes();
    run(std::move(done),
        [this, &sandbox, &out, request = std::move(request)](const CancelToken& cancel) {
          const detail::WritesMayWait here;
          return impl_->exec(sandbox, request, out, cancel);
        });
  }

  void upload(Sandbox& sandbox, UploadRequest request, ByteSource& source,
              Completion<void> done) override {
    run(std::move(done),
        [this, &sandbox, &source, request = std::move(request)](const CancelToken& cancel) {
          impl_->upload(sandbox, request, source, cancel);
        });
  }

  void download(Sandbox& sandbox, std::string remote_path, ByteSink& sink,
                Completion<void> done) override {
    // As exec's output: the writes from this download's own pool thread wait while the host
    // holds it (sbx.flow/1).
    sink.hold_by_blocking_writes();
    run(std::move(done),
        [this, &sandbox, &sink, path = std::move(remote_path)](const CancelToken& cancel) {
          const detail::WritesMayWait here;
          impl_->download(sandbox, path, sink, cancel);
        });
  }

  void status(Sandbox& sandbox, Completion<SandboxStatus> done) override {
    run(std::move(done),
        [this, &sandbox](const CancelToken& cancel) { return impl_->status(sandbox, cancel); });
  }

  void close(Sandbox& sandbox, Completion<void> done) override {
    run(std::move(done),
        [this, &sandbox](const CancelToken& cancel) { impl_->close(sandbox, cancel); });
  }

  EndpointExtension* endpoint_extension() override { return endpoint_ ? this : nullptr; }
  ListReapExtension* list_reap_extension() override { return list_reap_ ? this : nullptr; }
  PauseExtension* pause_extension() override { return pause_ ? this : nullptr; }
  ConnectExtension* connect_extension() override { return connect_ ? this : nullptr; }
  RenewExtension* renew_extension() override { return renew_ ? this : nullptr; }
  SessionExtension* session_extension() override { return sessions_.get(); }
  PtyExtension* pty_extension() override { return pty_ ? this : nullptr; }

  void endpoint(Sandbox& sandbox, uint16_t port, Completion<Endpoint> done) override {
    run(std::move(done), [this, &sandbox, port](const CancelToken& cancel) {
      return endpoint_->endpoint(sandbox, port, cancel);
    });
  }

  void list(KeyValues selector, Completion<std::vector<SandboxInfo>> done) override {
    run(std::move(done), [this, selector = std::move(selector)](const CancelToken& cancel) {
      return list_reap_->list(selector, cancel);
    });
  }

  void reap(KeyValues selector, Completion<std::vector<SandboxInfo>> done) override {
    run(std::move(done), [this, selector = std::move(selector)](const CancelToken& cancel) {
      return list_reap_->reap(selector, cancel);
    });
  }

  void pause(Sandbox& sandbox, Completion<void> done) override {
    run(std::move(done),
        [this, &sandbox](const CancelToken& cancel) { pause_->pause(sandbox, cancel); });
  }

  void resume(Sandbox& sandbox, Completion<void> done) override {
    run(std::move(done),
        [this, &sandbox](const CancelToken& cancel) { pause_->resume(sandbox, cancel); });
  }

  void serialize(Sandbox& sandbox, Completion<std::string> done) override {
    run(std::move(done), [this, &sandbox](const CancelToken& cancel) {
      return connect_->serialize(sandbox, cancel);
    });
  }

  void connect(std::string descriptor, Completion<Connected> done) override {
    run(std::move(done), [this, descriptor = std::move(descriptor)](const CancelToken& cancel) {
      Connected connected = connect_->connect(descriptor, cancel);
      if (!connected.sandbox) throw Error::internal("the provider connected no sandbox");
      return connected;
    });
  }

  void renew(Sandbox& sandbox, int64_t expires_at_unix_ms, Completion<int64_t> done) override {
    run(std::move(done), [this, &sandbox, expires_at_unix_ms](const CancelToken& cancel) {
      return renew_->renew(sandbox, expires_at_unix_ms, cancel);
    });
  }

  void open_pty(Sandbox& sandbox, PtyRequest request, Completion<std::string> done) override {
    run(std::move(done), [this, &sandbox, request = std::move(request)](const CancelToken& cancel) {
      return pty_->open_pty(sandbox, request, cancel);
    });
  }

  void attach_pty(Sandbox& sandbox, std::string id, uint64_t since, bool takeover,
                  PtyAttachCompletion done) override {
    pty_->attach_pty(sandbox, id, since, takeover, std::move(done));
  }

  void write_pty(Sandbox& sandbox, std::string id, std::string input,
                 Completion<void> done) override {
    pty_->write_pty(sandbox, id, input);
    done.succeed();
  }

  void resize_pty(Sandbox& sandbox, std::string id, uint16_t rows, uint16_t cols,
                  Completion<void> done) override {
    pty_->resize_pty(sandbox, id, rows, cols);
    done.succeed();
  }

  void close_pty(Sandbox& sandbox, std::string id, Completion<void> done) override {
    run(std::move(done), [this, &sandbox, id = std::move(id)](const CancelToken& cancel) {
      pty_->close_pty(sandbox, id, cancel);
    });
  }

 private:
  // Queues `body` on the pool; its return value (or exception) completes `done`.
  template <class C, class F>
  void run(C done, F body) {
    pool_.submit([done = std::move(done), body = std::move(body)]() mutable {
      try {
        const CancelToken cancel = done.cancel_token();
        throw_if_cancelled(cancel);  // cancelled while queued
        if constexpr (std::is_void_v<decltype(body(cancel))>) {
          body(cancel);
          done.succeed();
        } else {
          done.succeed(body(cancel));
        }
      } catch (...) {
        done.fail_current_exception();
      }
    });
  }

  // A sandbox whose startup files cannot be written is closed: create leaves nothing behind.
  void write_files_or_close(Sandbox& sandbox, const std::vector<StartupFile>& files,
                            const CancelToken& cancel) {
    try {
      impl_->write_startup_files(sandbox, files, cancel);
    } catch (...) {
      const Error error = detail::current_exception_to_error();
      try {
        impl_->close(sandbox, CancelToken());
      } catch (const std::exception& e) {
        log_.warn("closing sandbox ", sandbox.id(), " after its startup files failed: ", e.what());
      }
      if (error.status() == SBX_STATUS_CANCELLED) throw error;
      throw Error::create_failed("writing the startup files of sandbox " + sandbox.id() +
                                 " failed: " + error.what());
    }
  }

  std::unique_ptr<BlockingProvider> impl_;
  BlockingEndpoint* endpoint_;
  BlockingListReap* list_reap_;
  BlockingPause* pause_;
  BlockingConnect* connect_;
  BlockingRenew* renew_;
  AsyncExec* async_exec_;
  BlockingPty* pty_;
  struct Sessions final : ShellSessions {
    explicit Sessions(Provider& provider) : ShellSessions(provider) {}
  };
  std::unique_ptr<Sessions> sessions_;  // BlockingShellSessions: over this adapter's exec
  Logger log_;
  ThreadPool pool_;  // last: destroyed (joined) first, while impl_ is still alive
};

}  // namespace

void BlockingProvider::write_startup_files(Sandbox& sandbox, const std::vector<StartupFile>& files,
                                           const CancelToken& cancel) {
  for (const StartupFile& file : files) {
    MemoryStream memory{file.contents};
    const sbx_input_stream stream{sizeof(sbx_input_stream), &memory,
                                  static_cast<int64_t>(file.contents.size()), &MemoryStream::read};
    ByteSource source(stream);
    upload(sandbox, UploadRequest{file.path, 0644}, source, cancel);
  }
}

std::unique_ptr<Provider> make_blocking_adapter(std::unique_ptr<BlockingProvider> provider,
                                                Logger log) {
  return std::make_unique<BlockingAdapter>(std::move(provider), log);
}

}  // namespace sbx::sdk
