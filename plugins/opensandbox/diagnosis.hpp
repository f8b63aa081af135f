// Why a sandbox stopped answering: after a command meets 502s (the server's proxy reached no
// execd), the sandbox's lifecycle status is read for a few seconds in case it says the sandbox was
// OOM-killed, so the caller learns that instead of "backend unreachable" (the seed's post-502
// diagnosis). Asynchronous: it runs on the lifecycle client's loop and holds no thread.
#pragma once

#include "lifecycle.hpp"

#include <sbx/sdk/cancel.hpp>
#include <sbx/sdk/error.hpp>
#include <sbx/sdk/log.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace sbx::opensandbox {

// Whether an exec error is one the diagnosis is for: a 502 answer, or the give-up after 502s.
bool is_backend_502(const sdk::Error& error);

// The error to report for a sandbox whose status reads `status`: "Sandbox was OOM-killed. ..."
// (UNAVAILABLE, not retryable) when its reason or message says it ran out of memory (`oom
// killed`, `OOMKilled`, `oom_killed`, `out of memory`; any case), else nullopt.
std::optional<sdk::Error> oom_error(const SandboxStatusInfo& status, const std::string& sandbox_id);

// Reads the sandbox's status for up to `budget` (each read bounded by min(2 s, what is left),
// 0.5 s apart) and calls `done` once, on the lifecycle loop or the calling thread: with the OOM
// error when a read says so, else with `original` (also when a read fails, or the status shows a
// stopped or failed sandbox with a message that is not about memory).
// A cancellation through `cancel` ends it with CANCELLED at the next read's end (at most 2 s).
void diagnose_after_502(LifecycleClient& lifecycle, const std::string& sandbox_id,
                        sdk::Error original, std::function<void(const sdk::Error&)> done,
                        sdk::CancelToken cancel,
                        std::chrono::milliseconds budget = std::chrono::seconds(5));

}  // namespace sbx::opensandbox
