// sbx::sdk::WebSocket (websocket.hpp): the handshake and RFC 6455's framing, client side (every
// frame masked with a fresh key).

#include <sbx/sdk/websocket.hpp>

#include <array>
#include <random>

namespace sbx::sdk {
namespace {

std::string random_key() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::random_device rd;
  std::array<uint8_t, 16> raw{};
  for (auto& b : raw)
    b = static_cast<uint8_t>(rd());
  std::string out;  // base64 of 16 bytes: 22 characters and "=="
  for (size_t i = 0; i < raw.size(); i += 3) {
    const uint32_t n = (uint32_t{raw[i]} << 16) | (i + 1 < raw.size() ? raw[i + 1] << 8 : 0) |
                       (i + 2 < raw.size() ? raw[i + 2] : 0);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < raw.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < raw.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

}  // namespace

WebSocket WebSocket::open(const Endpoint& endpoint, const std::string& target,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          std::chrono::milliseconds timeout) {
  UpgradedStream::Request request{.method = "GET", .target = target, .protocol = "websocket"};
  request.headers = {{"Sec-WebSocket-Key", random_key()}, {"Sec-WebSocket-Version", "13"}};
  request.headers.insert(request.headers.end(), headers.begin(), headers.end());
  return WebSocket(UpgradedStream::open(endpoint, request, timeout));
}

void WebSocket::send(uint8_t opcode, std::string_view payload) {
  std::string frame;
  frame.reserve(payload.size() + 14);
  frame += static_cast<char>(0x80 | opcode);
  if (payload.size() < 126) {
    frame += static_cast<char>(0x80 | payload.size());
  } else if (payload.size() <= 0xffff) {
    frame += static_cast<char>(0x80 | 126);
    frame += static_cast<char>(payload.size() >> 8);
    frame += static_cast<char>(payload.size() & 0xff);
  } else {
    frame += static_cast<char>(0x80 | 127);
    for (int shift = 56; shift >= 0; shift -= 8)
      frame += static_cast<char>((uint64_t{payload.size()} >> shift) & 0xff);
  }
  thread_local std::mt19937 random(std::random_device{}());
  const uint32_t key = static_cast<uint32_t>(random());
  const char mask[4] = {static_cast<char>(key >> 24), static_cast<char>(key >> 16),
                        static_cast<char>(key >> 8), static_cast<char>(key)};
  frame.append(mask, 4);
  for (size_t i = 0; i < payload.size(); ++i)
    frame += static_cast<char>(payload[i] ^ mask[i & 3]);
  std::lock_guard lock(send_mutex_);
  if (close_sent_) throw Error::unavailable("the WebSocket connection is closing");
  if (opcode == 0x8) close_sent_ = true;
  try {
    stream_.send(frame);
  } catch (const Error&) {
    close_sent_ = true;  // a frame cut short: the stream is shut down
    throw;
  }
}

void WebSocket::close(uint16_t code) {
  const char payload[2] = {static_cast<char>(code >> 8), static_cast<char>(code & 0xff)};
  try {
    send(0x8, std::string_view(payload, 2));
  } catch (const Error&) {  // already closing or gone: nothing more to say
  }
}

void WebSocket::shutdown() noexcept {
  stream_.shutdown();
}

ServerFrameHead parse_server_frame(std::string_view bytes, size_t max_payload) {
  using Verdict = ServerFrameHead::Verdict;
  ServerFrameHead head;
  if (bytes.size() < 2) return head;
  const auto b0 = static_cast<uint8_t>(bytes[0]);
  const auto b1 = static_cast<uint8_t>(bytes[1]);
  head.opcode = b0 & 0x0f;
  const bool fin = (b0 & 0x80) != 0;
  const bool known = head.opcode == 0x1 || head.opcode == 0x2 || head.opcode >= 0x8;
  const bool control = head.opcode >= 0x8;
  if ((b0 & 0x70) != 0 || (b1 & 0x80) != 0 || !fin || !known || (control && head.opcode > 0xA)) {
    head.verdict = Verdict::protocol_error;  // reserved bits, a masked server frame, a fragment
    return head;
  }
  head.header = 2;
  head.length = b1 & 0x7f;
  if (head.length == 126) {
    head.header = 4;
    if (bytes.size() < head.header) return head;
    head.length = (uint64_t{static_cast<uint8_t>(bytes[2])} << 8) | static_cast<uint8_t>(bytes[3]);
  } else if (head.length == 127) {
    head.header = 10;
    if (bytes.size() < head.header) return head;
    head.length = 0;
    for (int i = 0; i < 8; ++i)
      head.length = (head.length << 8) | static_cast<uint8_t>(bytes[2 + i]);
  }
  if (control && head.length > 125) {
    head.verdict = Verdict::protocol_error;
    return head;
  }
  if (head.length > max_payload) {
    head.verdict = Verdict::too_big;
    return head;
  }
  if (bytes.size() - head.header < head.length) return head;
  head.verdict = Verdict::frame;
  return head;
}

std::optional<WebSocket::Message> WebSocket::receive(size_t max_message) {
  for (;;) {
    ServerFrameHead frame;
    for (;;) {
      frame = parse_server_frame(in_, max_message);
      if (frame.verdict != ServerFrameHead::Verdict::incomplete) break;
      if (!stream_.read_some(in_)) return std::nullopt;
    }
    if (frame.verdict == ServerFrameHead::Verdict::protocol_error) {
      close(1002);
      return std::nullopt;
    }
    if (frame.verdict == ServerFrameHead::Verdict::too_big) {
      close(1009);
      return std::nullopt;
    }
    const uint8_t opcode = frame.opcode;
    const size_t header = frame.header;
    const size_t length = static_cast<size_t>(frame.length);
    std::string payload = in_.substr(header, length);
    in_.erase(0, header + length);
    switch (opcode) {
      case 0x1:
        return Message{Message::Kind::text, std::move(payload), 0};
      case 0x2:
        return Message{Message::Kind::binary, std::move(payload), 0};
      case 0x8: {
        Message m{Message::Kind::close, {}, 1005};
        if (payload.size() >= 2) {
          m.close_code = static_cast<uint16_t>((static_cast<uint8_t>(payload[0]) << 8) |
                                               static_cast<uint8_t>(payload[1]));
          m.payload = payload.substr(2);
        }
        close(m.close_code == 1005 ? 1000 : m.close_code);
        stream_.shutdown_write();  // both closes are out: the peer may end the connection now
        return m;
      }
      case 0x9:
        try {
          send(0xA, payload);
        } catch (const Error&) {  // gone: the next read says so
        }
        continue;
      case 0xA:
        continue;
      default:
        close(1002);
        return std::nullopt;
    }
  }
}

}  // namespace sbx::sdk
