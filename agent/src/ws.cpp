// WebSocket pieces (ws.hpp): SHA-1, base64, frames.
#include "ws.hpp"

#include <cstring>

namespace sbx::agent::ws {

namespace {

uint32_t rotl(uint32_t x, int n) {
  return (x << n) | (x >> (32 - n));
}

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::array<uint8_t, 20> sha1(std::string_view data) {
  uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
  // The message, the 0x80 byte, zeros to 56 mod 64, then the length in bits (64-bit big-endian).
  std::string m(data);
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  m += static_cast<char>(0x80);
  while (m.size() % 64 != 56)
    m += '\0';
  for (int shift = 56; shift >= 0; shift -= 8)
    m += static_cast<char>((bits >> shift) & 0xff);
  for (std::size_t block = 0; block < m.size(); block += 64) {
    uint32_t w[80];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(m.data() + block + 4 * i);
      w[i] = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    }
    for (int i = 16; i < 80; ++i)
      w[i] = rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; ++i) {
      uint32_t f = 0, k = 0;
      if (i < 20) {
        f = (b & c) | (~b & d);
        k = 0x5A827999;
      } else if (i < 40) {
        f = b ^ c ^ d;
        k = 0x6ED9EBA1;
      } else if (i < 60) {
        f = (b & c) | (b & d) | (c & d);
        k = 0x8F1BBCDC;
      } else {
        f = b ^ c ^ d;
        k = 0xCA62C1D6;
      }
      const uint32_t t = rotl(a, 5) + f + e + k + w[i];
      e = d;
      d = c;
      c = rotl(b, 30);
      b = a;
      a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
  }
  std::array<uint8_t, 20> out{};
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j)
      out[4 * i + j] = static_cast<uint8_t>(h[i] >> (24 - 8 * j));
  return out;
}

std::string base64(std::string_view data) {
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= data.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<unsigned char>(data[i])} << 16) |
                       (uint32_t{static_cast<unsigned char>(data[i + 1])} << 8) |
                       static_cast<unsigned char>(data[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < data.size()) {
    uint32_t v = uint32_t{static_cast<unsigned char>(data[i])} << 16;
    if (i + 1 < data.size()) v |= uint32_t{static_cast<unsigned char>(data[i + 1])} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < data.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

bool valid_key(std::string_view key) {
  // 16 bytes are 22 base64 characters and "==", the last character carrying 2 bits (A, Q, g, w).
  if (key.size() != 24 || key[22] != '=' || key[23] != '=') return false;
  for (std::size_t i = 0; i < 22; ++i)
    if (key[i] == '=' || std::strchr(kAlphabet, key[i]) == nullptr) return false;
  return std::string_view("AQgw").find(key[21]) != std::string_view::npos;
}

std::string accept_key(std::string_view key) {
  std::string text(key);
  text += "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  const auto digest = sha1(text);
  return base64(std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

std::string frame(uint8_t opcode, std::string_view payload) {
  std::string f;
  f.reserve(payload.size() + 10);
  f += static_cast<char>(0x80 | (opcode & 0x0f));
  const uint64_t n = payload.size();
  if (n < 126) {
    f += static_cast<char>(n);
  } else if (n <= 0xffff) {
    f += static_cast<char>(126);
    f += static_cast<char>((n >> 8) & 0xff);
    f += static_cast<char>(n & 0xff);
  } else {
    f += static_cast<char>(127);
    for (int shift = 56; shift >= 0; shift -= 8)
      f += static_cast<char>((n >> shift) & 0xff);
  }
  f += payload;
  return f;
}

std::string close_payload(uint16_t code, std::string_view reason) {
  std::string p;
  p += static_cast<char>(code >> 8);
  p += static_cast<char>(code & 0xff);
  p += reason.substr(0, 123);
  return p;
}

Parser::Result Parser::next(std::string_view all, std::size_t& pos, Frame& out) {
  const std::string_view in = all.substr(pos);
  auto fail = [&](uint16_t code, const char* reason) {
    error_code = code;
    error_reason = reason;
    return Result::error;
  };
  if (in.size() < 2) return Result::need_more;
  const auto b0 = static_cast<unsigned char>(in[0]);
  const auto b1 = static_cast<unsigned char>(in[1]);
  const bool fin = (b0 & 0x80) != 0;
  const uint8_t opcode = b0 & 0x0f;
  if (b0 & 0x70) return fail(1002, "reserved bits set (no extension was negotiated)");
  if (!(b1 & 0x80)) return fail(1002, "a client frame must be masked");
  const bool control = (opcode & 0x08) != 0;
  if (opcode != kText && opcode != kBinary && opcode != kClose && opcode != kPing &&
      opcode != kPong) {
    if (opcode == kContinuation) return fail(1002, "fragmented messages are not supported");
    return fail(1002, "unknown opcode");
  }
  if (!fin) {
    return fail(1002, control ? "a control frame must not be fragmented"
                              : "fragmented messages are not supported");
  }
  uint64_t len = b1 & 0x7f;
  std::size_t at = 2;
  if (len == 126) {
    if (in.size() < 4) return Result::need_more;
    len = (uint64_t{static_cast<unsigned char>(in[2])} << 8) | static_cast<unsigned char>(in[3]);
    at = 4;
  } else if (len == 127) {
    if (in.size() < 10) return Result::need_more;
    len = 0;
    for (int i = 0; i < 8; ++i)
      len = (len << 8) | static_cast<unsigned char>(in[2 + i]);
    at = 10;
  }
  if (control && len > 125) return fail(1002, "a control frame's payload is at most 125 bytes");
  if (len > max_payload_) return fail(1009, "frame too large");
  if (in.size() < at + 4 + len) return Result::need_more;
  unsigned char mask[4];
  std::memcpy(mask, in.data() + at, 4);
  at += 4;
  out.opcode = opcode;
  out.payload.assign(in.substr(at, static_cast<std::size_t>(len)));
  for (std::size_t i = 0; i < out.payload.size(); ++i)
    out.payload[i] = static_cast<char>(static_cast<unsigned char>(out.payload[i]) ^ mask[i % 4]);
  pos += at + static_cast<std::size_t>(len);
  return Result::frame;
}

Parser::Result Parser::next(std::string& in, Frame& out) {
  std::size_t pos = 0;
  const Result r = next(in, pos, out);
  in.erase(0, pos);
  return r;
}

}  // namespace sbx::agent::ws
