#include "archive.hpp"

#include <sbx/sdk/tar.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

namespace sbx::local_docker {
namespace {

namespace tar = sdk::tar;

constexpr size_t kChunk = 64 * 1024;

int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Extracting at "/" lets the daemon create missing parents. noOverwriteDirNonDir: a file must
// never replace a directory (Docker would otherwise delete the directory tree).
std::string archive_target(const std::string& container) {
  return "/containers/" + container + "/archive?path=%2F&noOverwriteDirNonDir=true";
}

void check_upload_response(const http::Response& response, const std::string& container,
                           const std::string& what) {
  if (response.status >= 400) {
    throw api_error(response.status, response.body, what + " in sandbox " + container);
  }
}

// The tar stream of one file, produced on demand as libcurl asks for request body bytes.
class SingleFileArchive {
 public:
  SingleFileArchive(const std::string& path, uint32_t mode, sdk::ByteSource& source)
      : source_(source),
        left_(static_cast<uint64_t>(source.size())),
        writer_([this](std::string_view bytes) { pending_.append(bytes); }) {
    writer_.begin_file(path, left_, mode, now_unix());
  }

  size_t fill(char* buffer, size_t capacity) {
    while (offset_ == pending_.size() && !finished_)
      produce();
    const size_t n = std::min(capacity, pending_.size() - offset_);
    std::memcpy(buffer, pending_.data() + offset_, n);
    offset_ += n;
    return n;
  }

 private:
  void produce() {
    pending_.clear();
    offset_ = 0;
    if (left_ == 0) {
      writer_.end_file();
      writer_.finish();
      finished_ = true;
      return;
    }
    chunk_.resize(static_cast<size_t>(std::min<uint64_t>(kChunk, left_)));
    const size_t n = source_.read(chunk_.data(), chunk_.size());
    if (n == 0) {
      throw sdk::Error::internal("the upload's source ended " + std::to_string(left_) +
                                 " bytes before its announced size");
    }
    writer_.write(std::string_view(chunk_.data(), n));
    left_ -= n;
  }

  sdk::ByteSource& source_;
  uint64_t left_;
  std::string pending_;
  size_t offset_ = 0;
  std::vector<char> chunk_;
  bool finished_ = false;
  tar::Writer writer_;
};

// Checks each archive entry against the one file asked for and passes its bytes to the sink.
class SingleFileExtractor final : public tar::Reader::Handler {
 public:
  SingleFileExtractor(std::string path, std::string name, sdk::ByteSink& sink)
      : path_(std::move(path)), name_(std::move(name)), sink_(sink) {}

  void on_entry(const tar::Entry& entry) override {
    if (++entries_ > 1) refuse("the archive holds more than one entry (" + entry.path + ")");
    switch (entry.type) {
      case tar::EntryType::regular:
        break;
      case tar::EntryType::directory:
        refuse("it is a directory; only regular files can be downloaded");
      case tar::EntryType::symlink:
        refuse("it is a symbolic link (to '" + entry.link_target +
               "'); download the target instead");
      case tar::EntryType::hardlink:
        refuse("the archive stores it as a hard link");
      case tar::EntryType::other:
        refuse("it is not a regular file");
    }
    // Docker names the entry after the file itself; anything else (another name, a path with
    // directories, "..", an absolute path) is not what was asked for.
    if (entry.path != name_) {
      refuse("the archive entry '" + entry.path + "' is not the requested file '" + name_ + "'");
    }
  }
  void on_data(std::string_view bytes) override { sink_.write(bytes); }
  void on_entry_end() override { complete_ = true; }

  bool complete() const { return complete_; }

 private:
  [[noreturn]] void refuse(const std::string& why) const {
    throw sdk::Error::invalid_argument("cannot download " + path_ + ": " + why);
  }

  std::string path_;
  std::string name_;
  sdk::ByteSink& sink_;
  int entries_ = 0;
  bool complete_ = false;
};

}  // namespace

std::string container_path(std::string_view path, const std::optional<std::string>& workdir) {
  if (path.empty()) throw sdk::Error::invalid_argument("the sandbox path is empty");
  if (path.find('\0') != std::string_view::npos) {
    throw sdk::Error::invalid_argument("the sandbox path contains a NUL byte");
  }
  std::string joined =
      path.front() == '/' ? std::string(path) : workdir.value_or("/") + "/" + std::string(path);
  std::vector<std::string_view> parts;
  const std::string_view text(joined);
  for (size_t start = 0; start <= text.size();) {
    const size_t end = std::min(text.find('/', start), text.size());
    const std::string_view part = text.substr(start, end - start);
    start = end + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  if (parts.empty()) {
    throw sdk::Error::invalid_argument("the sandbox path '" + std::string(path) +
                                       "' names the root directory, not a file");
  }
  std::string out;
  for (const auto part : parts) {
    out += '/';
    out += part;
  }
  return out;
}

void upload_file(DockerApi& api, const std::string& container, const std::string& path,
                 uint32_t mode, sdk::ByteSource& source, const sdk::CancelToken& cancel) {
  if (source.size() < 0) throw sdk::Error::invalid_argument("the upload's size is negative");
  auto archive = std::make_shared<SingleFileArchive>(path, mode, source);
  http::Request request;
  request.method = "PUT";
  request.target = archive_target(container);
  request.headers.emplace_back("Content-Type", "application/x-tar");
  request.body_size = static_cast<int64_t>(
      tar::Writer::single_file_archive_size(path, static_cast<uint64_t>(source.size())));
  request.body_source = [archive](char* buffer, size_t capacity) {
    return archive->fill(buffer, capacity);
  };
  // No whole-request deadline: a large file takes as long as it takes; cancellation stops it.
  request.timeout = kNoTimeout;
  check_upload_response(api.send(std::move(request), cancel), container, "uploading " + path);
}

void upload_files(DockerApi& api, const std::string& container,
                  const std::vector<std::pair<std::string, std::string>>& files,
                  const sdk::CancelToken& cancel) {
  std::string body;
  tar::Writer writer([&body](std::string_view bytes) { body.append(bytes); });
  const int64_t mtime = now_unix();
  for (const auto& [path, contents] : files) {
    writer.begin_file(path, contents.size(), 0644, mtime);
    writer.write(contents);
    writer.end_file();
  }
  writer.finish();
  http::Request request;
  request.method = "PUT";
  request.target = archive_target(container);
  request.headers.emplace_back("Content-Type", "application/x-tar");
  request.body = std::move(body);
  check_upload_response(api.send(std::move(request), cancel), container,
                        "writing the startup files");
}

void download_file(DockerApi& api, const std::string& container, const std::string& path,
                   sdk::ByteSink& sink, const sdk::CancelToken& cancel) {
  const std::string name = path.substr(path.rfind('/') + 1);
  SingleFileExtractor extractor(path, name, sink);
  tar::Reader reader(extractor);
  long status = 0;
  std::string error_body;
  http::Request request;
  request.target = "/containers/" + container + "/archive?path=" + http::url_encode(path);
  request.on_headers = [&status](long s, const http::Headers&) { status = s; };
  request.on_body = [&](std::string_view bytes) {
    if (status == 200) {
      reader.feed(bytes);
    } else if (error_body.size() < 64 * 1024) {
      error_body.append(bytes);
    }
  };
  request.timeout = kNoTimeout;  // as for uploads: cancellation bounds it
  const http::Response response = api.send(std::move(request), cancel);
  if (response.status != 200) {
    throw api_error(response.status, error_body,
                    "downloading " + path + " from sandbox " + container);
  }
  reader.finish();
  if (!extractor.complete()) {
    throw sdk::Error::internal("downloading " + path + " from sandbox " + container +
                               ": the archive did not contain the file");
  }
}

}  // namespace sbx::local_docker
