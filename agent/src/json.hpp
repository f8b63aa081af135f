// A tiny JSON reader and writer, enough for the agent's request bodies and events (agent/README.md
// says why it is not Boost.JSON: size). Header-only; every function is pure and reentrant.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::agent::json {

/// A parsed JSON value. Owns its children; a plain value type, not shared between threads by the
/// agent (any thread may use its own values).
struct Value {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0;         ///< the number as a double
  bool integral = false;     ///< the number was written without fraction or exponent
  int64_t integer = 0;       ///< the number, when integral and within int64
  bool integer_ok = false;   ///< `integer` holds the exact value
  std::string text;          ///< a string's decoded UTF-8
  std::vector<Value> items;  ///< an array's elements
  std::vector<std::pair<std::string, Value>> members;  ///< an object's members, in order

  /// The member named `name` of an object (the last one if repeated), or nullptr. Does not own.
  const Value* find(std::string_view name) const {
    const Value* found = nullptr;
    if (kind != Kind::object) return nullptr;
    for (const auto& [k, v] : members)
      if (k == name) found = &v;
    return found;
  }
};

namespace detail {

/// Appends code point `cp` to `out` as UTF-8. Pure.
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// A recursive-descent parser over one input; used once per parse() call, on one thread.
class Parser {
 public:
  /// Reads `in`, which must outlive the parser.
  explicit Parser(std::string_view in) : in_(in) {}

  /// Parses the whole input into `out`; false (and `error` says why) when it is not one JSON value.
  bool parse(Value& out, std::string& error) {
    if (!value(out, 0)) {
      error = error_.empty() ? "invalid JSON" : error_;
      return false;
    }
    skip_ws();
    if (pos_ != in_.size()) {
      error = "invalid JSON: trailing characters at offset " + std::to_string(pos_);
      return false;
    }
    return true;
  }

 private:
  static constexpr int kMaxDepth = 64;

  bool fail(const char* why) {
    if (error_.empty())
      error_ = std::string("invalid JSON: ") + why + " at offset " + std::to_string(pos_);
    return false;
  }
  void skip_ws() {
    while (pos_ < in_.size() &&
           (in_[pos_] == ' ' || in_[pos_] == '\t' || in_[pos_] == '\n' || in_[pos_] == '\r'))
      ++pos_;
  }
  bool literal(std::string_view word) {
    if (in_.substr(pos_, word.size()) != word) return fail("unexpected word");
    pos_ += word.size();
    return true;
  }
  bool value(Value& out, int depth) {
    if (depth > kMaxDepth) return fail("nesting too deep");
    skip_ws();
    if (pos_ >= in_.size()) return fail("unexpected end");
    const char c = in_[pos_];
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') {
      out.kind = Value::Kind::string;
      return string(out.text);
    }
    if (c == 't' || c == 'f') {
      out.kind = Value::Kind::boolean;
      out.boolean = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      out.kind = Value::Kind::null;
      return literal("null");
    }
    return number(out);
  }
  bool object(Value& out, int depth) {
    out.kind = Value::Kind::object;
    ++pos_;
    skip_ws();
    if (pos_ < in_.size() && in_[pos_] == '}') {
      ++pos_;
      return true;
    }
    for (;;) {
      skip_ws();
      if (pos_ >= in_.size() || in_[pos_] != '"') return fail("expected a member name");
      std::string name;
      if (!string(name)) return false;
      skip_ws();
      if (pos_ >= in_.size() || in_[pos_] != ':') return fail("expected ':'");
      ++pos_;
      Value v;
      if (!value(v, depth + 1)) return false;
      out.members.emplace_back(std::move(name), std::move(v));
      skip_ws();
      if (pos_ < in_.size() && in_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < in_.size() && in_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }
  bool array(Value& out, int depth) {
    out.kind = Value::Kind::array;
    ++pos_;
    skip_ws();
    if (pos_ < in_.size() && in_[pos_] == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      Value v;
      if (!value(v, depth + 1)) return false;
      out.items.push_back(std::move(v));
      skip_ws();
      if (pos_ < in_.size() && in_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < in_.size() && in_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }
  bool hex4(uint32_t& cp) {
    if (pos_ + 4 > in_.size()) return fail("short \\u escape");
    cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = in_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') {
        cp |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        cp |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        cp |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        return fail("bad \\u escape");
      }
    }
    return true;
  }
  bool string(std::string& out) {
    ++pos_;  // the opening quote
    for (;;) {
      if (pos_ >= in_.size()) return fail("unterminated string");
      const char c = in_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= in_.size()) return fail("unterminated escape");
      const char e = in_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && in_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            uint32_t low = 0;
            if (!hex4(low)) return false;
            if (low >= 0xDC00 && low < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              append_utf8(out, 0xFFFD);
              cp = low;
            }
          }
          if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;  // a lone surrogate
          append_utf8(out, cp);
          break;
        }
        default:
          return fail("bad escape");
      }
    }
  }
  bool number(Value& out) {
    const std::size_t start = pos_;
    if (pos_ < in_.size() && in_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < in_.size() && in_[pos_] >= '0' && in_[pos_] <= '9')
        ++pos_;
      return pos_ > from;
    };
    if (!digits()) return fail("unexpected character");
    bool integral = true;
    if (pos_ < in_.size() && in_[pos_] == '.') {
      ++pos_;
      integral = false;
      if (!digits()) return fail("bad number");
    }
    if (pos_ < in_.size() && (in_[pos_] == 'e' || in_[pos_] == 'E')) {
      ++pos_;
      integral = false;
      if (pos_ < in_.size() && (in_[pos_] == '+' || in_[pos_] == '-')) ++pos_;
      if (!digits()) return fail("bad number");
    }
    const std::string text(in_.substr(start, pos_ - start));
    out.kind = Value::Kind::number;
    out.integral = integral;
    out.number = std::strtod(text.c_str(), nullptr);
    if (integral) {
      // Exact for every int64: accumulate with an overflow check instead of going through double.
      bool negative = text[0] == '-';
      uint64_t magnitude = 0;
      bool overflow = false;
      for (std::size_t i = negative ? 1 : 0; i < text.size(); ++i) {
        const uint64_t d = static_cast<uint64_t>(text[i] - '0');
        if (magnitude > (UINT64_MAX - d) / 10) {
          overflow = true;
          break;
        }
        magnitude = magnitude * 10 + d;
      }
      const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
      if (!overflow && magnitude <= limit) {
        out.integer_ok = true;
        out.integer =
            negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
      }
    }
    return true;
  }

  std::string_view in_;
  std::size_t pos_ = 0;
  std::string error_;
};

}  // namespace detail

/// Parses `text` as one JSON value into `out`; false with `error` set when it is not. Reentrant.
inline bool parse(std::string_view text, Value& out, std::string& error) {
  return detail::Parser(text).parse(out, error);
}

/// Appends `s` to `out` as a quoted JSON string. Bytes that are not valid UTF-8 become U+FFFD (as
/// Go's encoder, hence execd, does), so any command output yields valid JSON. Reentrant.
inline void append_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (c < 0x20 || c == 0x7F) {
            out += "\\u00";
            out += kHex[c >> 4];
            out += kHex[c & 0xF];
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A multi-byte sequence: copy it when well-formed (no overlongs, no surrogates, <= U+10FFFF).
    std::size_t len = 0;
    uint32_t min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      min = 0x10000;
    }
    bool ok = len != 0 && i + len <= s.size();
    uint32_t cp = len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    if (ok && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))) ok = false;
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  out += '"';
}

/// `s` as a quoted JSON string (see append_string). Reentrant.
inline std::string quote(std::string_view s) {
  std::string out;
  append_string(out, s);
  return out;
}

}  // namespace sbx::agent::json
