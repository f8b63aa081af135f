#include <doctest/doctest.h>

#include "../common/test_helpers.hpp"

#include <sbx/sdk/tar.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace tar = sbx::sdk::tar;
using sbx::sdk::Error;

namespace {

uint64_t fnv1a(std::string_view bytes, uint64_t hash = 14695981039346656037ull) {
  for (unsigned char c : bytes)
    hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

std::string random_bytes(size_t size, uint32_t seed) {
  std::mt19937 engine(seed);
  std::string out(size, '\0');
  for (auto& c : out)
    c = static_cast<char>(engine());
  return out;
}

// Everything the reader reported, with a check that callbacks come in a valid order.
struct Collector : tar::Reader::Handler {
  struct Item {
    tar::Entry entry;
    std::string data;
    bool ended = false;
  };
  std::vector<Item> items;
  bool keep_data = true;
  uint64_t data_bytes = 0;
  uint64_t hash = 14695981039346656037ull;
  size_t largest_chunk = 0;

  void on_entry(const tar::Entry& entry) override {
    if (!items.empty()) REQUIRE(items.back().ended);
    items.push_back({entry, "", false});
  }
  void on_data(std::string_view bytes) override {
    REQUIRE(!items.empty());
    REQUIRE_FALSE(items.back().ended);
    if (keep_data) items.back().data.append(bytes);
    data_bytes += bytes.size();
    hash = fnv1a(bytes, hash);
    largest_chunk = std::max(largest_chunk, bytes.size());
  }
  void on_entry_end() override {
    REQUIRE(!items.empty());
    REQUIRE_FALSE(items.back().ended);
    if (keep_data) REQUIRE(items.back().data.size() == items.back().entry.size);
    items.back().ended = true;
  }
  const Item* find(const std::string& path) const {
    for (const auto& item : items) {
      if (item.entry.path == path) return &item;
    }
    return nullptr;
  }
};

// Feeds `archive` to a fresh reader in chunks whose sizes come from `next_chunk`.
template <typename NextChunk>
Collector read_chunked(std::string_view archive, NextChunk next_chunk) {
  Collector collector;
  tar::Reader reader(collector);
  while (!archive.empty()) {
    size_t n = std::min(archive.size(), next_chunk());
    reader.feed(archive.substr(0, n));
    archive.remove_prefix(n);
  }
  reader.finish();
  CHECK(reader.at_end());
  return collector;
}

Collector read_all(std::string_view archive) {
  return read_chunked(archive, [&] { return archive.size(); });
}

struct TestFile {
  std::string path;
  std::string data;
  uint32_t mode;
};

std::string write_archive(const std::vector<std::string>& dirs, const std::vector<TestFile>& files,
                          int64_t mtime = 1700000000) {
  std::string out;
  tar::Writer writer([&](std::string_view bytes) { out.append(bytes); });
  for (const auto& dir : dirs)
    writer.add_directory(dir, 0750, mtime);
  for (const auto& file : files) {
    writer.begin_file(file.path, file.data.size(), file.mode, mtime);
    // Uneven pieces, to show write() may be called any number of times.
    std::string_view rest = file.data;
    for (size_t piece = 1; !rest.empty(); piece = piece * 3 + 1) {
      size_t n = std::min(piece, rest.size());
      writer.write(rest.substr(0, n));
      rest.remove_prefix(n);
    }
    writer.end_file();
  }
  writer.finish();
  return out;
}

// A ustar header built independently of the SDK's writer, for feeding odd headers to the reader.
// `size_field`, when given, is the raw 12-byte size field; otherwise `size` is written in octal.
struct RawHeader {
  std::string name;
  char typeflag = '0';
  uint64_t size = 0;
  std::string linkname = "";
  bool gnu_magic = false;
  std::string size_field = "";
};

std::string raw_header(const RawHeader& h) {
  std::string block(512, '\0');
  std::memcpy(&block[0], h.name.data(), std::min<size_t>(h.name.size(), 100));
  std::snprintf(&block[100], 8, "%07o", 0644);
  std::snprintf(&block[108], 8, "%07o", 0);
  std::snprintf(&block[116], 8, "%07o", 0);
  if (h.size_field.empty()) {
    std::snprintf(&block[124], 12, "%011llo", static_cast<unsigned long long>(h.size));
  } else {
    REQUIRE(h.size_field.size() == 12);
    std::memcpy(&block[124], h.size_field.data(), 12);
  }
  std::snprintf(&block[136], 12, "%011o", 0);
  block[156] = h.typeflag;
  std::memcpy(&block[157], h.linkname.data(), std::min<size_t>(h.linkname.size(), 100));
  std::memcpy(&block[257],
              h.gnu_magic ? "ustar  "
                          : "ustar\0"
                            "00",
              8);
  std::memset(&block[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : block)
    sum += c;
  std::snprintf(&block[148], 8, "%06o", sum);
  block[155] = ' ';
  return block;
}

std::string padded(std::string data) {
  data.resize((data.size() + 511) / 512 * 512, '\0');
  return data;
}

std::string pax_record(const std::string& key, const std::string& value) {
  // Independent of the writer: try lengths until the record's length field describes itself.
  for (size_t length = 1;; ++length) {
    std::string record = std::to_string(length) + " " + key + "=" + value + "\n";
    if (record.size() == length) return record;
  }
}

const std::string kEnd(1024, '\0');

template <typename Fn>
Error error_of(Fn&& fn) {
  return sbx::testing::error_of<Error>(std::forward<Fn>(fn));
}

// A temporary directory removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "sbx-tar-test-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { fs::remove_all(path); }
};

void run(const std::string& command) {
  INFO(command);
  REQUIRE(std::system(command.c_str()) == 0);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void write_file(const fs::path& path, const std::string& data) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << data;
}

std::string long_component(char c, size_t length) {
  return std::string(length, c);
}

}  // namespace

TEST_CASE("round trip through any chunking, including single bytes") {
  const std::string name_150 = "deep/" + long_component('n', 145);  // 150 chars
  const std::string name_300 = long_component('a', 120) + "/" + long_component('b', 120) + "/" +
                               long_component('c', 59);  // 300 chars
  std::vector<TestFile> files = {
      {"empty.txt", "", 0644},
      {"one", "x", 0600},
      {"work/511.bin", random_bytes(511, 1), 0644},
      {"work/512.bin", random_bytes(512, 2), 0755},
      {"work/513.bin", random_bytes(513, 3), 0644},
      {"work/big.bin", random_bytes(100'000, 4), 0644},
      {name_150, "long name 150", 0644},
      {name_300, random_bytes(1000, 5), 0644},
  };
  std::vector<std::string> dirs = {"work", "work/sub", long_component('d', 130)};
  const std::string archive = write_archive(dirs, files);
  CHECK(archive.size() % 512 == 0);

  std::mt19937 engine(42);
  std::vector<std::pair<const char*, std::function<size_t()>>> chunkings = {
      {"whole", [&] { return archive.size(); }},
      {"1 byte", [] { return size_t{1}; }},
      {"random up to 700", [&] { return size_t{1} + engine() % 700; }},
      {"random up to 5000", [&] { return size_t{1} + engine() % 5000; }},
      {"512", [] { return size_t{512}; }},
  };
  for (auto& [label, next] : chunkings) {
    CAPTURE(label);
    Collector got = read_chunked(archive, next);
    REQUIRE(got.items.size() == dirs.size() + files.size());
    for (size_t i = 0; i < dirs.size(); ++i) {
      const auto& entry = got.items[i].entry;
      CHECK(entry.path == dirs[i] + "/");
      CHECK(entry.type == tar::EntryType::directory);
      CHECK(entry.typeflag == '5');
      CHECK(entry.mode == 0750);
      CHECK(entry.size == 0);
    }
    for (size_t i = 0; i < files.size(); ++i) {
      const auto& item = got.items[dirs.size() + i];
      CHECK(item.entry.path == files[i].path);
      CHECK(item.entry.type == tar::EntryType::regular);
      CHECK(item.entry.size == files[i].data.size());
      CHECK(item.entry.mode == files[i].mode);
      CHECK(item.entry.mtime == 1700000000);
      CHECK(item.data == files[i].data);
      CHECK(item.ended);
    }
  }
}

TEST_CASE("single_file_archive_size matches what the writer produces") {
  for (const std::string& path : {std::string("a"), long_component('p', 100),
                                  long_component('p', 101), "x/" + long_component('q', 400)}) {
    for (uint64_t size : {0, 1, 511, 512, 513, 4096, 70000}) {
      std::string archive = write_archive({}, {{path, random_bytes(size, 7), 0644}});
      CHECK(tar::Writer::single_file_archive_size(path, size) == archive.size());
    }
  }
  // Past 8 GiB a PAX size record is added: one more header and its payload block.
  const uint64_t huge = 9ull << 30;
  CHECK(tar::Writer::single_file_archive_size("f", huge) == 512 + 512 + 512 + huge + 1024);
}

TEST_CASE("writer normalizes paths and rejects '..'") {
  std::string archive = write_archive({"/abs//dir/./"}, {{"/root/./x//y.txt", "data", 0644}});
  Collector got = read_all(archive);
  REQUIRE(got.items.size() == 2);
  CHECK(got.items[0].entry.path == "abs/dir/");
  CHECK(got.items[1].entry.path == "root/x/y.txt");

  std::string sink;
  tar::Writer writer([&](std::string_view b) { sink.append(b); });
  for (const char* bad : {"../x", "a/../b", "a/..", "..", "/../etc/passwd"}) {
    CAPTURE(bad);
    auto error = error_of([&] { writer.begin_file(bad, 1); });
    CHECK(error.status() == SBX_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(error.what()).find("..") != std::string::npos);
    CHECK(error_of([&] { writer.add_directory(bad); }).status() == SBX_STATUS_INVALID_ARGUMENT);
  }
  CHECK(error_of([&] { writer.begin_file("/", 1); }).status() == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(error_of([&] { writer.begin_file("", 1); }).status() == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(error_of([&] { writer.begin_file(std::string_view("a\0b", 3), 1); }).status() ==
        SBX_STATUS_INVALID_ARGUMENT);
  CHECK(sink.empty());  // nothing was written for rejected entries
  CHECK_THROWS_AS(tar::Writer::single_file_archive_size("../x", 1), Error);
}

TEST_CASE("writer enforces the announced size and the call order") {
  std::string sink;
  tar::Writer writer([&](std::string_view b) { sink.append(b); });
  CHECK_THROWS_AS(writer.write("x"), Error);
  CHECK_THROWS_AS(writer.end_file(), Error);
  writer.begin_file("f", 3);
  CHECK_THROWS_AS(writer.add_directory("d"), Error);
  CHECK_THROWS_AS(writer.begin_file("g", 1), Error);
  CHECK_THROWS_AS(writer.finish(), Error);
  writer.write("ab");
  CHECK_THROWS_AS(writer.write("cd"), Error);
  CHECK_THROWS_AS(writer.end_file(), Error);  // one byte short
  writer.write("c");
  writer.end_file();
  writer.finish();
  CHECK_THROWS_AS(writer.begin_file("h", 1), Error);
  CHECK(sink.size() == 512 + 512 + 1024);
  Collector got = read_all(sink);
  REQUIRE(got.items.size() == 1);
  CHECK(got.items[0].data == "abc");
}

TEST_CASE("sizes of 8 GiB and more: writer header and reader parsing, without the data") {
  const uint64_t huge = (9ull << 30) + 123;
  std::string headers;
  tar::Writer writer([&](std::string_view b) { headers.append(b); });
  writer.begin_file("huge.img", huge);
  // Only headers so far: the PAX header, its payload block, and the ustar header.
  REQUIRE(headers.size() == 3 * 512);
  CHECK(headers[512 + 512 + 156] == '0');
  CHECK(static_cast<unsigned char>(headers[512 + 512 + 124]) == 0x80);  // base-256 size field
  CHECK(headers.substr(512, 512).find("size=" + std::to_string(huge) + "\n") != std::string::npos);

  Collector collector;
  tar::Reader reader(collector);
  reader.feed(headers);
  REQUIRE(collector.items.size() == 1);
  CHECK(collector.items[0].entry.size == huge);
  CHECK(collector.items[0].entry.path == "huge.img");
  CHECK_THROWS_AS(reader.finish(), Error);  // the data never came

  // A header with only a base-256 size (no PAX), as GNU tar writes in its own format.
  std::string field(12, '\0');
  field[0] = static_cast<char>(0x80);
  uint64_t value = huge;
  for (int i = 11; i >= 4; --i, value >>= 8)
    field[i] = static_cast<char>(value & 0xFF);
  Collector base256;
  tar::Reader base256_reader(base256);
  base256_reader.feed(raw_header({"b256", '0', 0, "", true, field}));
  REQUIRE(base256.items.size() == 1);
  CHECK(base256.items[0].entry.size == huge);
  CHECK(base256.items[0].entry.path == "b256");
  CHECK_THROWS_AS(base256_reader.finish(), Error);

  // A PAX size overrides the header's size field.
  std::string payload = pax_record("size", std::to_string(huge));
  Collector pax;
  tar::Reader pax_reader(pax);
  pax_reader.feed(raw_header({"PaxHeader", 'x', payload.size()}) + padded(payload) +
                  raw_header({"p", '0', 0}));
  REQUIRE(pax.items.size() == 1);
  CHECK(pax.items[0].entry.size == huge);
}

TEST_CASE("negative mtimes round-trip through base-256") {
  std::string archive = write_archive({}, {{"old", "x", 0644}}, -86400);
  Collector got = read_all(archive);
  REQUIRE(got.items.size() == 1);
  CHECK(got.items[0].entry.mtime == -86400);
}

TEST_CASE("bad checksums and bad number fields are rejected") {
  std::string archive = write_archive({}, {{"file.txt", "hello", 0644}});
  std::string corrupt = archive;
  corrupt[3] ^= 0x20;  // a byte of the name
  Collector collector;
  tar::Reader reader(collector);
  auto error = error_of([&] { reader.feed(corrupt); });
  CHECK(error.status() == SBX_STATUS_INTERNAL);
  CHECK(std::string(error.what()).find("checksum") != std::string::npos);
  CHECK(collector.items.empty());

  std::string bad_size = raw_header({"x", '0', 0, "", false, std::string("0000000z000\0", 12)});
  Collector c2;
  tar::Reader r2(c2);
  auto bad = error_of([&] { r2.feed(bad_size); });
  CHECK(std::string(bad.what()).find("bad size field") != std::string::npos);
}

TEST_CASE("truncated archives are rejected by finish()") {
  std::string archive =
      write_archive({}, {{long_component('L', 200), random_bytes(2000, 9), 0644}});
  // Offsets: PAX header, PAX payload, ustar header, data (2000 bytes + 48 padding), end blocks.
  for (size_t cut : {size_t{100}, size_t{512}, size_t{1024}, size_t{1536}, size_t{1600},
                     size_t{1536 + 2000}, size_t{1536 + 2001}}) {
    CAPTURE(cut);
    Collector collector;
    tar::Reader reader(collector);
    reader.feed(std::string_view(archive).substr(0, cut));
    CHECK_THROWS_AS(reader.finish(), Error);
    CHECK_FALSE(reader.at_end());
  }
  // Ending right after a complete entry (no end blocks) is accepted, as is a lone zero block.
  for (size_t cut : {size_t{1536 + 2048}, size_t{1536 + 2048 + 512}}) {
    CAPTURE(cut);
    Collector collector;
    tar::Reader reader(collector);
    reader.feed(std::string_view(archive).substr(0, cut));
    CHECK_NOTHROW(reader.finish());
    REQUIRE(collector.items.size() == 1);
    CHECK(collector.items[0].ended);
  }
}

TEST_CASE("symlinks, hardlinks, GNU long names and ignored global headers") {
  const std::string long_target = "targets/" + long_component('t', 180);
  const std::string long_name = "names/" + long_component('n', 180);
  const std::string global = pax_record("path", "should/not/apply") + pax_record("comment", "x");
  const std::string pax = pax_record("linkpath", long_target) + pax_record("mtime", "1.5");
  std::string archive;
  archive += raw_header({"link", '2', 0, "target.txt"});
  archive += raw_header({"hard", '1', 0, "link"});
  archive += raw_header({"pax_global_header", 'g', global.size()});
  archive += padded(global);
  archive += raw_header({"PaxHeader", 'x', pax.size()});
  archive += padded(pax);
  archive += raw_header({"pax-link", '2', 0, "short"});
  archive += raw_header({"././@LongLink", 'L', long_name.size() + 1, "", true});
  archive += padded(long_name + '\0');
  archive += raw_header({"././@LongLink", 'K', long_target.size() + 1, "", true});
  archive += padded(long_target + '\0');
  archive += raw_header({"truncated-name", '2', 0, "truncated-target", true});
  archive += raw_header({"plain", '0', 3}) + padded("abc");
  archive += kEnd;

  for (size_t chunk : {size_t{1}, size_t{7}, archive.size()}) {
    CAPTURE(chunk);
    Collector got = read_chunked(archive, [&] { return chunk; });
    REQUIRE(got.items.size() == 5);
    CHECK(got.items[0].entry.type == tar::EntryType::symlink);
    CHECK(got.items[0].entry.link_target == "target.txt");
    CHECK(got.items[1].entry.type == tar::EntryType::hardlink);
    CHECK(got.items[1].entry.link_target == "link");
    CHECK(got.items[2].entry.path == "pax-link");
    CHECK(got.items[2].entry.link_target == long_target);
    CHECK(got.items[3].entry.path == long_name);
    CHECK(got.items[3].entry.type == tar::EntryType::symlink);
    CHECK(got.items[3].entry.link_target == long_target);
    CHECK(got.items[4].entry.path == "plain");  // the global header's path did not apply
    CHECK(got.items[4].data == "abc");
  }
}

TEST_CASE("malformed extended headers are rejected") {
  auto read_pax = [](const std::string& payload) {
    Collector collector;
    tar::Reader reader(collector);
    reader.feed(raw_header({"PaxHeader", 'x', payload.size()}) + padded(payload) +
                raw_header({"f"}) + kEnd);
  };
  CHECK_NOTHROW(read_pax(pax_record("path", "ok")));
  CHECK_THROWS_AS(read_pax("30 path=too-short-for-its-length\n"), Error);
  CHECK_THROWS_AS(read_pax("5 path=x\n"), Error);
  CHECK_THROWS_AS(read_pax("x path=y\n"), Error);
  CHECK_THROWS_AS(read_pax("11 pathonly\n"), Error);
  CHECK_THROWS_AS(read_pax(pax_record("size", "12abc")), Error);

  // An extended header followed by the end of the archive describes nothing.
  std::string payload = pax_record("path", "x");
  Collector collector;
  tar::Reader reader(collector);
  CHECK_THROWS_AS(reader.feed(raw_header({"P", 'x', payload.size()}) + padded(payload) + kEnd),
                  Error);
}

TEST_CASE("a 64 MiB entry streams through writer and reader in bounded memory") {
  auto resident_bytes = [] {
    long pages = 0, resident = 0;
    std::ifstream("/proc/self/statm") >> pages >> resident;
    return resident * sysconf(_SC_PAGESIZE);
  };
  const uint64_t size = 64ull << 20;
  Collector collector;
  collector.keep_data = false;
  tar::Reader reader(collector);
  uint64_t archive_bytes = 0;
  // The writer's sink feeds the reader directly: no archive or file is ever held in memory.
  tar::Writer writer([&](std::string_view bytes) {
    archive_bytes += bytes.size();
    reader.feed(bytes);
  });
  const long before = resident_bytes();
  std::mt19937_64 engine(7);
  std::string chunk(64 * 1024 + 3, '\0');  // an odd size, so blocks straddle chunks
  uint64_t hash = 14695981039346656037ull;
  writer.begin_file("stream.bin", size);
  for (uint64_t left = size; left > 0;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(left, chunk.size()));
    for (size_t i = 0; i < n; i += 8) {
      uint64_t word = engine();
      std::memcpy(&chunk[i], &word, std::min<size_t>(8, n - i));
    }
    writer.write(std::string_view(chunk).substr(0, n));
    hash = fnv1a(std::string_view(chunk).substr(0, n), hash);
    left -= n;
  }
  writer.end_file();
  writer.finish();
  reader.finish();
  const long growth = resident_bytes() - before;

  REQUIRE(collector.items.size() == 1);
  CHECK(collector.items[0].ended);
  CHECK(collector.data_bytes == size);
  CHECK(collector.hash == hash);
  CHECK(collector.largest_chunk <= chunk.size());
  CHECK(archive_bytes == tar::Writer::single_file_archive_size("stream.bin", size));
  CHECK(growth < (16 << 20));
}

TEST_CASE("GNU tar extracts what the writer writes") {
  TempDir tmp;
  const std::string nested = long_component('a', 100) + "/" + long_component('b', 100) + "/" +
                             long_component('c', 90) + ".txt";  // 292 chars
  std::vector<TestFile> files = {
      {"top.txt", "top level\n", 0644},
      {"bin/run.sh", "#!/bin/sh\necho hi\n", 0755},
      {"secret/key", random_bytes(777, 11), 0600},
      {"data/blob.bin", random_bytes(300'000, 12), 0644},
      {nested, random_bytes(5000, 13), 0640},
      {"empty", "", 0644},
  };
  std::string archive = write_archive({"data", "emptydir"}, files);
  write_file(tmp.path / "archive.tar", archive);
  fs::create_directories(tmp.path / "out");
  run("tar -xf " + (tmp.path / "archive.tar").string() + " -C " + (tmp.path / "out").string());

  for (const auto& file : files) {
    CAPTURE(file.path);
    fs::path path = tmp.path / "out" / file.path;
    REQUIRE(fs::is_regular_file(path));
    CHECK(read_file(path) == file.data);
    struct stat st {};
    REQUIRE(stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == file.mode);
    CHECK(st.st_mtime == 1700000000);
  }
  CHECK(fs::is_directory(tmp.path / "out" / "emptydir"));
  CHECK(fs::is_empty(tmp.path / "out" / "emptydir"));
  // `tar -t` lists exactly what was written, long names included.
  run("tar -tf " + (tmp.path / "archive.tar").string() + " > " + (tmp.path / "list").string());
  std::string listing = read_file(tmp.path / "list");
  CHECK(listing.find(nested + "\n") != std::string::npos);
  CHECK(listing.find("emptydir/\n") != std::string::npos);
}

TEST_CASE("the reader reads GNU tar's pax and gnu formats") {
  TempDir tmp;
  const fs::path src = tmp.path / "src";
  const std::string long_dir = long_component('d', 120) + "/" + long_component('e', 120);
  const std::string long_file = long_dir + "/" + long_component('f', 100);  // 342 chars
  const std::string long_target = "../" + long_component('t', 150);
  std::map<std::string, std::string> contents = {
      {"small.txt", "small\n"},
      {"dir/block.bin", random_bytes(512, 21)},
      {"dir/odd.bin", random_bytes(123'457, 22)},
      {long_file, random_bytes(9000, 23)},
      {"empty", ""},
  };
  for (const auto& [path, data] : contents)
    write_file(src / path, data);
  fs::create_symlink("small.txt", src / "link");
  fs::create_symlink(long_target, src / "longlink");
  fs::create_hard_link(src / "small.txt", src / "hard");

  for (std::string fmt : {"pax", "gnu"}) {
    CAPTURE(fmt);
    fs::path archive = tmp.path / (fmt + ".tar");
    run("tar --format=" + fmt + " -C " + src.string() + " -cf " + archive.string() +
        " small.txt dir " + long_component('d', 120) + " empty link longlink hard");
    const std::string bytes = read_file(archive);
    std::mt19937 engine(5);
    Collector got = read_chunked(bytes, [&] { return size_t{1} + engine() % 1500; });

    for (const auto& [path, data] : contents) {
      CAPTURE(path);
      const auto* item = got.find(path);
      REQUIRE(item != nullptr);
      CHECK(item->entry.type == tar::EntryType::regular);
      CHECK(item->data == data);
    }
    const auto* link = got.find("link");
    REQUIRE(link != nullptr);
    CHECK(link->entry.type == tar::EntryType::symlink);
    CHECK(link->entry.link_target == "small.txt");
    const auto* longlink = got.find("longlink");
    REQUIRE(longlink != nullptr);
    CHECK(longlink->entry.type == tar::EntryType::symlink);
    CHECK(longlink->entry.link_target == long_target);
    const auto* hard = got.find("hard");
    REQUIRE(hard != nullptr);
    CHECK(hard->entry.type == tar::EntryType::hardlink);
    CHECK(hard->entry.link_target == "small.txt");
    CHECK(hard->data.empty());
    const auto* dir = got.find("dir/");
    REQUIRE(dir != nullptr);
    CHECK(dir->entry.type == tar::EntryType::directory);
    const auto* deep = got.find(long_dir + "/");
    REQUIRE(deep != nullptr);
    CHECK(deep->entry.type == tar::EntryType::directory);
    // Entries: 5 files, 2 symlinks, 1 hardlink, dir/, and the two levels of the long directory.
    CHECK(got.items.size() == 11);
  }
}
