// sbx::ExecdTerminal (execd_terminal.hpp): execd's terminal WebSocket, client side.

#include <sbx/sdk/execd_terminal.hpp>

#include <sbx/base/utf8.hpp>

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <chrono>

namespace sbx::sdk {

namespace json = boost::json;

namespace {

constexpr std::chrono::milliseconds kTimeout{10'000};  // the handshake, and one frame's send
constexpr size_t kInputFrame = 64 * 1024;
// execd's close code for an attachment another client took over (agent/README.md).
constexpr uint16_t kTakenOver = 4001;

// At most 1 KiB of what a server (the sandbox) said, as UTF-8: its words reach a user's error
// message, and through the ABI, where every string is UTF-8.
std::string cut(std::string_view text) {
  constexpr size_t kMax = 1024;
  return base::utf8::sanitize(text.substr(0, kMax)) + (text.size() > kMax ? "..." : "");
}

// An error frame's words: its "error" or "message" string, else the frame.
std::string said_of(const json::object& frame) {
  for (const char* key : {"error", "message", "data"}) {
    if (const auto* v = frame.if_contains(key); v && v->is_string() && !v->as_string().empty()) {
      return cut(v->as_string());
    }
  }
  return cut(json::serialize(frame));
}

}  // namespace

ExecdTerminal::ExecdTerminal(const ExecdPlace& place, std::string id, bool tty, Logger log)
    : id_(std::move(id)),
      log_(log),
      socket_(WebSocket::open(place.endpoint,
                              place.prefix + "/pty/" + id_ + "/ws" + (tty ? "" : "?pty=0"),
                              place.headers, kTimeout)) {
  reader_ = std::thread([this] { read_loop(); });
}

namespace {

WebSocket take_up_socket(const ExecdPlace& place, const std::string& id, bool takeover) {
  try {
    return WebSocket::open(
        place.endpoint,
        place.prefix + "/pty/" + id + "/ws?since=0" + (takeover ? "&takeover=1" : ""),
        place.headers, kTimeout);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find(" 404 ") != std::string::npos) {
      throw Error::not_found("terminal " + id + " not found");
    }
    if (what.find(" 409 ") != std::string::npos) {
      throw Error::failed_precondition("terminal " + id +
                                       " is attached elsewhere (take it over to attach)");
    }
    throw;
  }
}

}  // namespace

ExecdTerminal::ExecdTerminal(const ExecdPlace& place, std::string id, TakeUp take_up, Logger log)
    : id_(std::move(id)), log_(log), socket_(take_up_socket(place, id_, take_up.takeover)) {
  replaying_ = true;
  reader_ = std::thread([this] { read_loop(); });
}

ExecdTerminal::~ExecdTerminal() {
  socket_.shutdown();
  if (reader_.joinable()) reader_.join();
  output_.close();
}

bool ExecdTerminal::gone() const {
  std::lock_guard lock(mutex_);
  return !gone_.empty() && !output_.exit_code();
}

void ExecdTerminal::check_open() const {
  if (output_.exit_code()) {
    throw Error::failed_precondition("terminal " + id_ + " has exited (code " +
                                     std::to_string(*output_.exit_code()) + ")");
  }
}

void ExecdTerminal::write(std::string_view input) {
  {
    std::lock_guard lock(mutex_);
    if (!gone_.empty()) throw Error::failed_precondition(gone_);
  }
  check_open();
  while (!input.empty()) {
    const size_t n = std::min(input.size(), kInputFrame);
    std::string frame(1, '\x00');  // the stdin channel
    frame.append(input.substr(0, n));
    socket_.send_binary(frame);
    input.remove_prefix(n);
  }
}

void ExecdTerminal::resize(uint16_t rows, uint16_t cols) {
  {
    std::lock_guard lock(mutex_);
    if (!gone_.empty()) throw Error::failed_precondition(gone_);
  }
  check_open();
  socket_.send_text(
      json::serialize(json::object{{"type", "resize"}, {"rows", rows}, {"cols", cols}}));
}

void ExecdTerminal::read_loop() {
  std::string why = "terminal " + id_ + ": the server closed its connection";
  std::string said;  // the server's reason for ending it: an error frame's, else the close's
  bool taken_over = false;
  while (auto message = socket_.receive()) {
    if (message->kind == WebSocket::Message::Kind::binary) {
      const std::string& p = message->payload;
      if (p.empty()) continue;
      if (p[0] == '\x01') {
        output_.append(StdStream::out, std::string_view(p).substr(1));
      } else if (p[0] == '\x02') {
        output_.append(StdStream::err, std::string_view(p).substr(1));
      } else if (p[0] == '\x03' && replaying_ && p.size() > 9) {  // offset, then the bytes
        uint64_t offset = 0;
        for (int i = 1; i <= 8; ++i)
          offset = (offset << 8) | static_cast<uint8_t>(p[i]);
        output_.skip_to(offset);  // the agent's ring may start after byte 0
        output_.append(StdStream::out, std::string_view(p).substr(9));
      }
    } else if (message->kind == WebSocket::Message::Kind::text) {
      try {
        const json::object frame = json::parse(message->payload).as_object();
        const auto* type = frame.if_contains("type");
        if (!type || !type->is_string()) continue;
        if (type->as_string() == "exit") {
          output_.exited(static_cast<int32_t>(frame.at("exit_code").to_number<int64_t>()));
          why = "terminal " + id_ + " has exited";
        } else if (type->as_string() == "error") {
          log_.warn("terminal ", id_, ": the server says: ", json::serialize(frame));
          said = said_of(frame);
        }
      } catch (const std::exception& e) {
        log_.warn("terminal ", id_, ": a frame the server sent is not understood: ", e.what());
      }
    } else {  // close
      if (message->close_code == kTakenOver) {
        why = "terminal " + id_ + " was taken over by another client";
        taken_over = true;
      } else if (said.empty() && !message->payload.empty()) {
        said = cut(message->payload);
      }
      break;
    }
  }
  {
    std::lock_guard lock(mutex_);
    gone_ = why;
  }
  if (output_.exit_code()) return;
  if (taken_over) {  // the attachment ends as one taken over here would
    ErrorDetails details;
    details.reason = SBX_REASON_TAKEN_OVER;
    output_.close(Error(SBX_STATUS_FAILED_PRECONDITION, why, std::move(details)));
  } else if (!said.empty()) {  // the server's reason (say, a shell that could not start)
    output_.close(Error::not_found("terminal " + id_ + " was closed by the server: " + said));
  } else {
    output_.close();  // NOT_FOUND
  }
}

std::shared_ptr<ExecdTerminal> ExecdTerminals::add(std::shared_ptr<ExecdTerminal> terminal) {
  std::lock_guard lock(mutex_);
  auto [it, added] = terminals_.try_emplace(terminal->id(), terminal);
  return it->second;
}

std::shared_ptr<ExecdTerminal> ExecdTerminals::find(const std::string& id) const {
  std::lock_guard lock(mutex_);
  const auto it = terminals_.find(id);
  return it == terminals_.end() ? nullptr : it->second;
}

std::shared_ptr<ExecdTerminal> ExecdTerminals::remove(const std::string& id) {
  std::lock_guard lock(mutex_);
  const auto it = terminals_.find(id);
  if (it == terminals_.end()) return nullptr;
  auto terminal = std::move(it->second);
  terminals_.erase(it);
  return terminal;
}

void ExecdTerminals::clear() {
  std::map<std::string, std::shared_ptr<ExecdTerminal>> gone;
  {
    std::lock_guard lock(mutex_);
    gone.swap(terminals_);
  }
  // Destroyed here, outside the lock: each joins its reader.
}

}  // namespace sbx::sdk
