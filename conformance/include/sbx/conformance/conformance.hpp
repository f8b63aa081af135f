// The provider conformance suite as a library: the cases every provider plugin must pass, run
// against a provider through the host API (sbx::Host). `sbx conformance` is its command line
// (docs/conformance.md lists the cases and what each checks).
//
//   sbx::conformance::Options options;
//   options.host.plugin_dirs = {"build/plugins"};
//   options.provider = "local_docker";
//   const auto summary = sbx::conformance::run(options);
//
// Every case makes its own sandboxes and closes them; no case depends on another or on the order,
// so any subset runs alone. A case a provider does not offer by its own declaration (an extension
// it does not list, UNIMPLEMENTED for a TTL or a `user`) is reported "not offered", never skipped
// silently.
//
// THREADING: run() blocks the calling thread; cases run one after another on it (a case may use
// threads of its own). The callbacks are called on that thread.
#pragma once

#include <sbx/core/host.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::conformance {

struct CaseInfo {
  std::string name;         // stable id, e.g. "files.modes"
  std::string description;  // what it checks, one sentence
  std::string offered_if;   // the declaration that makes it "not offered"; empty: always run
};

// Every case, in the suite's order.
const std::vector<CaseInfo>& cases();

// True when `name` is selected by `pattern`: a glob (fnmatch, with * ? [...]) over the whole name
// when the pattern holds one of "*?[", else a substring; both case-insensitive. An empty pattern
// selects everything.
bool matches(std::string_view pattern, std::string_view name);
// Whether a run with --only `only` and --skip `skip` takes the case `name`: `only` matches it
// (an empty one matches every case) and `skip` does not (an empty one matches none).
bool selected_by(std::string_view only, std::string_view skip, std::string_view name);

enum class Outcome { passed, failed, not_offered };
std::string_view to_string(Outcome outcome) noexcept;  // "ok", "FAILED", "not offered"

struct CaseResult {
  std::string name;
  Outcome outcome = Outcome::passed;
  std::vector<std::string> failures;  // one line each ("cases_files.cpp:42: ..."), when failed
  std::string reason;                 // why not offered
  double seconds = 0;
};

struct Summary {
  std::string provider;
  std::vector<CaseResult> results;
  int passed = 0;
  int failed = 0;
  int not_offered = 0;
  double seconds = 0;

  bool ok() const { return failed == 0; }
};

struct Options {
  Host::Options host;    // how the suite makes its hosts (one per run; a second for connect)
  std::string provider;  // a config block name or a provider id
  std::optional<std::string> image;  // image of every sandbox; unset: the provider's default
  std::string only;                  // case selection (matches()); empty: every case
  std::string skip;                  // cases left out (matches()); empty: none
  uint64_t shuffle_seed = 0;  // 0: the suite's order; else cases in an order drawn from the seed
  std::function<void(const CaseInfo&)> on_start;     // before a case runs
  std::function<void(const CaseResult&)> on_result;  // after it
};

// Runs the selected cases. Throws what the host throws when the provider cannot be had at all
// (an unknown name: InvalidArgumentError; a plugin that does not load: PluginLoadError), and
// InvalidArgumentError when `only` and `skip` leave no case; every other failure is a case's
// result.
Summary run(const Options& options);

// The summary as a JUnit XML document (one <testsuite>, a <testcase> per case run; a failed case
// has a <failure>, a case not offered a <skipped> with the reason).
std::string junit_xml(const Summary& summary);

}  // namespace sbx::conformance
