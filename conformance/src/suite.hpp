// Inside the conformance suite: the case table, the context a case runs with, and the checks.
// Only the suite's own sources include this file (its CHECK macros are short names).
#pragma once

#include <sbx/conformance/conformance.hpp>
#include <sbx/sbx.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace sbx::conformance {

// How long the suite's hosts wait for a plugin to end a cancelled operation before abandoning it
// (Deadlines::cancel_grace_s, 5 s by default): long, so that exec.cancel sees the plugin's own
// answer, not the host's.
inline constexpr std::chrono::duration<double> kCancelGrace{60.0};

// The host options of the suite's hosts: the caller's, with kCancelGrace (runner.cpp).
Host::Options suite_host_options(const Options& options);

// What every case of one run shares (read-only while cases run, but for the TTL memo).
struct Run {
  const Options* options = nullptr;
  Host* host = nullptr;
  Provider provider;
  // The provider refused a TTL (UNIMPLEMENTED at create): later sandboxes are made without the
  // suite's safety TTL. Only an optimisation: each create finds it out alone otherwise.
  std::atomic<bool> ttl_refused{false};
};

// A case ends early with "not offered" (t.not_offered) or after a failed REQUIRE.
struct NotOffered {
  std::string reason;
};
struct RequireFailed {};

// The context of one case: its checks, its sandboxes' spec, a scratch directory.
class T {
 public:
  T(Run& run, std::string name) : run_(run), name_(std::move(name)) {}
  ~T();
  T(const T&) = delete;
  T& operator=(const T&) = delete;

  Provider& provider() { return run_.provider; }
  Host& host() { return *run_.host; }
  const Options& options() const { return *run_.options; }
  const std::string& name() const { return name_; }

  // The suite's spec: the image, workdir /work, a 600 s TTL as a safety net (dropped for a
  // provider that refuses TTLs), metadata sbx.test=conformance and sbx.conformance.case=<name>.
  SandboxSpec spec();
  // create(spec) that drops the safety TTL when the provider refuses TTLs with UNIMPLEMENTED.
  Sandbox create(SandboxSpec spec);
  Sandbox create() { return create(spec()); }
  // A sandbox whose TTL is `ttl_s`, for the cases about expiry: "not offered" when the provider
  // refuses a TTL with UNIMPLEMENTED.
  Sandbox create_with_ttl(int ttl_s);
  // A second host, as another process would have (for sbx.connect/1).
  std::unique_ptr<Host> second_host() const;
  // A scratch directory, removed with the case.
  const std::filesystem::path& tmp();

  [[noreturn]] void not_offered(std::string reason) { throw NotOffered{std::move(reason)}; }
  // Ends the case as "not offered" when `extension` is not in the provider's list.
  void needs_extension(const std::string& extension);

  // A failed check is recorded as `meaning` (what the provider did wrong and what it should do,
  // in a plugin author's words: the kit ships no suite source to look up), then what the suite
  // saw. No source location: the reader has the meaning and the case's purpose
  // (docs/conformance.md) instead.
  void fail(const std::string& meaning);
  bool check(bool ok, const std::string& meaning);
  void require(bool ok, const std::string& meaning) {
    if (!check(ok, meaning)) throw RequireFailed{};
  }
  template <class A, class B>
  bool check_eq(const A& got, const B& expected, const std::string& meaning) {
    if (got == expected) return true;
    fail(meaning + " (got " + show(got) + ", expected " + show(expected) + ")");
    return false;
  }
  // Runs `f`; passes when it throws E (or a subclass).
  template <class E>
  bool check_throws(const std::function<void()>& f, const char* type, const std::string& meaning) {
    try {
      f();
    } catch (const E&) {
      return true;
    } catch (const std::exception& e) {
      fail(meaning + " (got " + describe(e) + ", expected " + type + ")");
      return false;
    }
    fail(meaning + " (it succeeded, expected " + type + ")");
    return false;
  }
  bool check_nothrow(const std::function<void()>& f, const std::string& meaning);

  const std::vector<std::string>& failures() const { return failures_; }

  static std::string describe(const std::exception& e);
  static std::string show(const std::string& s);
  static std::string show(std::string_view s) { return show(std::string(s)); }
  static std::string show(const char* s) { return show(std::string(s)); }
  static std::string show(SandboxStatus s) { return std::string(to_string(s)); }
  template <class V>
  static std::string show(const V& v) {
    std::ostringstream out;
    out << v;
    return out.str();
  }

 private:
  Run& run_;
  std::string name_;
  std::vector<std::string> failures_;
  std::filesystem::path tmp_;
};

// Each check names what it means for the provider (see T::fail). A condition holding a comma
// goes in parentheses.
#define CHECK(cond, meaning) t.check(static_cast<bool>(cond), meaning)
#define REQUIRE(cond, meaning) t.require(static_cast<bool>(cond), meaning)
#define CHECK_EQ(got, expected, meaning) t.check_eq((got), (expected), meaning)
#define CHECK_THROWS_AS(expr, E, meaning) t.check_throws<E>([&] { (void)(expr); }, #E, meaning)
#define CHECK_NOTHROW(expr, meaning) t.check_nothrow([&] { (void)(expr); }, meaning)

using CaseFn = void (*)(T&);
struct Case {
  CaseInfo info;
  CaseFn run;
};

// The cases, by group (one source file each).
void add_exec_cases(std::vector<Case>& cases);
void add_file_cases(std::vector<Case>& cases);
void add_lifecycle_cases(std::vector<Case>& cases);
void add_extension_cases(std::vector<Case>& cases);
void add_terminal_cases(std::vector<Case>& cases);

// Waits until `done()` or `limit` passed, polling every `every`; true when done. For conditions
// only a poll can see (a TTL running out in the backend).
bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit,
                std::chrono::milliseconds every = std::chrono::milliseconds(200));

}  // namespace sbx::conformance
