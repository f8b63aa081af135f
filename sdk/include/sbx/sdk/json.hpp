// Reading JSON configuration with precise errors, for plugins: sbx::sdk::json is the layer-neutral
// reader of <sbx/base/json.hpp> (the host reads its own config with the same code). Its errors are
// sbx::sdk::json::Error (an std::invalid_argument whose message names the JSON path); the SDK
// reports one that leaves a provider as SBX_STATUS_INVALID_ARGUMENT, as it would
// sdk::Error::invalid_argument. THREADING: a reader is used by one thread.
#pragma once

#include <sbx/base/json.hpp>
#include <sbx/sdk/error.hpp>

namespace sbx::sdk {
namespace json = ::sbx::base::json;
}  // namespace sbx::sdk
