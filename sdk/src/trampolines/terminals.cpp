// The tables of sbx.session/1 (open, close; run is exec's operation, in exec.cpp) and sbx.pty/1:
// each entry starts one operation on the provider's SessionExtension or PtyExtension.

#include "operations.hpp"
#include "ordered_op.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

namespace sbx::sdk::detail {
namespace {

// The host's callbacks as this SDK's struct: what a smaller (older) host's struct lacks
// (on_attached before ABI 1.3) is null.
sbx_pty_attach_callbacks copy_of(const sbx_pty_attach_callbacks& cb) {
  sbx_pty_attach_callbacks copy{};
  std::memcpy(&copy, &cb, std::min<std::size_t>(cb.struct_size, sizeof copy));
  return copy;
}

// The chunk that stands for on_attached in the ordered queue (no output has this stream).
constexpr auto kAttachedMark = static_cast<StdStream>(0);

// An attachment: on_attached, output with offsets, in order, then the exit code or why it ended.
class AttachOp final : public OrderedOp<int32_t, std::tuple<StdStream, uint64_t, std::string>>,
                       public PtyOutputSink {
 public:
  explicit AttachOp(const sbx_pty_attach_callbacks* cb) : cb_(copy_of(*cb)) {}
  void attached() override {
    if (cb_.on_attached) emit({kAttachedMark, 0, std::string()});
  }
  void write(StdStream stream, uint64_t offset, std::string_view bytes) override {
    if (bytes.empty() || !cb_.on_output) return;
    emit({stream, offset, std::string(bytes)});
  }

 private:
  void emit_chunk(const std::tuple<StdStream, uint64_t, std::string>& chunk) noexcept override {
    if (std::get<0>(chunk) == kAttachedMark) return cb_.on_attached(cb_.user_data);
    cb_.on_output(cb_.user_data, static_cast<int32_t>(std::get<0>(chunk)), std::get<1>(chunk),
                  to_bytes(std::get<2>(chunk)));
  }
  void complete_value(const int32_t& exit_code) noexcept override {
    cb_.on_complete(cb_.user_data, exit_code, nullptr);
  }
  void complete_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, 0, e); });
  }

  sbx_pty_attach_callbacks cb_;
};

PtyAttachCompletion make_completion(AttachOp* op) {
  return PtyAttachCompletion(op, op);
}

sbx_operation* SBX_ABI session_open(sbx_provider* p, sbx_sandbox* s, const sbx_session_request* req,
                                    const sbx_session_callbacks* cb) {
  return start_operation<SessionIdOp>(
      p, "sbx.session/1 open", cb, [&](SessionIdOp&, Completion<std::string> done) {
        Sandbox& sandbox = sandbox_of(p, s);
        if (!req) throw Error::invalid_argument("opening a session needs a request");
        session_of(p).open_session(sandbox, to_session_request(*req), std::move(done));
      });
}

sbx_operation* SBX_ABI session_close(sbx_provider* p, sbx_sandbox* s, sbx_str session_id,
                                     const sbx_done_callbacks* cb) {
  return start_operation<DoneOp>(p, "sbx.session/1 close", cb, [&](DoneOp&, Completion<void> done) {
    Sandbox& sandbox = sandbox_of(p, s);
    session_of(p).close_session(sandbox, session_id_of(session_id), std::move(done));
  });
}

sbx_operation* SBX_ABI pty_open(sbx_provider* p, sbx_sandbox* s, const sbx_pty_request* req,
                                const sbx_session_callbacks* cb) {
  return start_operation<SessionIdOp>(
      p, "sbx.pty/1 open", cb, [&](SessionIdOp&, Completion<std::string> done) {
        Sandbox& sandbox = sandbox_of(p, s);
        if (!req) throw Error::invalid_argument("opening a terminal needs a request");
        pty_of(p).open_pty(sandbox, to_pty_request(*req), std::move(done));
      });
}

sbx_operation* SBX_ABI pty_attach(sbx_provider* p, sbx_sandbox* s, sbx_str session_id,
                                  uint64_t since, bool takeover,
                                  const sbx_pty_attach_callbacks* cb) {
  return start_operation<AttachOp>(
      p, "sbx.pty/1 attach", cb, [&](AttachOp&, PtyAttachCompletion done) {
        Sandbox& sandbox = sandbox_of(p, s);
        pty_of(p).attach_pty(sandbox, session_id_of(session_id), since, takeover, std::move(done));
      });
}

sbx_operation* SBX_ABI pty_write(sbx_provider* p, sbx_sandbox* s, sbx_str session_id,
                                 sbx_bytes input, const sbx_done_callbacks* cb) {
  return start_operation<DoneOp>(p, "sbx.pty/1 write", cb, [&](DoneOp&, Completion<void> done) {
    Sandbox& sandbox = sandbox_of(p, s);
    if (!input.data && input.len) throw Error::invalid_argument("terminal input at NULL");
    std::string bytes(reinterpret_cast<const char*>(input.data), input.len);
    pty_of(p).write_pty(sandbox, session_id_of(session_id), std::move(bytes), std::move(done));
  });
}

sbx_operation* SBX_ABI pty_resize(sbx_provider* p, sbx_sandbox* s, sbx_str session_id,
                                  uint16_t rows, uint16_t cols, const sbx_done_callbacks* cb) {
  return start_operation<DoneOp>(p, "sbx.pty/1 resize", cb, [&](DoneOp&, Completion<void> done) {
    Sandbox& sandbox = sandbox_of(p, s);
    if (rows == 0 || cols == 0) {
      throw Error::invalid_argument("a terminal's rows and cols must be at least 1, got " +
                                    std::to_string(rows) + " x " + std::to_string(cols));
    }
    pty_of(p).resize_pty(sandbox, session_id_of(session_id), rows, cols, std::move(done));
  });
}

sbx_operation* SBX_ABI pty_close(sbx_provider* p, sbx_sandbox* s, sbx_str session_id,
                                 const sbx_done_callbacks* cb) {
  return start_operation<DoneOp>(p, "sbx.pty/1 close", cb, [&](DoneOp&, Completion<void> done) {
    Sandbox& sandbox = sandbox_of(p, s);
    pty_of(p).close_pty(sandbox, session_id_of(session_id), std::move(done));
  });
}

}  // namespace

const sbx_provider_session kSessionTable{sizeof(sbx_provider_session), &session_open, &session_run,
                                         &session_close};
const sbx_provider_pty kPtyTable{
    sizeof(sbx_provider_pty), &pty_open, &pty_attach, &pty_write, &pty_resize, &pty_close};

}  // namespace sbx::sdk::detail
