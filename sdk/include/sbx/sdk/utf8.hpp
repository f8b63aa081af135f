// UTF-8 checks for text that crosses the ABI, for plugins: the layer-neutral functions of
// <sbx/base/utf8.hpp> under sbx::sdk::utf8. THREADING: pure functions.
#pragma once

#include <sbx/base/utf8.hpp>

namespace sbx::sdk {
namespace utf8 = ::sbx::base::utf8;
}  // namespace sbx::sdk
