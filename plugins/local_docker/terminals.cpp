// local_docker's terminals through the agent's WebSocket (terminals.hpp).

#include "terminals.hpp"

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <chrono>

namespace sbx::local_docker {

namespace json = boost::json;

namespace {

constexpr std::chrono::milliseconds kTimeout{10'000};  // the handshake, and one frame's send
constexpr size_t kInputFrame = 64 * 1024;
// The agent's close code for an attachment another client took over (agent/README.md).
constexpr uint16_t kTakenOver = 4001;

}  // namespace

AgentTerminal::AgentTerminal(const std::string& socket, std::string id, bool tty, sdk::Logger log)
    : id_(std::move(id)),
      log_(log),
      socket_(sdk::WebSocket::open({.unix_socket = socket},
                                   "/pty/" + id_ + "/ws" + (tty ? "" : "?pty=0"), {}, kTimeout)) {
  reader_ = std::thread([this] { read_loop(); });
}

AgentTerminal::~AgentTerminal() {
  socket_.shutdown();
  if (reader_.joinable()) reader_.join();
  output_.close();
}

void AgentTerminal::check_open() const {
  if (output_.exit_code()) {
    throw sdk::Error::failed_precondition("terminal " + id_ + " has exited (code " +
                                          std::to_string(*output_.exit_code()) + ")");
  }
}

void AgentTerminal::write(std::string_view input) {
  {
    std::lock_guard lock(mutex_);
    if (!gone_.empty()) throw sdk::Error::failed_precondition(gone_);
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

void AgentTerminal::resize(uint16_t rows, uint16_t cols) {
  {
    std::lock_guard lock(mutex_);
    if (!gone_.empty()) throw sdk::Error::failed_precondition(gone_);
  }
  check_open();
  socket_.send_text(
      json::serialize(json::object{{"type", "resize"}, {"rows", rows}, {"cols", cols}}));
}

void AgentTerminal::read_loop() {
  std::string why = "terminal " + id_ + ": the sandbox's agent closed its connection";
  while (auto message = socket_.receive()) {
    if (message->kind == sdk::WebSocket::Message::Kind::binary) {
      const std::string& p = message->payload;
      if (p.empty()) continue;
      if (p[0] == '\x01') {
        output_.append(sdk::StdStream::out, std::string_view(p).substr(1));
      } else if (p[0] == '\x02') {
        output_.append(sdk::StdStream::err, std::string_view(p).substr(1));
      }  // 0x03 (replay) only answers a `since`, which this attach never sends
    } else if (message->kind == sdk::WebSocket::Message::Kind::text) {
      try {
        const json::object frame = json::parse(message->payload).as_object();
        const auto* type = frame.if_contains("type");
        if (!type || !type->is_string()) continue;
        if (type->as_string() == "exit") {
          output_.exited(static_cast<int32_t>(frame.at("exit_code").to_number<int64_t>()));
          why = "terminal " + id_ + " has exited";
        } else if (type->as_string() == "error") {
          log_.warn("terminal ", id_, ": the agent says: ", json::serialize(frame));
        }
      } catch (const std::exception& e) {
        log_.warn("terminal ", id_, ": a frame the agent sent is not understood: ", e.what());
      }
    } else {  // close
      if (message->close_code == kTakenOver) {
        why = "terminal " + id_ + " was taken over by another client of the sandbox's agent";
      }
      break;
    }
  }
  {
    std::lock_guard lock(mutex_);
    gone_ = why;
  }
  if (!output_.exit_code()) output_.close();  // the attachment: NOT_FOUND
}

void Terminals::add(std::shared_ptr<AgentTerminal> terminal) {
  std::lock_guard lock(mutex_);
  terminals_[terminal->id()] = std::move(terminal);
}

std::shared_ptr<AgentTerminal> Terminals::find(const std::string& id) const {
  std::lock_guard lock(mutex_);
  const auto it = terminals_.find(id);
  if (it == terminals_.end()) throw sdk::Error::not_found("terminal " + id + " not found");
  return it->second;
}

std::shared_ptr<AgentTerminal> Terminals::remove(const std::string& id) {
  std::lock_guard lock(mutex_);
  const auto it = terminals_.find(id);
  if (it == terminals_.end()) throw sdk::Error::not_found("terminal " + id + " not found");
  auto terminal = std::move(it->second);
  terminals_.erase(it);
  return terminal;
}

void Terminals::clear() {
  std::map<std::string, std::shared_ptr<AgentTerminal>> gone;
  {
    std::lock_guard lock(mutex_);
    gone.swap(terminals_);
  }
  // Destroyed here, outside the lock: each joins its reader.
}

}  // namespace sbx::local_docker
