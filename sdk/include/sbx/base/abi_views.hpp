// Views between the C ABI's borrowed strings and bytes and the standard library's types, used on
// both sides of the ABI (host and SDK). Layer-neutral (sbx::base). THREADING: pure functions.
// OWNERSHIP: a view borrows; it is valid as long as what it views.
#pragma once

#include <sbx/abi/types.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::base {

// The text an sbx_str views; "" for a NULL data pointer (a view whose data() is not NULL, so that
// to_sbx(view(s)) never turns a present empty string into an absent one).
inline std::string_view view(sbx_str s) {
  return s.data ? std::string_view(s.data, s.len) : std::string_view("", 0);
}
// A copy; "" for NULL.
inline std::string copy_of(sbx_str s) {
  return std::string(view(s));
}
// A copy, or nullopt for NULL (the ABI's "absent").
inline std::optional<std::string> optional_string(sbx_str s) {
  if (!s.data) return std::nullopt;
  return std::string(s.data, s.len);
}
// An sbx_str borrowing `s`.
inline sbx_str to_sbx(std::string_view s) {
  return sbx_str{s.data(), s.size()};
}
// {NULL, 0} when absent.
inline sbx_str optional_view(const std::optional<std::string>& s) {
  return s ? to_sbx(*s) : sbx_str{nullptr, 0};
}
// An sbx_bytes borrowing `s`.
inline sbx_bytes to_bytes(std::string_view s) {
  return sbx_bytes{reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
// The bytes an sbx_bytes views; empty for NULL.
inline std::string_view view(sbx_bytes b) {
  return b.data ? std::string_view(reinterpret_cast<const char*>(b.data), b.len)
                : std::string_view();
}

// A copy of an sbx_kv_list; a key given twice keeps its last value.
inline std::map<std::string, std::string> copy_of(sbx_kv_list list) {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < list.count; ++i) {
    out.insert_or_assign(copy_of(list.items[i].key), copy_of(list.items[i].value));
  }
  return out;
}

// sbx_kv entries viewing a map, for handing out an sbx_kv_list. The map must outlive the view and
// stay unchanged while the list is in use.
class KvListView {
 public:
  explicit KvListView(const std::map<std::string, std::string>& values) {
    items_.reserve(values.size());
    for (const auto& [k, v] : values)
      items_.push_back({to_sbx(k), to_sbx(v)});
  }
  sbx_kv_list list() const { return {items_.data(), items_.size()}; }

 private:
  std::vector<sbx_kv> items_;
};

}  // namespace sbx::base
