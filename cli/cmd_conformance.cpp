// sbx conformance: the provider conformance suite (conformance) against one provider.
// Exit status: 0 when every case passed or is not offered, 1 when a case failed, 2 for usage
// errors (an unknown provider, an --only/--skip that leaves nothing), 74 when the --junit file
// cannot be written, 125 when the provider cannot be used at all (its plugin does not load).

#include "commands.hpp"
#include "shared.hpp"

#include <sbx/conformance/conformance.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

namespace sbx::cli {

namespace {

struct ConformanceFields {
  std::optional<std::string> provider;
  std::optional<std::string> image;
  std::string only;
  std::string skip;
  std::optional<std::string> junit;
  uint64_t seed = 0;
  bool list = false;
};

constexpr int kExitCaseFailed = 1;

void print_line(const std::string& line) {
  std::cout << line << "\n" << std::flush;
}

std::string seconds_text(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f s", s);
  return buffer;
}

int list_cases(const ConformanceFields& f) {
  for (const auto& c : sbx::conformance::cases()) {
    if (!sbx::conformance::selected_by(f.only, f.skip, c.name)) continue;
    print_line(c.name + "\t" + c.description +
               (c.offered_if.empty() ? "" : " [not offered when: " + c.offered_if + "]"));
  }
  return 0;
}

int conformance(ConformanceFields& f, const Global& g) {
  if (f.list) return list_cases(f);
  sbx::conformance::Options options;
  std::optional<std::string> config = g.config;
  if (!config) {
    if (const char* env = std::getenv("SBX_CONFIG"); env && *env) config = env;
  }
  if (config) options.host.config = sbx::Config::load(*config);
  options.host.plugin_dirs = g.plugin_dirs;
  options.provider = *f.provider;
  options.image = f.image;
  options.only = f.only;
  options.skip = f.skip;
  options.shuffle_seed = f.seed;
  options.on_result = [](const sbx::conformance::CaseResult& r) {
    const std::string outcome(sbx::conformance::to_string(r.outcome));
    std::string line = outcome + std::string(12 - std::min<size_t>(outcome.size(), 11), ' ') +
                       r.name + "  (" + seconds_text(r.seconds) + ")";
    if (r.outcome == sbx::conformance::Outcome::not_offered) line += ": " + r.reason;
    for (const auto& failure : r.failures)
      line += "\n    " + failure;
    print_line(line);
  };

  // A --junit file that cannot be written fails now, not after every case ran.
  if (f.junit && !std::ofstream(*f.junit, std::ios::binary | std::ios::app)) {
    std::cerr << "sbx: cannot write " << *f.junit << ": " << std::strerror(errno) << "\n";
    return kExitLocalIo;
  }

  sbx::conformance::Summary summary;
  try {
    summary = sbx::conformance::run(options);
  } catch (const sbx::InvalidArgumentError& e) {  // an unknown provider, nothing selected
    throw UsageError(e.what());
  }
  std::string failed_names;
  for (const auto& r : summary.results) {
    if (r.outcome == sbx::conformance::Outcome::failed) failed_names += " " + r.name;
  }
  const size_t count = summary.results.size();
  print_line(std::to_string(count) + (count == 1 ? " case" : " cases") + " on provider '" +
             summary.provider + "': " + std::to_string(summary.passed) + " passed, " +
             std::to_string(summary.failed) + " failed, " + std::to_string(summary.not_offered) +
             " not offered (" + seconds_text(summary.seconds) + ")" +
             (f.seed ? ", order from --seed " + std::to_string(f.seed) : std::string()));
  if (!failed_names.empty()) print_line("failed:" + failed_names);

  if (f.junit) {
    std::ofstream out(*f.junit, std::ios::binary | std::ios::trunc);
    out << sbx::conformance::junit_xml(summary);
    out.flush();
    if (!out) {
      std::cerr << "sbx: cannot write " << *f.junit << ": " << std::strerror(errno) << "\n";
      return kExitLocalIo;
    }
  }
  return summary.ok() ? 0 : kExitCaseFailed;
}

}  // namespace

Command conformance_command() {
  using F = ConformanceFields;
  return make_command<F>({
      .name = "conformance",
      .summary = "Run the provider conformance suite against a provider",
      .usage = "--provider NAME [--image IMAGE] [--only PATTERN] [--skip PATTERN] [--junit FILE] "
               "[--seed N] [--list]",
      .description =
          "Runs the conformance cases (docs/conformance.md) against one provider: each case\n"
          "makes its own sandboxes. Prints each case (ok, FAILED with what failed, or not\n"
          "offered with the provider's declaration) and a summary. Exit status: 0 when no case\n"
          "failed, 1 when one did, 2 for usage errors (an unknown provider included), 125 when\n"
          "the provider cannot be used at all. Load a plugin from elsewhere with --plugin-dir.\n",
      .options =
          {
              value<F>("--provider", "NAME",
                       "Provider block name (with --config) or a plugin's provider id; required",
                       [](F& f, const Arg& a) { f.provider = a.text; }),
              value<F>("--image", "IMAGE", "Image of every sandbox (default: the provider's)",
                       [](F& f, const Arg& a) { f.image = a.text; }),
              value<F>("--only", "PATTERN",
                       "Cases to run: a glob over the case name when it holds * ? or [,\n"
                       "else a substring; case-insensitive; several separated by commas\n"
                       "(e.g. 'exec.*', files, 'lifecycle.ttl,exec.user')",
                       [](F& f, const Arg& a) { f.only = a.text; }),
              value<F>("--skip", "PATTERN",
                       "Cases to leave out of those --only selects: a pattern as for --only",
                       [](F& f, const Arg& a) { f.skip = a.text; }),
              value<F>("--junit", "FILE", "Also write the results as JUnit XML to FILE",
                       [](F& f, const Arg& a) { f.junit = a.text; }),
              value<F>("--seed", "N", "Run the cases in a random order drawn from N (> 0)",
                       [](F& f, const Arg& a) {
                         const int64_t n = a.whole_number();
                         if (n <= 0) throw UsageError("--seed must be > 0, got '" + a.text + "'");
                         f.seed = static_cast<uint64_t>(n);
                       }),
              flag("--list", "List the cases (those --only and --skip select) and exit", &F::list),
          },
      .check =
          [](F& f) {
            if (!f.list && !f.provider) throw UsageError("conformance needs --provider NAME");
            if (!f.only.empty() || !f.skip.empty()) {
              bool any = false;
              for (const auto& c : sbx::conformance::cases())
                any = any || sbx::conformance::selected_by(f.only, f.skip, c.name);
              if (!any) {
                throw UsageError(f.skip.empty()
                                     ? "--only '" + f.only +
                                           "' selects no case (sbx conformance --list shows them)"
                                     : "--only '" + f.only + "' and --skip '" + f.skip +
                                           "' leave no case (sbx conformance --list shows them)");
              }
            }
          },
      .handler = conformance,
  });
}

}  // namespace sbx::cli
