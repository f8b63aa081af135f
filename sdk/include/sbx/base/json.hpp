// Reading JSON configuration with precise errors: every failure names the JSON path of the
// offending value ("$.create.pids_limit: must be >= 1, got 0"), and unknown keys are rejected.
// Layer-neutral (sbx::base): the host reads its config with it, plugins read theirs through
// <sbx/sdk/json.hpp>. Errors are sbx::base::json::Error, which both layers' exception mappers
// report as INVALID_ARGUMENT (sbx/base/exceptions.hpp). THREADING: a reader is used by one thread.
#pragma once

#include <boost/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::base::json {

// What every function here throws for text or values it refuses: the message names the JSON path
// of the offending value. An invalid argument to whoever supplied the JSON.
// The message is kept in a plain std::string (see sdk/error.hpp for why: errors cross threads).
class Error : public std::invalid_argument {
 public:
  explicit Error(std::string message)
      : std::invalid_argument(std::string()), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// Parses `text` as a JSON object. Empty text gives an empty object. Errors throw
// Error("<what>: <reason> at line L, column C"); a key repeated within one
// object is an error too ("<what>: $.a.b: duplicate key"), since keeping one would hide a mistake.
boost::json::object parse_object(std::string_view text, std::string_view what);

// Appends a key to a JSON path: path_join("$.a", "b") == "$.a.b"; keys that are not identifiers
// are quoted: path_join("$", "a b") == "$[\"a b\"]".
std::string path_join(std::string_view path, std::string_view key);
std::string path_index(std::string_view path, size_t index);  // "$.a[3]"

// Reads the members of one JSON object. Each getter marks its key as known; `finish()` then throws
// Error naming the first unknown key and listing the known ones. A key whose
// value is JSON null counts as absent. Type errors name the path, the expected and the actual type.
class ObjectReader {
 public:
  explicit ObjectReader(const boost::json::object& object, std::string path = "$");

  const std::string& path() const noexcept { return path_; }
  std::string path_of(std::string_view key) const { return path_join(path_, key); }

  std::optional<std::string> string(std::string_view key);
  std::string string(std::string_view key, std::string fallback);
  std::optional<bool> boolean(std::string_view key);
  bool boolean(std::string_view key, bool fallback);
  // Integers: a JSON number with no fractional part, within [min, max].
  std::optional<int64_t> integer(std::string_view key, int64_t min = INT64_MIN,
                                 int64_t max = INT64_MAX);
  // Numbers: any JSON number, within [min, max]; `exclusive_min` makes the lower bound strict.
  std::optional<double> number(std::string_view key, double min = -1e308, double max = 1e308,
                               bool exclusive_min = false);
  std::optional<std::vector<std::string>> string_list(std::string_view key);
  std::optional<std::map<std::string, std::string>> string_map(std::string_view key);
  // A nested object; its reader reports paths below this one. Call finish() on it too.
  std::optional<ObjectReader> object(std::string_view key);
  // Any value (marks the key known); nullptr when the key is missing. Unlike the typed getters it
  // returns an explicit JSON null as is, for settings where null means something ("disabled").
  const boost::json::value* value(std::string_view key);

  // Throws for the first key no getter asked for.
  void finish() const;

  // Throws Error("<path of key>: <message>").
  [[noreturn]] void fail(std::string_view key, std::string_view message) const;

 private:
  const boost::json::value* lookup(std::string_view key);

  const boost::json::object* object_;
  std::string path_;
  std::vector<std::string> known_;
};

// "string", "number", "object"... for messages.
std::string_view kind_name(const boost::json::value& value) noexcept;

}  // namespace sbx::base::json
