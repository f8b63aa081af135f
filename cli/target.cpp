// Sandbox arguments and cp's two sides (target.hpp).

#include "target.hpp"

#include <boost/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <utility>

namespace sbx::cli {

namespace {

constexpr size_t kMaxDescriptorBytes = 1 << 20;  // a descriptor is small; this is not a config

// Reads a descriptor file (or standard input for "-").
std::string read_descriptor_file(const std::string& file) {
  std::string text;
  if (file == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      throw UsageError("cannot read the sandbox descriptor file " + file + ": " +
                       std::strerror(errno));
    }
    std::error_code ec;
    if (std::filesystem::is_directory(file, ec)) {
      throw UsageError("the sandbox descriptor file " + file + " is a directory");
    }
    text.resize(kMaxDescriptorBytes + 1);
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
  }
  if (text.size() > kMaxDescriptorBytes) {
    throw UsageError("the sandbox descriptor in " + file + " is larger than 1 MiB");
  }
  return text;
}

SandboxRef from_descriptor(std::string text, const std::string& where) {
  boost::system::error_code ec;
  const boost::json::value parsed = boost::json::parse(text, ec);
  if (ec || !parsed.is_object()) {
    throw UsageError(where + " is not a sandbox descriptor (a JSON object)" +
                     (ec ? ": " + ec.message() : std::string()));
  }
  const auto* id = parsed.get_object().if_contains("sandbox_id");
  if (!id || !id->is_string() || id->get_string().empty()) {
    throw UsageError(where + " has no \"sandbox_id\"");
  }
  return {std::move(text), std::string(id->get_string())};
}

// The sandbox side of a cp argument, or nothing for a local path.
std::optional<std::pair<SandboxRef, std::string>> sandbox_side(const std::string& arg) {
  size_t colon = std::string::npos;
  if (arg.starts_with("{")) {
    // The descriptor ends where its JSON value does; the path follows its ':'.
    boost::json::parser parser;
    boost::system::error_code ec;
    const size_t used = parser.write_some(arg.data(), arg.size(), ec);
    if (ec || used >= arg.size() || arg[used] != ':') {
      throw UsageError("'" + arg + "' does not look like {DESCRIPTOR}:PATH");
    }
    colon = used;
  } else if (arg.starts_with("@") || (arg.find(':') != std::string::npos && !arg.starts_with("/") &&
                                      !arg.starts_with("."))) {
    colon = arg.find(':');
    if (colon == std::string::npos) {
      throw UsageError("'" + arg + "' names a sandbox but no path in it (@FILE:PATH)");
    }
  } else {
    return std::nullopt;
  }
  std::string remote = arg.substr(colon + 1);
  if (remote.empty()) throw UsageError("'" + arg + "' has no path after the ':'");
  const std::string sandbox = arg.substr(0, colon);
  return std::make_pair(sandbox_ref(Arg{"SANDBOX", sandbox}), std::move(remote));
}

std::string file_name_of(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

}  // namespace

SandboxRef sandbox_ref(const Arg& arg) {
  const std::string& text = arg.text;
  if (text.empty()) throw UsageError(std::string(arg.name) + " must not be empty");
  if (text.starts_with("{")) return from_descriptor(text, "the " + std::string(arg.name));
  if (text.starts_with("@")) {
    const std::string file = text.substr(1);
    return from_descriptor(read_descriptor_file(file),
                           file == "-" ? "standard input" : "the file " + file);
  }
  return {boost::json::serialize(boost::json::object{{"sandbox_id", text}}), text};
}

CopyPaths copy_paths(const std::string& source, const std::string& target) {
  auto from = sandbox_side(source);
  auto to = sandbox_side(target);
  if (from && to) {
    throw UsageError("cp copies between this machine and a sandbox: one side must be a local path");
  }
  if (!from && !to) {
    throw UsageError("cp needs one side in a sandbox, as ID:PATH");
  }
  CopyPaths out;
  out.upload = to.has_value();
  auto& [sandbox, remote] = out.upload ? *to : *from;
  out.sandbox = std::move(sandbox);
  out.remote = std::move(remote);
  out.local = out.upload ? source : target;
  if (out.local.empty()) throw UsageError("cp: the local path must not be empty");
  if (out.upload && out.remote.ends_with("/")) {
    out.remote += file_name_of(out.local);
  }
  std::error_code ec;
  if (!out.upload && std::filesystem::is_directory(out.local, ec)) {
    out.local = (std::filesystem::path(out.local) / file_name_of(out.remote)).string();
  }
  return out;
}

}  // namespace sbx::cli
