// Runs after the other local_docker tests (ctest fixture cleanup): no sandbox of theirs may remain.
// Anything found is reaped, so one failed run does not leak into the next, and the test fails.

#include "support.hpp"

#include <thread>

TEST_CASE("no sandbox of the local_docker tests is left behind") {
  const std::string label = std::string(ldtest::kSuiteLabel) + "=" + ldtest::kSuiteValue;
  auto left = ldtest::docker().containers_with_label(label);
  // Containers whose TTL just ran out may still be on their way out.
  for (int i = 0; i < 25 && !left.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    left = ldtest::docker().containers_with_label(label);
  }
  std::string names;
  for (const auto& name : left) {
    names += name + " ";
    ldtest::docker().remove(name);
  }
  CHECK_MESSAGE(left.empty(), "containers left behind (now removed): ", names);
  CHECK(ldtest::docker().containers_with_label(label).empty());
}
