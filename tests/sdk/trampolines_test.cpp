// The SDK's C side seen from a host: a provider class defined here is wrapped by the SDK's
// trampolines (detail::make_c_provider) and driven through the raw sbx_provider table, in process.
// Covers what the host cannot provoke with a well-behaved plugin: re-entrant cancellation from a
// callback, structs from other minor versions, missing arguments, and a Completion used twice.

#include <doctest/doctest.h>

#include <sbx/sdk/plugin.hpp>
#include <sbx/sdk/time.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace sbx::sdk;
using namespace std::chrono_literals;

namespace {

// Exec writes "first", then waits for cancellation; its stop callback writes "last words" and
// fails the exec, synchronously, on whichever thread cancels.
class ReentrantProvider final : public Provider {
 public:
  void create(Spec, Completion<std::unique_ptr<Sandbox>> done) override {
    done.succeed(std::make_unique<Sandbox>("box"));
  }
  void exec(Sandbox&, ExecRequest, ExecCompletion done) override {
    std::lock_guard lock(mutex_);
    pending_.emplace(std::move(done));
    on_stop_.emplace(pending_->cancel_token(), [this] {
      std::lock_guard lock(mutex_);
      pending_->output().write(StdStream::err, "last words");
      pending_->fail(Error::cancelled());
      pending_->fail(Error::internal("a second completion is ignored"));
    });
    writer_ = std::thread([this] { pending_->output().write(StdStream::out, "first"); });
  }
  void upload(Sandbox&, UploadRequest, ByteSource&, Completion<void> done) override {
    done.succeed();
    done.succeed();  // used twice: nothing happens
    done.fail(Error::internal("ignored"));
  }
  void download(Sandbox&, std::string, ByteSink&, Completion<void> done) override {
    done.succeed();
  }
  void status(Sandbox&, Completion<SandboxStatus> done) override {
    done.succeed(SandboxStatus::running);
  }
  void close(Sandbox&, Completion<void> done) override { done.succeed(); }

  ~ReentrantProvider() override {
    if (writer_.joinable()) writer_.join();
  }

 private:
  std::mutex mutex_;
  std::optional<ExecCompletion> pending_;
  std::optional<std::stop_callback<std::function<void()>>> on_stop_;
  std::thread writer_;
};

struct ProviderHandle {
  sbx_provider* p;
  explicit ProviderHandle(std::unique_ptr<Provider> impl)
      : p(detail::make_c_provider(std::move(impl), Logger())) {}
  ~ProviderHandle() { p->destroy(p); }
};

sbx_sandbox* create_sandbox(sbx_provider* p) {
  sbx_spec spec{};
  spec.struct_size = sizeof spec;
  std::promise<sbx_sandbox*> made;
  sbx_create_callbacks cb{sizeof cb, &made, [](void* ud, sbx_sandbox* s, const sbx_error*) {
                            static_cast<std::promise<sbx_sandbox*>*>(ud)->set_value(s);
                          }};
  if (sbx_operation* op = p->create(p, &spec, &cb)) op->release(op);
  sbx_sandbox* s = made.get_future().get();
  REQUIRE(s != nullptr);
  return s;
}

struct ExecRecord {
  std::mutex mutex;
  std::vector<std::string> events;
  std::atomic<sbx_operation*> op{nullptr};
  std::atomic<int> completions{0};
  std::promise<void> done;

  void add(std::string event) {
    std::lock_guard lock(mutex);
    events.push_back(std::move(event));
  }
};

}  // namespace

TEST_CASE(
    "a host may cancel from inside on_output: the provider's synchronous completion waits "
    "for the callback to return, and output and completion stay in order") {
  ProviderHandle provider(std::make_unique<ReentrantProvider>());
  sbx_provider* p = provider.p;
  sbx_sandbox* sandbox = create_sandbox(p);

  ExecRecord record;
  sbx_exec_request request{};
  request.struct_size = sizeof request;
  sbx_exec_callbacks cb{
      sizeof cb, &record,
      [](void* ud, int32_t stream, sbx_bytes chunk) {
        auto* r = static_cast<ExecRecord*>(ud);
        r->add((stream == SBX_STREAM_STDOUT ? "out:" : "err:") +
               std::string(reinterpret_cast<const char*>(chunk.data), chunk.len));
        sbx_operation* op;
        while (!(op = r->op.load()))
          std::this_thread::yield();
        if (chunk.len == 5) {  // "first": enough, stop the command from inside the callback
          op->cancel(op);
          r->add("cancel returned");
        }
      },
      [](void* ud, const sbx_exec_result* result, const sbx_error* error) {
        auto* r = static_cast<ExecRecord*>(ud);
        r->add(error ? "complete:" + std::string(sbx_status_name(error->status))
                     : "complete:rc=" + std::to_string(result->return_code));
        if (r->completions.fetch_add(1) == 0) r->done.set_value();
      }};
  sbx_operation* op = p->exec(p, sandbox, &request, &cb);
  REQUIRE(op != nullptr);
  record.op = op;

  REQUIRE(record.done.get_future().wait_for(10s) == std::future_status::ready);
  {
    std::lock_guard lock(record.mutex);
    const std::vector<std::string> expected{"out:first", "cancel returned", "err:last words",
                                            "complete:CANCELLED"};
    CHECK(record.events == expected);
  }
  CHECK(record.completions == 1);
  op->release(op);
  p->release_sandbox(p, sandbox);
}

TEST_CASE(
    "callbacks from a later minor (larger struct) are accepted; too small ones start "
    "nothing") {
  ProviderHandle provider(std::make_unique<ReentrantProvider>());
  sbx_provider* p = provider.p;
  sbx_sandbox* sandbox = create_sandbox(p);

  struct LaterCallbacks {  // what an ABI 1.1 host might pass: a field appended
    sbx_status_callbacks v1;
    void* appended;
  };
  std::promise<int32_t> got;
  LaterCallbacks later{{sizeof(LaterCallbacks), &got,
                        [](void* ud, int32_t status, const sbx_error*) {
                          static_cast<std::promise<int32_t>*>(ud)->set_value(status);
                        }},
                       nullptr};
  if (sbx_operation* op = p->status(p, sandbox, &later.v1)) op->release(op);
  CHECK(got.get_future().get() == SBX_SANDBOX_RUNNING);

  std::atomic<int> calls{0};
  sbx_status_callbacks small{
      offsetof(sbx_status_callbacks, on_complete), &calls,
      [](void* ud, int32_t, const sbx_error*) { ++*static_cast<std::atomic<int>*>(ud); }};
  CHECK(p->status(p, sandbox, &small) == nullptr);
  CHECK(p->status(p, sandbox, nullptr) == nullptr);
  CHECK(calls == 0);
  p->release_sandbox(p, sandbox);
}

TEST_CASE("missing or too small requests complete with INVALID_ARGUMENT instead of crashing") {
  ProviderHandle provider(std::make_unique<ReentrantProvider>());
  sbx_provider* p = provider.p;

  struct Outcome {
    std::promise<std::string> message;
    std::atomic<int> calls{0};
  };
  auto create_with = [&](const sbx_spec* spec) {
    Outcome outcome;
    sbx_create_callbacks cb{
        sizeof cb, &outcome, [](void* ud, sbx_sandbox* s, const sbx_error* e) {
          auto* o = static_cast<Outcome*>(ud);
          if (o->calls++ == 0) {
            o->message.set_value(s ? "created"
                                   : std::string(sbx_status_name(e->status)) + ": " +
                                         std::string(e->message.data, e->message.len));
          }
        }};
    if (sbx_operation* op = p->create(p, spec, &cb)) op->release(op);
    std::string message = outcome.message.get_future().get();
    CHECK(outcome.calls == 1);
    return message;
  };
  CHECK(create_with(nullptr) == "INVALID_ARGUMENT: create needs a spec");
  sbx_spec tiny{};
  tiny.struct_size = offsetof(sbx_spec, labels);  // from no ABI version at all
  CHECK(create_with(&tiny).starts_with("INVALID_ARGUMENT: sbx_spec is smaller"));
}

TEST_CASE("a Completion used twice completes once") {
  ProviderHandle provider(std::make_unique<ReentrantProvider>());
  sbx_provider* p = provider.p;
  sbx_sandbox* sandbox = create_sandbox(p);

  std::atomic<int> calls{0};
  std::atomic<bool> ok{false};
  struct Ctx {
    std::atomic<int>* calls;
    std::atomic<bool>* ok;
  } ctx{&calls, &ok};
  sbx_input_stream source{sizeof source, nullptr, 0,
                          [](void*, uint8_t*, size_t) -> int64_t { return 0; }};
  sbx_upload_request request{sizeof request, {"f", 1}, &source, 0};
  sbx_done_callbacks cb{sizeof cb, &ctx, [](void* ud, const sbx_error* e) {
                          auto* c = static_cast<Ctx*>(ud);
                          ++*c->calls;
                          *c->ok = e == nullptr;
                        }};
  if (sbx_operation* op = p->upload(p, sandbox, &request, &cb)) op->release(op);
  CHECK(calls == 1);
  CHECK(ok);
  p->release_sandbox(p, sandbox);
}

TEST_CASE("durations from configs and specs saturate instead of overflowing") {
  CHECK(seconds_to_ms(1.5) == 1500ms);
  CHECK(seconds_to_ms(0.0001) == 1ms);  // rounded up
  CHECK(seconds_to_ms(1e300) == kForever);
  CHECK(seconds_to_ms(-1) == 0ms);
  CHECK(seconds_to_ms(std::numeric_limits<double>::quiet_NaN()) == 0ms);
  const auto far = deadline_after(std::chrono::milliseconds::max());
  CHECK(far > std::chrono::steady_clock::now() + std::chrono::hours(24 * 365 * 30));
}
