#include "images.hpp"

#include <boost/json/parse.hpp>

#include <algorithm>
#include <cctype>

namespace sbx::local_docker {
namespace {

using Clock = std::chrono::steady_clock;

// Progress lines arrive many times a second; one info line per interval is enough.
constexpr std::chrono::seconds kProgressLogInterval{5};

bool image_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
         c == '/' || c == ':' || c == '@';
}

// Splits the pull's stream of JSON lines and remembers the first error. Runs on the HTTP loop.
class PullProgress {
 public:
  PullProgress(const ImageRef& image, const sdk::Logger& log) : image_(image), log_(log) {}

  void feed(std::string_view bytes) {
    pending_.append(bytes);
    size_t start = 0;
    for (size_t newline; (newline = pending_.find('\n', start)) != std::string::npos;
         start = newline + 1) {
      on_line(std::string_view(pending_).substr(start, newline - start));
    }
    pending_.erase(0, start);
  }
  void finish() {
    if (!pending_.empty()) on_line(pending_);
    pending_.clear();
  }
  const std::optional<std::string>& error() const { return error_; }

 private:
  void on_line(std::string_view line) {
    boost::system::error_code ec;
    const auto value = boost::json::parse(line, ec);
    if (ec || !value.is_object()) return;  // blank or partial noise: nothing to report
    const auto& object = value.get_object();
    if (const auto* error = object.if_contains("error"); error && error->is_string()) {
      if (!error_) error_ = std::string(error->get_string());
      return;
    }
    const auto* status = object.if_contains("status");
    if (!status || !status->is_string()) return;
    std::string text(status->get_string());
    if (const auto* id = object.if_contains("id"); id && id->is_string()) {
      text = std::string(id->get_string()) + ": " + text;
    }
    // Per-layer byte counts are noise at debug level; state changes are not.
    if (!object.contains("progress")) log_.debug("pull ", image_.name, ": ", text);
    const auto now = Clock::now();
    if (now - last_info_ >= kProgressLogInterval) {
      last_info_ = now;
      log_.info("pulling image ", image_.name, ": ", text);
    }
  }

  const ImageRef& image_;
  const sdk::Logger& log_;
  std::string pending_;
  std::optional<std::string> error_;
  Clock::time_point last_info_{};
};

// A pull that failed: its status (a missing image NOT_FOUND, a refusal PERMISSION_DENIED...),
// and the reason SBX_REASON_IMAGE_PULL_FAILED whatever the status.
sdk::Error pull_error(long status, std::string_view body, const ImageRef& image) {
  const sdk::Error base = api_error(status, body, "pulling image " + image.name + " failed");
  sdk::ErrorDetails details = base.details();
  details.reason = SBX_REASON_IMAGE_PULL_FAILED;
  const bool specific = status == 404 || status == 401 || status == 403;
  return sdk::Error(specific ? base.status() : SBX_STATUS_CREATE_FAILED, base.what(), details);
}

void pull(DockerApi& api, const ImageRef& image, const std::optional<std::string>& registry_auth,
          std::chrono::milliseconds timeout, const sdk::Logger& log,
          const sdk::CancelToken& cancel) {
  log.info("pulling image ", image.name);
  const auto started = Clock::now();
  PullProgress progress(image, log);
  BodyRouter body([&progress](std::string_view bytes) { progress.feed(bytes); });

  http::Request request;
  request.method = "POST";
  request.target = "/images/create?fromImage=" + http::url_encode(image.repository) +
                   "&tag=" + http::url_encode(image.tag);
  if (registry_auth) request.headers.emplace_back("X-Registry-Auth", *registry_auth);
  request.timeout = timeout;
  body.attach(request);
  const http::Response response = api.send(std::move(request), cancel);
  if (response.status != 200) throw pull_error(response.status, body.error_body(), image);
  progress.finish();
  if (progress.error()) {
    throw sdk::Error(SBX_STATUS_CREATE_FAILED,
                     "pulling image " + image.name + " failed: " + shorten(*progress.error()),
                     sdk::ErrorDetails{.reason = SBX_REASON_IMAGE_PULL_FAILED});
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  log.info("pulled image ", image.name, " in ", ms.count(), " ms");
}

}  // namespace

ImageRef parse_image(std::string_view image) {
  constexpr std::string_view kScheme = "docker://";
  if (image.starts_with(kScheme)) image.remove_prefix(kScheme.size());
  if (image.empty()) throw sdk::Error::invalid_argument("spec.image is empty");
  // Docker's references are far shorter (a name of 255, a tag of 128, a digest); a longer one is
  // refused before it becomes a URL.
  if (image.size() > 4096) {
    throw sdk::Error::invalid_argument("spec.image is " + std::to_string(image.size()) +
                                       " bytes; an image reference has at most 4096");
  }
  if (!std::all_of(image.begin(), image.end(), image_char)) {
    throw sdk::Error::invalid_argument("spec.image '" + shorten(image, 200) +
                                       "' is not a valid image reference");
  }
  ImageRef ref;
  ref.name = std::string(image);
  const size_t slash = image.rfind('/');
  const size_t name_start = slash == std::string_view::npos ? 0 : slash + 1;
  if (const size_t at = image.find('@'); at != std::string_view::npos) {
    ref.repository = std::string(image.substr(0, at));
    ref.tag = std::string(image.substr(at + 1));
  } else if (const size_t colon = image.find(':', name_start); colon != std::string_view::npos) {
    ref.repository = std::string(image.substr(0, colon));
    ref.tag = std::string(image.substr(colon + 1));
  } else {
    // Without a tag the daemon would pull every tag of the repository.
    ref.repository = ref.name;
    ref.tag = "latest";
  }
  // A digest reference "repo:tag@sha256:..." pulls by digest; the tag part is informational.
  if (const size_t colon = ref.repository.find(':', name_start);
      colon != std::string::npos && ref.tag.starts_with("sha256:")) {
    ref.repository.resize(colon);
  }
  if (ref.repository.empty() || ref.tag.empty()) {
    throw sdk::Error::invalid_argument("spec.image '" + ref.name +
                                       "' is not a valid image reference");
  }
  return ref;
}

std::string ensure_image(DockerApi& api, const ImageRef& image, PullPolicy policy,
                         const std::optional<std::string>& registry_auth,
                         std::chrono::milliseconds pull_timeout, const sdk::Logger& log,
                         const sdk::CancelToken& cancel) {
  if (policy != PullPolicy::always) {
    if (auto user = image_user(api, image, cancel)) return std::move(*user);
    if (policy == PullPolicy::never) {
      // The image cannot be had: the reason a failed pull gives (the real server answers
      // SANDBOX_IMAGE_PULL_FAILED here too).
      throw sdk::Error(SBX_STATUS_NOT_FOUND,
                       "image " + image.name + " is not present and image_pull_policy is Never",
                       sdk::ErrorDetails{.reason = SBX_REASON_IMAGE_PULL_FAILED});
    }
  }
  pull(api, image, registry_auth, pull_timeout, log, cancel);
  auto user = image_user(api, image, cancel);
  if (!user) throw sdk::Error::create_failed("image " + image.name + " is missing after its pull");
  return std::move(*user);
}

std::optional<std::string> image_user(DockerApi& api, const ImageRef& image,
                                      const sdk::CancelToken& cancel) {
  http::Request request;
  request.target = "/images/" + image.name + "/json";
  const http::Response response = api.send(std::move(request), cancel);
  if (response.status == 404) return std::nullopt;
  if (response.status != 200) {
    throw api_error(response.status, response.body, "inspecting image " + image.name);
  }
  try {
    const boost::json::value inspect = boost::json::parse(response.body);
    const auto* config = inspect.as_object().if_contains("Config");
    const auto* user =
        config && config->is_object() ? config->as_object().if_contains("User") : nullptr;
    return user && user->is_string() ? std::string(user->as_string()) : std::string();
  } catch (const std::exception& e) {
    throw sdk::Error::internal("inspecting image " + image.name + ": " + e.what());
  }
}

bool is_root_user(std::string_view user) {
  const size_t colon = user.find(':');
  const std::string_view name = user.substr(0, colon);
  const std::string_view group =
      colon == std::string_view::npos ? std::string_view() : user.substr(colon + 1);
  return (name.empty() || name == "0" || name == "root") &&
         (group.empty() || group == "0" || group == "root");
}

}  // namespace sbx::local_docker
