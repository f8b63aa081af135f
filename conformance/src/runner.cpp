// The suite's runner: selection, one case after another, outcomes, JUnit XML.

#include "suite.hpp"

#include <fnmatch.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

namespace sbx::conformance {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> c;
    add_lifecycle_cases(c);
    add_exec_cases(c);
    add_file_cases(c);
    add_extension_cases(c);
    add_terminal_cases(c);
    return c;
  }();
  return cases;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string xml_escaped(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters other than tab and newline are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += '?';
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace

// ---- T ----------------------------------------------------------------------------------------

T::~T() {
  if (!tmp_.empty()) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

SandboxSpec T::spec() {
  SandboxSpec spec;
  spec.image = run_.options->image;
  spec.workdir = "/work";
  if (!run_.ttl_refused.load()) spec.ttl_s = 600;  // a crashed run must not leave sandboxes
  spec.metadata["sbx.test"] = "conformance";
  spec.metadata["sbx.conformance.case"] = name_;
  return spec;
}

Sandbox T::create_with_ttl(int ttl_s) {
  SandboxSpec with_ttl = spec();
  with_ttl.ttl_s = ttl_s;
  try {
    return provider().create(with_ttl);
  } catch (const Error& e) {
    if (e.status() == SBX_STATUS_UNIMPLEMENTED) {
      not_offered("the provider refuses a TTL (UNIMPLEMENTED at create): " + std::string(e.what()));
    }
    throw;
  }
}

Sandbox T::create(SandboxSpec spec) {
  try {
    return provider().create(spec);
  } catch (const Error& e) {
    if (e.status() != SBX_STATUS_UNIMPLEMENTED || !spec.ttl_s) throw;
    run_.ttl_refused.store(true);
    spec.ttl_s.reset();
    return provider().create(spec);
  }
}

std::unique_ptr<Host> T::second_host() const {
  return std::make_unique<Host>(suite_host_options(*run_.options));
}

const fs::path& T::tmp() {
  if (tmp_.empty()) {
    std::string pattern = (fs::temp_directory_path() / "sbx-conformance-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("cannot make a scratch directory");
    tmp_ = pattern;
  }
  return tmp_;
}

void T::needs_extension(const std::string& extension) {
  if (!provider().supports(extension)) {
    not_offered("the provider does not offer " + extension);
  }
}

void T::fail(const std::string& meaning) {
  failures_.push_back(meaning);
}

bool T::check(bool ok, const std::string& meaning) {
  if (!ok) fail(meaning);
  return ok;
}

bool T::check_nothrow(const std::function<void()>& f, const std::string& meaning) {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    fail(meaning + " (got " + describe(e) + ")");
    return false;
  }
}

std::string T::describe(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) {
    return std::string(error->status_name()) + " (" + error->what() + ")";
  }
  return std::string("an exception (") + e.what() + ")";
}

std::string T::show(const std::string& s) {
  std::string out = "\"";
  const size_t limit = 200;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\x%02x", c);
      out += buffer;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "\"";
  if (s.size() > limit) out += " (" + std::to_string(s.size()) + " bytes)";
  return out;
}

bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit,
                std::chrono::milliseconds every) {
  const auto end = Clock::now() + limit;
  for (;;) {
    if (done()) return true;
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(every);
  }
}

// ---- The suite --------------------------------------------------------------------------------

const std::vector<CaseInfo>& cases() {
  static const std::vector<CaseInfo> infos = [] {
    std::vector<CaseInfo> out;
    for (const auto& c : all_cases())
      out.push_back(c.info);
    return out;
  }();
  return infos;
}

bool matches(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return true;
  const std::string n = lower(name);
  // A comma-separated list: any of its patterns (case names hold no comma).
  for (size_t start = 0; start <= pattern.size();) {
    const size_t comma = std::min(pattern.find(',', start), pattern.size());
    const std::string p = lower(pattern.substr(start, comma - start));
    start = comma + 1;
    if (p.empty()) continue;
    if (p.find_first_of("*?[") != std::string::npos) {
      if (::fnmatch(p.c_str(), n.c_str(), 0) == 0) return true;
    } else if (n.find(p) != std::string::npos) {
      return true;
    }
  }
  return false;
}

bool selected_by(std::string_view only, std::string_view skip, std::string_view name) {
  return matches(only, name) && (skip.empty() || !matches(skip, name));
}

std::string_view to_string(Outcome outcome) noexcept {
  switch (outcome) {
    case Outcome::passed:
      return "ok";
    case Outcome::failed:
      return "FAILED";
    case Outcome::not_offered:
      return "not offered";
  }
  return "?";
}

// The suite's hosts wait long for a cancelled operation (kCancelGrace), so that a plugin whose
// cancel does nothing is seen as such: otherwise the host's own abandonment, after 5 s, would
// answer CancelledError in its place. A config's "deadlines" still win.
Host::Options suite_host_options(const Options& options) {
  Host::Options host = options.host;
  host.deadlines.cancel_grace_s = std::max(host.deadlines.cancel_grace_s, kCancelGrace.count());
  return host;
}

Summary run(const Options& options) {
  std::vector<const Case*> selected;
  for (const auto& c : all_cases()) {
    if (selected_by(options.only, options.skip, c.info.name)) selected.push_back(&c);
  }
  if (selected.empty()) {
    throw InvalidArgumentError("--only '" + options.only + "' and --skip '" + options.skip +
                               "' leave no case (sbx conformance --list shows them)");
  }
  if (options.shuffle_seed != 0) {
    std::mt19937_64 random(options.shuffle_seed);
    std::shuffle(selected.begin(), selected.end(), random);
  }

  Host host(suite_host_options(options));
  Run run;
  run.options = &options;
  run.host = &host;
  run.provider = host.provider(options.provider);  // an unknown provider throws here

  Summary summary;
  summary.provider = options.provider;
  const auto start = Clock::now();
  for (const Case* c : selected) {
    if (options.on_start) options.on_start(c->info);
    CaseResult result;
    result.name = c->info.name;
    const auto case_start = Clock::now();
    {
      T t(run, c->info.name);
      try {
        c->run(t);
      } catch (const NotOffered& n) {
        result.outcome = Outcome::not_offered;
        result.reason = n.reason;
      } catch (const RequireFailed&) {
        // the failure is recorded
      } catch (const std::exception& e) {
        t.fail("a call the case needed failed, so it stopped there: " + T::describe(e));
      } catch (...) {
        t.fail("the case stopped at an exception that is not a std::exception");
      }
      if (!t.failures().empty()) {
        // A failed check counts even when the case then found it was not offered.
        result.outcome = Outcome::failed;
        result.failures = t.failures();
      }
    }  // the case's sandboxes and scratch directory are gone before the next case starts
    result.seconds = seconds_since(case_start);
    switch (result.outcome) {
      case Outcome::passed:
        ++summary.passed;
        break;
      case Outcome::failed:
        ++summary.failed;
        break;
      case Outcome::not_offered:
        ++summary.not_offered;
        break;
    }
    if (options.on_result) options.on_result(result);
    summary.results.push_back(std::move(result));
  }
  summary.seconds = seconds_since(start);
  return summary;
}

std::string junit_xml(const Summary& summary) {
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  char time[32];
  std::snprintf(time, sizeof time, "%.3f", summary.seconds);
  out += "<testsuites>\n<testsuite name=\"sbx conformance: " + xml_escaped(summary.provider) +
         "\" tests=\"" + std::to_string(summary.results.size()) + "\" failures=\"" +
         std::to_string(summary.failed) + "\" errors=\"0\" skipped=\"" +
         std::to_string(summary.not_offered) + "\" time=\"" + time + "\">\n";
  for (const auto& r : summary.results) {
    std::snprintf(time, sizeof time, "%.3f", r.seconds);
    out += "  <testcase classname=\"conformance." + xml_escaped(summary.provider) + "\" name=\"" +
           xml_escaped(r.name) + "\" time=\"" + time + "\"";
    if (r.outcome == Outcome::passed) {
      out += "/>\n";
      continue;
    }
    out += ">\n";
    if (r.outcome == Outcome::not_offered) {
      out += "    <skipped message=\"not offered: " + xml_escaped(r.reason) + "\"/>\n";
    } else {
      std::string text;
      for (const auto& f : r.failures)
        text += f + "\n";
      out += "    <failure message=\"" + xml_escaped(r.failures.front()) + "\">" +
             xml_escaped(text) + "</failure>\n";
    }
    out += "  </testcase>\n";
  }
  out += "</testsuite>\n</testsuites>\n";
  return out;
}

}  // namespace sbx::conformance
