// The C ABI under load, without the core library: 1,000 concurrent operations through the
// test_processes plugin, some cancelled, each completing exactly once. Built for TSan too.

#include <doctest/doctest.h>

#include <sbx/abi.h>

#include <boost/dll/shared_library.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

void SBX_ABI quiet_log(const sbx_host*, int32_t, sbx_str) {}
bool SBX_ABI log_off(const sbx_host*, int32_t) {
  return false;
}
int64_t SBX_ABI now_ns(const sbx_host*) {
  return std::chrono::steady_clock::now().time_since_epoch().count();
}
const void* SBX_ABI no_extension(const sbx_host*, const char*) {
  return nullptr;
}

const sbx_host kHost{
    sizeof(sbx_host), SBX_ABI_VERSION_INIT, {"test", 4}, {"0", 1}, nullptr, quiet_log, log_off,
    now_ns,           no_extension};

sbx_str str(const char* s) {
  return {s, std::strlen(s)};
}

// Counts completions per operation and wakes the waiter when all are in.
struct Tracker {
  std::mutex mutex;
  std::condition_variable cv;
  int done = 0;
  void finish() {
    std::lock_guard lock(mutex);
    ++done;
    cv.notify_all();
  }
  bool wait_for(int n, std::chrono::seconds timeout) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, timeout, [&] { return done >= n; });
  }
};

struct OpRecord {
  Tracker* tracker = nullptr;
  std::atomic<int> completions{0};
  std::atomic<int> outputs_after_completion{0};
  std::atomic<bool> ok{false};
  std::atomic<int32_t> status{SBX_STATUS_OK};
  std::string expected_stdout;
  std::string got_stdout;  // written only inside the (single) completion callback
  std::string download_buffer;
  sbx_output_stream download_stream{};  // must live until the download completes

  void complete(const sbx_error* error) {
    if (error) status = error->status;
    ok = error == nullptr;
    if (completions.fetch_add(1) == 0) tracker->finish();
  }
};

void SBX_ABI on_exec_output(void* ud, int32_t, sbx_bytes) {
  auto* r = static_cast<OpRecord*>(ud);
  if (r->completions.load() > 0) ++r->outputs_after_completion;
}
void SBX_ABI on_exec_done(void* ud, const sbx_exec_result* result, const sbx_error* error) {
  auto* r = static_cast<OpRecord*>(ud);
  CHECK((result == nullptr) != (error == nullptr));
  if (result) {
    r->got_stdout.assign(reinterpret_cast<const char*>(result->stdout_bytes.data),
                         result->stdout_bytes.len);
  }
  r->complete(error);
}
void SBX_ABI on_status_done(void* ud, int32_t status, const sbx_error* error) {
  auto* r = static_cast<OpRecord*>(ud);
  if (!error) CHECK(status == SBX_SANDBOX_RUNNING);
  r->complete(error);
}
void SBX_ABI on_done(void* ud, const sbx_error* error) {
  static_cast<OpRecord*>(ud)->complete(error);
}

struct MemoryIn {
  std::string data;
  size_t offset = 0;
  sbx_input_stream stream{};
  static int64_t SBX_ABI read(void* ctx, uint8_t* buf, size_t cap) {
    auto* m = static_cast<MemoryIn*>(ctx);
    const size_t n = std::min(cap, m->data.size() - m->offset);
    std::memcpy(buf, m->data.data() + m->offset, n);
    m->offset += n;
    return static_cast<int64_t>(n);
  }
};

int32_t SBX_ABI memory_out(void* ctx, sbx_bytes data) {
  static_cast<OpRecord*>(ctx)->download_buffer.append(reinterpret_cast<const char*>(data.data),
                                                      data.len);
  return 0;
}

}  // namespace

TEST_CASE("1000 concurrent operations each complete exactly once") {
  boost::dll::shared_library lib(
      std::string(SBX_TEST_PLUGIN_DIR) + "/test_processes.so",
      boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  const sbx_plugin* plugin = lib.get<const sbx_plugin*()>(SBX_PLUGIN_ENTRY_SYMBOL)();
  REQUIRE(plugin->init(&kHost, nullptr) == SBX_STATUS_OK);
  sbx_provider* provider = nullptr;
  REQUIRE(plugin->factories[0]->create(plugin->factories[0], &kHost, str("{}"), &provider,
                                       nullptr) == SBX_STATUS_OK);

  // One sandbox for everything.
  struct CreateResult {
    std::mutex m;
    std::condition_variable cv;
    sbx_sandbox* sandbox = nullptr;
    bool done = false;
  } created;
  sbx_spec spec{};
  spec.struct_size = sizeof(spec);
  spec.workdir = str("/w");
  const sbx_create_callbacks create_cb{sizeof(create_cb), &created,
                                       [](void* ud, sbx_sandbox* s, const sbx_error*) {
                                         auto* c = static_cast<CreateResult*>(ud);
                                         std::lock_guard lock(c->m);
                                         c->sandbox = s;
                                         c->done = true;
                                         c->cv.notify_all();
                                       }};
  if (sbx_operation* op = provider->create(provider, &spec, &create_cb)) op->release(op);
  {
    std::unique_lock lock(created.m);
    REQUIRE(created.cv.wait_for(lock, 30s, [&] { return created.done; }));
  }
  REQUIRE(created.sandbox != nullptr);
  sbx_sandbox* sandbox = created.sandbox;

  constexpr int kOps = 1000;
  Tracker tracker;
  std::vector<std::unique_ptr<OpRecord>> records;
  std::vector<std::unique_ptr<MemoryIn>> inputs;
  for (int i = 0; i < kOps; ++i) {
    records.push_back(std::make_unique<OpRecord>());
    records.back()->tracker = &tracker;
  }
  // Start everything from four threads at once; cancel every seventh operation right away.
  auto start_range = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      OpRecord* r = records[static_cast<size_t>(i)].get();
      sbx_operation* op = nullptr;
      switch (i % 4) {
        case 0: {
          const std::string cmd = "echo " + std::to_string(i);
          r->expected_stdout = std::to_string(i) + "\n";
          const sbx_exec_request req{sizeof(req), {cmd.data(), cmd.size()}, {}, {}, {}, {}, {}};
          const sbx_exec_callbacks cb{sizeof(cb), r, on_exec_output, on_exec_done};
          // Exec with streaming on half of them: the result's stdout is then empty.
          const sbx_exec_callbacks plain{sizeof(cb), r, nullptr, on_exec_done};
          op = provider->exec(provider, sandbox, &req, (i % 8 == 0) ? &cb : &plain);
          if (i % 8 == 0) r->expected_stdout.clear();
          break;
        }
        case 1: {
          const sbx_status_callbacks cb{sizeof(cb), r, on_status_done};
          op = provider->status(provider, sandbox, &cb);
          break;
        }
        case 2: {
          auto in = std::make_unique<MemoryIn>();
          in->data = "file " + std::to_string(i);
          in->stream = {sizeof(sbx_input_stream), in.get(), static_cast<int64_t>(in->data.size()),
                        MemoryIn::read};
          const std::string path = "/w/files/" + std::to_string(i);
          const sbx_upload_request req{sizeof(req), {path.data(), path.size()}, &in->stream, 0};
          const sbx_done_callbacks cb{sizeof(cb), r, on_done};
          op = provider->upload(provider, sandbox, &req, &cb);
          static std::mutex inputs_mutex;
          std::lock_guard lock(inputs_mutex);
          inputs.push_back(std::move(in));
          break;
        }
        case 3: {
          // Downloads of a file that does not exist: errors must complete exactly once too.
          r->download_stream = {sizeof(sbx_output_stream), r, memory_out};
          const std::string path = "/w/missing/" + std::to_string(i);
          const sbx_download_request req{
              sizeof(req), {path.data(), path.size()}, &r->download_stream};
          const sbx_done_callbacks cb{sizeof(cb), r, on_done};
          op = provider->download(provider, sandbox, &req, &cb);
          break;
        }
      }
      if (op) {
        if (i % 7 == 0) {
          op->cancel(op);
          op->cancel(op);  // idempotent
        }
        op->release(op);
      }
    }
  };
  std::vector<std::thread> starters;
  for (int t = 0; t < 4; ++t)
    starters.emplace_back(start_range, t * kOps / 4, (t + 1) * kOps / 4);
  for (auto& t : starters)
    t.join();

  REQUIRE(tracker.wait_for(kOps, 120s));
  std::this_thread::sleep_for(200ms);  // a duplicate completion would show up now
  int cancelled = 0;
  for (int i = 0; i < kOps; ++i) {
    const OpRecord& r = *records[static_cast<size_t>(i)];
    INFO("operation " << i);
    CHECK(r.completions.load() == 1);
    CHECK(r.outputs_after_completion.load() == 0);
    if (r.status.load() == SBX_STATUS_CANCELLED) {
      ++cancelled;
      CHECK(i % 7 == 0);  // only the ones we cancelled
      continue;
    }
    switch (i % 4) {
      case 0:
        CHECK(r.ok.load());
        CHECK(r.got_stdout == r.expected_stdout);
        break;
      case 1:
      case 2:
        CHECK(r.ok.load());
        break;
      case 3:
        CHECK(r.status.load() == SBX_STATUS_NOT_FOUND);
        break;
    }
  }
  MESSAGE("cancellations that took effect: " << cancelled);

  Tracker close_tracker;
  OpRecord close_record;
  close_record.tracker = &close_tracker;
  const sbx_done_callbacks close_cb{sizeof(close_cb), &close_record, on_done};
  if (sbx_operation* op = provider->close(provider, sandbox, &close_cb)) op->release(op);
  REQUIRE(close_tracker.wait_for(1, 30s));
  CHECK(close_record.ok.load());
  provider->release_sandbox(provider, sandbox);
  provider->destroy(provider);
  plugin->deinit();
}
