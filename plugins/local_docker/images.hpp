// Images: reference parsing, the pull policy, and pulls with progress logging.
#pragma once

#include "config.hpp"
#include "docker_api.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::local_docker {

struct ImageRef {
  std::string name;        // the reference without "docker://", as containers/create gets it
  std::string repository;  // fromImage of a pull, e.g. "127.0.0.1:5000/sbx/busybox"
  std::string tag;         // tag or digest ("sha256:..."); "latest" when the reference has none
};

// Parses spec.image; a "docker://" prefix is stripped. Throws INVALID_ARGUMENT for an empty
// reference or characters no image reference can contain.
ImageRef parse_image(std::string_view image);

// Makes `image` present according to `policy`: IfNotPresent inspects and pulls on 404, Always
// pulls, Never fails with NOT_FOUND when the image is missing. A pull logs its progress (throttled)
// and fails with the daemon's message. `registry_auth` is the X-Registry-Auth value (never logged).
// Returns the user the image's processes run as (its config's `User`, "" when unset), from the
// inspect that found it (one more after a pull).
std::string ensure_image(DockerApi& api, const ImageRef& image, PullPolicy policy,
                         const std::optional<std::string>& registry_auth,
                         std::chrono::milliseconds pull_timeout, const sdk::Logger& log,
                         const sdk::CancelToken& cancel);

// The image's config's `User` ("" when unset) by one inspect; nothing when the image is missing.
std::optional<std::string> image_user(DockerApi& api, const ImageRef& image,
                                      const sdk::CancelToken& cancel);

// Whether a Docker `USER[:GROUP]` is root with root's group ("", "0", "root", "0:0", ...).
bool is_root_user(std::string_view user);

}  // namespace sbx::local_docker
