// Streams: upload and download, whose operations own the C++ view (ByteSource, ByteSink) of the
// host's stream, and those views' calls into the host.

#include "internal.hpp"

#include <algorithm>
#include <cstring>

namespace sbx::sdk::detail {
namespace {

// The host's sink as this SDK's struct: the fields a smaller (older) host's struct lacks are
// null, and its struct_size says so.
sbx_output_stream copy_of(const sbx_output_stream& sink) {
  sbx_output_stream copy{};
  std::memcpy(&copy, &sink, std::min<std::size_t>(sink.struct_size, sizeof copy));
  return copy;
}

// An upload: the operation owns the C++ view of the host's stream.
class UploadOp final : public Op<void> {
 public:
  UploadOp(const sbx_done_callbacks* cb, const sbx_input_stream& stream)
      : cb_(*cb), stream(stream) {}
  void deliver_value() noexcept override { cb_.on_complete(cb_.user_data, nullptr); }
  void deliver_error(const Error& error) noexcept override {
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, e); });
  }

 private:
  sbx_done_callbacks cb_;

 public:
  ByteSource stream;
};

// A download: the operation owns the C++ view of the host's sink, whose writes can be held
// (sbx.flow/1) the way the provider said (OutputFlow).
class DownloadOp final : public Op<void> {
 public:
  DownloadOp(const sbx_done_callbacks* cb, const sbx_output_stream& sink)
      : cb_(*cb), stream(copy_of(sink), this, &flow_) {}
  void deliver_value() noexcept override {
    flow_.release_writers();
    cb_.on_complete(cb_.user_data, nullptr);
  }
  void deliver_error(const Error& error) noexcept override {
    flow_.release_writers();
    with_c_error(error, [&](const sbx_error* e) { cb_.on_complete(cb_.user_data, e); });
  }
  bool hold_output(bool hold) noexcept override { return flow_.hold(*this, hold); }

 private:
  sbx_done_callbacks cb_;
  OutputFlow flow_;

 public:
  ByteSink stream;
};

// The host's stream, if the request carries a usable one (checked before the op exists, because
// the op keeps a copy); otherwise a stand-in, and the op fails inside its start.
const sbx_input_stream* source_of(const sbx_upload_request* req) {
  if (!req || !SBX_HAS_FIELD(req, sbx_upload_request, mode)) return nullptr;
  const sbx_input_stream* s = req->source;
  return s && SBX_HAS_FIELD(s, sbx_input_stream, read) && s->read ? s : nullptr;
}
const sbx_output_stream* sink_of(const sbx_download_request* req) {
  if (!req || !SBX_HAS_FIELD(req, sbx_download_request, sink)) return nullptr;
  const sbx_output_stream* s = req->sink;
  return s && SBX_HAS_FIELD(s, sbx_output_stream, write) && s->write ? s : nullptr;
}

}  // namespace

sbx_operation* SBX_ABI provider_upload(sbx_provider* p, sbx_sandbox* s,
                                       const sbx_upload_request* req,
                                       const sbx_done_callbacks* cb) {
  static const sbx_input_stream none{sizeof(sbx_input_stream), nullptr, 0, nullptr};
  const sbx_input_stream* source = source_of(req);
  return start_operation<UploadOp>(
      p, "upload", cb,
      [&](UploadOp& op, Completion<void> done) {
        Sandbox& sandbox = sandbox_of(p, s);
        if (!source) throw Error::invalid_argument("upload needs a request with a source stream");
        UploadRequest copy{text(req->remote_path, "the upload's remote_path"),
                           req->mode == 0 ? 0644u : req->mode};
        impl_of(p).upload(sandbox, std::move(copy), op.stream, std::move(done));
      },
      source ? *source : none);
}

sbx_operation* SBX_ABI provider_download(sbx_provider* p, sbx_sandbox* s,
                                         const sbx_download_request* req,
                                         const sbx_done_callbacks* cb) {
  static const sbx_output_stream none{sizeof(sbx_output_stream), nullptr, nullptr};
  const sbx_output_stream* sink = sink_of(req);
  return start_operation<DownloadOp>(
      p, "download", cb,
      [&](DownloadOp& op, Completion<void> done) {
        Sandbox& sandbox = sandbox_of(p, s);
        if (!sink) throw Error::invalid_argument("download needs a request with a sink stream");
        impl_of(p).download(sandbox, text(req->remote_path, "the download's remote_path"),
                            op.stream, std::move(done));
      },
      sink ? *sink : none);
}

}  // namespace sbx::sdk::detail

namespace sbx::sdk {

size_t ByteSource::read(char* buffer, size_t capacity) {
  const int64_t n = stream_.read(stream_.ctx, reinterpret_cast<uint8_t*>(buffer), capacity);
  if (n < 0 || static_cast<uint64_t>(n) > capacity) {
    throw Error::internal("the upload's source stream failed");
  }
  return static_cast<size_t>(n);
}

void ByteSink::expect_size(uint64_t size) {
  if (expected_ || !SBX_HAS_FIELD(&stream_, sbx_output_stream, expect) || !stream_.expect) return;
  expected_ = true;
  if (size > static_cast<uint64_t>(INT64_MAX) ||
      stream_.expect(stream_.ctx, static_cast<int64_t>(size)) != 0) {
    throw Error::cancelled("the download's destination refused the data");
  }
}

void ByteSink::write(std::string_view bytes) {
  if (bytes.empty()) return;
  expected_ = true;  // too late to announce a size
  if (flow_ && op_) flow_->wait_while_held(*op_);
  if (stream_.write(stream_.ctx, to_bytes(bytes)) != 0) {
    throw Error::cancelled("the download's destination refused the data");
  }
}

void ByteSink::on_hold(std::function<void(bool hold)> fn) {
  if (flow_) flow_->set_hold_handler(std::move(fn));
}

void ByteSink::hold_by_blocking_writes() {
  if (flow_) flow_->set_blocking_hold();
}

}  // namespace sbx::sdk
