#include <sbx/base/json.hpp>

#include <boost/json/basic_parser_impl.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace sbx::base::json {
namespace {

bool is_identifier(std::string_view key) {
  if (key.empty()) return false;
  auto word_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  if (key.front() >= '0' && key.front() <= '9') return false;
  return std::all_of(key.begin(), key.end(), word_char);
}

// Shortest text that reads back as the same double ("0.5", "30", "1e+20").
std::string format_number(double value) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

// "line L, column C" (both 1-based) of a byte offset in `text`.
std::string position_of(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

std::string type_error(std::string_view expected, const boost::json::value& got) {
  return "expected " + std::string(expected) + ", got " + std::string(kind_name(got));
}

// Finds the first key repeated within one object. Boost.JSON's parser quietly keeps the last of
// duplicate keys; in a configuration that hides a mistake, so parse_object refuses them. A SAX
// handler for boost::json::basic_parser that tracks the JSON path as it goes.
class DuplicateKeyFinder {
 public:
  static constexpr std::size_t max_object_size = std::size_t(-1);
  static constexpr std::size_t max_array_size = std::size_t(-1);
  static constexpr std::size_t max_key_size = std::size_t(-1);
  static constexpr std::size_t max_string_size = std::size_t(-1);

  std::optional<std::string> duplicate;  // the JSON path of the repeated key

  bool on_document_begin(boost::system::error_code&) { return true; }
  bool on_document_end(boost::system::error_code&) { return true; }
  bool on_object_begin(boost::system::error_code&) { return open(true); }
  bool on_object_end(std::size_t, boost::system::error_code&) { return close(); }
  bool on_array_begin(boost::system::error_code&) { return open(false); }
  bool on_array_end(std::size_t, boost::system::error_code&) { return close(); }
  bool on_key_part(boost::json::string_view part, std::size_t, boost::system::error_code&) {
    key_.append(part.data(), part.size());
    return true;
  }
  bool on_key(boost::json::string_view part, std::size_t, boost::system::error_code& ec) {
    key_.append(part.data(), part.size());
    Frame& frame = frames_.back();
    frame.key = std::move(key_);
    key_.clear();
    if (!frame.keys.insert(frame.key).second) {
      duplicate = path();
      ec = boost::json::error::syntax;  // stops the parse; `duplicate` says why
      return false;
    }
    return true;
  }
  bool on_string_part(boost::json::string_view, std::size_t, boost::system::error_code&) {
    return true;
  }
  bool on_string(boost::json::string_view, std::size_t, boost::system::error_code&) {
    return value();
  }
  bool on_number_part(boost::json::string_view, boost::system::error_code&) { return true; }
  bool on_int64(int64_t, boost::json::string_view, boost::system::error_code&) { return value(); }
  bool on_uint64(uint64_t, boost::json::string_view, boost::system::error_code&) { return value(); }
  bool on_double(double, boost::json::string_view, boost::system::error_code&) { return value(); }
  bool on_bool(bool, boost::system::error_code&) { return value(); }
  bool on_null(boost::system::error_code&) { return value(); }
  bool on_comment_part(boost::json::string_view, boost::system::error_code&) { return true; }
  bool on_comment(boost::json::string_view, boost::system::error_code&) { return true; }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;   // objects: the member being read
    size_t index = 0;  // arrays: the element being read
  };
  bool open(bool object) {
    frames_.push_back({object, {}, {}, 0});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return value();
  }
  // A value ended: an array moves on to its next element.
  bool value() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
    return true;
  }
  std::string path() const {
    std::string out = "$";
    for (const Frame& f : frames_)
      out = f.object ? path_join(out, f.key) : path_index(out, f.index);
    return out;
  }

  std::vector<Frame> frames_;
  std::string key_;
};

}  // namespace

boost::json::object parse_object(std::string_view text, std::string_view what) {
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  if (std::all_of(text.begin(), text.end(), blank)) return {};

  boost::json::parser parser;
  boost::system::error_code ec;
  // write_some() stops at the first error, so its count is the error's offset. It also stops after
  // a complete value; what follows must be whitespace.
  size_t consumed = parser.write_some(text.data(), text.size(), ec);
  if (!ec) {
    size_t rest = consumed;
    while (rest < text.size() && blank(text[rest]))
      ++rest;
    if (rest < text.size()) {
      ec = boost::json::error::extra_data;
      consumed = rest;
    }
  }
  if (ec) {
    throw Error(std::string(what) + ": " + ec.message() + " at " + position_of(text, consumed));
  }
  boost::json::basic_parser<DuplicateKeyFinder> keys{boost::json::parse_options{}};
  keys.write_some(false, text.data(), text.size(), ec);
  if (keys.handler().duplicate) {
    throw Error(std::string(what) + ": " + *keys.handler().duplicate + ": duplicate key");
  }
  boost::json::value value = parser.release();
  if (!value.is_object()) {
    throw Error(std::string(what) + ": " + type_error("an object", value) + " at the top level");
  }
  return std::move(value.as_object());
}

std::string path_join(std::string_view path, std::string_view key) {
  if (is_identifier(key)) return std::string(path) + "." + std::string(key);
  return std::string(path) + "[" + boost::json::serialize(boost::json::string(key)) + "]";
}

std::string path_index(std::string_view path, size_t index) {
  return std::string(path) + "[" + std::to_string(index) + "]";
}

std::string_view kind_name(const boost::json::value& value) noexcept {
  switch (value.kind()) {
    case boost::json::kind::null:
      return "null";
    case boost::json::kind::bool_:
      return "boolean";
    case boost::json::kind::int64:
    case boost::json::kind::uint64:
    case boost::json::kind::double_:
      return "number";
    case boost::json::kind::string:
      return "string";
    case boost::json::kind::array:
      return "array";
    case boost::json::kind::object:
      return "object";
  }
  return "unknown";
}

ObjectReader::ObjectReader(const boost::json::object& object, std::string path)
    : object_(&object), path_(std::move(path)) {}

const boost::json::value* ObjectReader::value(std::string_view key) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.emplace_back(key);
  return object_->if_contains(key);
}

const boost::json::value* ObjectReader::lookup(std::string_view key) {
  const boost::json::value* found = value(key);
  return found && !found->is_null() ? found : nullptr;
}

void ObjectReader::fail(std::string_view key, std::string_view message) const {
  throw Error(path_of(key) + ": " + std::string(message));
}

std::optional<std::string> ObjectReader::string(std::string_view key) {
  const auto* v = lookup(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) fail(key, type_error("a string", *v));
  return std::string(v->get_string());
}

std::string ObjectReader::string(std::string_view key, std::string fallback) {
  auto v = string(key);
  return v ? std::move(*v) : std::move(fallback);
}

std::optional<bool> ObjectReader::boolean(std::string_view key) {
  const auto* v = lookup(key);
  if (!v) return std::nullopt;
  if (!v->is_bool()) fail(key, type_error("a boolean", *v));
  return v->get_bool();
}

bool ObjectReader::boolean(std::string_view key, bool fallback) {
  return boolean(key).value_or(fallback);
}

std::optional<int64_t> ObjectReader::integer(std::string_view key, int64_t min, int64_t max) {
  const auto* v = lookup(key);
  if (!v) return std::nullopt;
  auto out_of_range = [&](const std::string& got) {
    bool has_min = min != INT64_MIN, has_max = max != INT64_MAX;
    std::string bound = has_min && has_max
                            ? "between " + std::to_string(min) + " and " + std::to_string(max)
                        : has_min ? ">= " + std::to_string(min)
                        : has_max ? "<= " + std::to_string(max)
                                  : "a 64-bit integer";
    fail(key, "must be " + bound + ", got " + got);
  };
  int64_t result = 0;
  if (v->is_int64()) {
    result = v->get_int64();
  } else if (v->is_uint64()) {  // only values above INT64_MAX are stored as uint64
    out_of_range(std::to_string(v->get_uint64()));
  } else if (v->is_double()) {
    // 1e3 is an integer written as a double; 1.5 and 1e30 are not representable.
    double d = v->get_double();
    if (d != std::trunc(d)) fail(key, "expected an integer, got " + format_number(d));
    if (d < -0x1p63 || d >= 0x1p63) out_of_range(format_number(d));
    result = static_cast<int64_t>(d);
  } else {
    fail(key, type_error("an integer", *v));
  }
  if (result < min || result > max) out_of_range(std::to_string(result));
  return result;
}

std::optional<double> ObjectReader::number(std::string_view key, double min, double max,
                                           bool exclusive_min) {
  const auto* v = lookup(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) fail(key, type_error("a number", *v));
  double d = v->to_number<double>();
  if (exclusive_min ? !(d > min) : !(d >= min)) {
    fail(key, std::string(exclusive_min ? "must be > " : "must be >= ") + format_number(min) +
                  ", got " + format_number(d));
  }
  if (!(d <= max)) fail(key, "must be <= " + format_number(max) + ", got " + format_number(d));
  return d;
}

std::optional<std::vector<std::string>> ObjectReader::string_list(std::string_view key) {
  const auto* v = lookup(key);
  if (!v) return std::nullopt;
  if (!v->is_array()) fail(key, type_error("an array of strings", *v));
  std::vector<std::string> result;
  const auto& array = v->get_array();
  for (size_t i = 0; i < array.size(); ++i) {
    if (!array[i].is_string()) {
      throw Error(path_index(path_of(key), i) + ": " + type_error("a string", array[i]));
    }
    result.emplace_back(array[i].get_string());
  }
  return result;
}

std::optional<std::map<std::string, std::string>> ObjectReader::string_map(std::string_view key) {
  const auto* v = lookup(key);
  if (!v) return std::nullopt;
  if (!v->is_object()) fail(key, type_error("an object of strings", *v));
  std::map<std::string, std::string> result;
  for (const auto& member : v->get_object()) {
    if (!member.value().is_string()) {
      throw Error(path_join(path_of(key), member.key()) + ": " +
                  type_error("a string", member.value()));
    }
    result.emplace(member.key(), member.value().get_string());
  }
  return result;
}

std::optional<ObjectReader> ObjectReader::object(std::string_view key) {
  const auto* v = lookup(key);
  if (!v) return std::nullopt;
  if (!v->is_object()) fail(key, type_error("an object", *v));
  return ObjectReader(v->get_object(), path_of(key));
}

void ObjectReader::finish() const {
  for (const auto& member : *object_) {
    if (std::find(known_.begin(), known_.end(), member.key()) != known_.end()) continue;
    std::string known;
    for (const auto& k : known_)
      known += (known.empty() ? "" : ", ") + k;
    fail(member.key(), known.empty() ? "unknown key; this object takes no keys"
                                     : "unknown key; known keys: " + known);
  }
}

}  // namespace sbx::base::json
