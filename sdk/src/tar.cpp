#include <sbx/sdk/tar.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace sbx::sdk::tar {
namespace {

// ustar header layout: offset and width of each field.
struct Field {
  size_t offset, width;
};
constexpr Field kName{0, 100}, kMode{100, 8}, kUid{108, 8}, kGid{116, 8}, kSize{124, 12},
    kMtime{136, 12}, kChecksum{148, 8}, kTypeflag{156, 1}, kLinkname{157, 100}, kMagic{257, 6},
    kVersion{263, 2}, kPrefix{345, 155};

constexpr uint64_t kMaxOctalSize = 077777777777;  // 11 octal digits: 8 GiB - 1
constexpr size_t kMaxMetaPayload = 1 << 20;       // PAX / GNU long-name data we buffer
constexpr std::string_view kPaxHeaderName = "././@PaxHeader";
constexpr std::array<char, 2 * kBlockSize> kZeros{};

uint64_t padding_for(uint64_t size) {
  return (kBlockSize - size % kBlockSize) % kBlockSize;
}
uint64_t round_up(uint64_t size) {
  return size + padding_for(size);
}

[[noreturn]] void fail(const std::string& message) {
  throw Error::internal("tar: " + message);
}

// ---- Writing ----------------------------------------------------------------------------------

// "a/./b//c" -> "a/b/c"; a leading "/" is dropped; ".." is refused so an archive can never point
// outside the directory it is extracted into.
std::string normalize_path(std::string_view path) {
  if (path.find('\0') != std::string_view::npos) {
    throw Error::invalid_argument("tar: path contains a NUL byte");
  }
  std::string result;
  for (size_t start = 0; start <= path.size();) {
    size_t end = std::min(path.find('/', start), path.size());
    std::string_view part = path.substr(start, end - start);
    start = end + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      throw Error::invalid_argument("tar: path '" + std::string(path) + "' contains '..'");
    }
    if (!result.empty()) result += '/';
    result += part;
  }
  if (result.empty()) throw Error::invalid_argument("tar: empty path '" + std::string(path) + "'");
  return result;
}

// One PAX record, "<length> <key>=<value>\n", where <length> counts its own digits too.
std::string pax_record(std::string_view key, std::string_view value) {
  const size_t body = key.size() + value.size() + 3;  // ' ', '=' and '\n'
  size_t length = body + 1;
  while (length != body + std::to_string(length).size())
    ++length;
  return std::to_string(length) + " " + std::string(key) + "=" + std::string(value) + "\n";
}

// The PAX records an entry needs, or "" when plain ustar fields suffice.
std::string pax_payload(std::string_view name, uint64_t size) {
  std::string payload;
  if (name.size() > kName.width) payload += pax_record("path", name);
  if (size > kMaxOctalSize) payload += pax_record("size", std::to_string(size));
  return payload;
}

void put_string(char* block, Field field, std::string_view text) {
  std::memcpy(block + field.offset, text.data(), std::min(text.size(), field.width));
}

// Octal with a terminating NUL when it fits, else GNU base-256 (big-endian two's complement with
// the top bit of the first byte set), which GNU tar, bsdtar and Go's archive/tar all read.
void put_number(char* block, Field field, int64_t value) {
  char* out = block + field.offset;
  const size_t digits = field.width - 1;
  if (value >= 0 && static_cast<uint64_t>(value) < (uint64_t{1} << (3 * digits))) {
    for (size_t i = digits; i-- > 0; value >>= 3)
      out[i] = static_cast<char>('0' + (value & 7));
    out[digits] = '\0';
    return;
  }
  out[0] = static_cast<char>(value < 0 ? 0xFF : 0x80);
  for (size_t i = field.width - 1; i >= 1; --i, value >>= 8) {  // >> is arithmetic in C++20
    out[i] = static_cast<char>(value & 0xFF);
  }
}

unsigned unsigned_checksum(const char* block) {
  unsigned sum = 0;
  for (size_t i = 0; i < kBlockSize; ++i) {
    bool in_field = i >= kChecksum.offset && i < kChecksum.offset + kChecksum.width;
    sum += in_field ? ' ' : static_cast<unsigned char>(block[i]);
  }
  return sum;
}

std::array<char, kBlockSize> make_header(std::string_view name, char type, uint64_t size,
                                         uint32_t mode, int64_t mtime) {
  std::array<char, kBlockSize> block{};
  char* b = block.data();
  put_string(b, kName, name);
  put_number(b, kMode, mode & 07777);
  put_number(b, kUid, 0);
  put_number(b, kGid, 0);
  put_number(b, kSize, static_cast<int64_t>(size));
  put_number(b, kMtime, mtime);
  b[kTypeflag.offset] = type;
  put_string(b, kMagic, std::string_view("ustar", 6));  // with its NUL
  put_string(b, kVersion, "00");
  char checksum[8];
  std::snprintf(checksum, sizeof checksum, "%06o", unsigned_checksum(b));
  std::memcpy(b + kChecksum.offset, checksum, 7);  // six octal digits and a NUL, then a space
  b[kChecksum.offset + 7] = ' ';
  return block;
}

// ---- Reading ----------------------------------------------------------------------------------

std::string_view field_text(const char* block, Field field) {
  std::string_view text(block + field.offset, field.width);
  return text.substr(0, text.find('\0'));
}

// A numeric header field: octal (space/NUL padded) or base-256.
int64_t parse_number(const char* block, Field field, std::string_view what) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(block + field.offset);
  if (bytes[0] & 0x80) {
    const bool negative = bytes[0] & 0x40;
    uint64_t value = negative ? ~uint64_t{0x7F} | bytes[0] : bytes[0] & 0x3F;
    for (size_t i = 1; i < field.width; ++i) {
      if ((value >> 55) != (negative ? 0x1FF : 0)) fail(std::string(what) + " field overflows");
      value = (value << 8) | bytes[i];
    }
    return static_cast<int64_t>(value);
  }
  std::string_view text(block + field.offset, field.width);
  size_t i = 0;
  while (i < text.size() && text[i] == ' ')
    ++i;
  uint64_t value = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '7'; ++i) {
    if (value >> 60) fail(std::string(what) + " field overflows");
    value = value * 8 + static_cast<uint64_t>(text[i] - '0');
  }
  for (; i < text.size(); ++i) {
    if (text[i] != ' ' && text[i] != '\0') fail("bad " + std::string(what) + " field");
  }
  return static_cast<int64_t>(value);
}

bool is_zero_block(const char* block) {
  return std::all_of(block, block + kBlockSize, [](char c) { return c == '\0'; });
}

// Types whose size field describes no data in the archive.
bool header_only(char typeflag) {
  return typeflag >= '1' && typeflag <= '6';
}

EntryType entry_type(char typeflag, std::string_view path) {
  switch (typeflag) {
    case '0':
    case '\0':
    case '7':  // contiguous file, a regular file everywhere else
      // Pre-POSIX archives mark directories with a trailing slash only.
      return !path.empty() && path.back() == '/' ? EntryType::directory : EntryType::regular;
    case '5':
      return EntryType::directory;
    case '2':
      return EntryType::symlink;
    case '1':
      return EntryType::hardlink;
    default:
      return EntryType::other;
  }
}

uint64_t parse_decimal(std::string_view text, std::string_view what) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    fail("bad " + std::string(what) + " '" + std::string(text) + "'");
  }
  return value;
}

}  // namespace

// ---- Writer -----------------------------------------------------------------------------------

Writer::Writer(Sink sink) : sink_(std::move(sink)) {}

void Writer::check_between_entries() const {
  if (finished_) fail("archive already finished");
  if (in_file_) fail("the previous file was not ended");
}

void Writer::write_header(std::string_view path, char type, uint64_t size, uint32_t mode,
                          int64_t mtime) {
  std::string payload = pax_payload(path, size);
  if (!payload.empty()) {
    auto pax = make_header(kPaxHeaderName, 'x', payload.size(), 0644, mtime);
    sink_({pax.data(), pax.size()});
    sink_(payload);
    sink_({kZeros.data(), padding_for(payload.size())});
  }
  auto header = make_header(path, type, size, mode, mtime);
  sink_({header.data(), header.size()});
}

void Writer::add_directory(std::string_view path, uint32_t mode, int64_t mtime) {
  check_between_entries();
  write_header(normalize_path(path) + "/", '5', 0, mode, mtime);
}

void Writer::begin_file(std::string_view path, uint64_t size, uint32_t mode, int64_t mtime) {
  check_between_entries();
  if (size > static_cast<uint64_t>(INT64_MAX)) throw Error::invalid_argument("tar: file too large");
  write_header(normalize_path(path), '0', size, mode, mtime);
  in_file_ = true;
  file_size_ = size;
  remaining_ = size;
}

void Writer::write(std::string_view data) {
  if (!in_file_) fail("write() outside a file");
  if (data.size() > remaining_) {
    fail("write() beyond the announced size of " + std::to_string(file_size_) + " bytes");
  }
  remaining_ -= data.size();
  if (!data.empty()) sink_(data);
}

void Writer::end_file() {
  if (!in_file_) fail("end_file() outside a file");
  if (remaining_ != 0) {
    fail("file ended " + std::to_string(remaining_) + " bytes short of the announced " +
         std::to_string(file_size_));
  }
  in_file_ = false;
  sink_({kZeros.data(), padding_for(file_size_)});
}

void Writer::finish() {
  check_between_entries();
  finished_ = true;
  sink_({kZeros.data(), kZeros.size()});
}

uint64_t Writer::single_file_archive_size(std::string_view path, uint64_t size) {
  std::string payload = pax_payload(normalize_path(path), size);
  uint64_t pax = payload.empty() ? 0 : kBlockSize + round_up(payload.size());
  return pax + kBlockSize + round_up(size) + 2 * kBlockSize;
}

// ---- Reader -----------------------------------------------------------------------------------

Reader::Reader(Handler& handler) : handler_(handler) {}

void Reader::feed(std::string_view bytes) {
  while (!bytes.empty() && !ended_) {
    if (data_remaining_ > 0) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(data_remaining_, bytes.size()));
      if (meta_ == Meta::none) {
        handler_.on_data(bytes.substr(0, n));
      } else if (meta_ != Meta::skip) {
        meta_buffer_.append(bytes.data(), n);
      }
      data_remaining_ -= n;
      consume(bytes, n);
      if (data_remaining_ == 0) end_data();
    } else if (padding_remaining_ > 0) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(padding_remaining_, bytes.size()));
      padding_remaining_ -= n;
      consume(bytes, n);
      if (padding_remaining_ == 0) in_entry_ = false;
    } else {
      size_t n = std::min(kBlockSize - pending_.size(), bytes.size());
      pending_.append(bytes.data(), n);
      consume(bytes, n);
      if (pending_.size() == kBlockSize) {
        on_header_block(pending_.data());
        pending_.clear();
      }
    }
  }
  // After the end-of-archive blocks only record padding follows; it is ignored.
}

void Reader::consume(std::string_view& bytes, size_t n) {
  bytes.remove_prefix(n);
  offset_ += n;
}

void Reader::finish() {
  if (ended_) return;
  if (in_entry_ || !pending_.empty() || awaiting_entry_) {
    fail("archive truncated at offset " + std::to_string(offset_));
  }
}

void Reader::on_header_block(const char* block) {
  const uint64_t header_offset = offset_ - kBlockSize;
  if (is_zero_block(block)) {
    if (awaiting_entry_) fail("extended header not followed by an entry");
    // Two zero blocks end the archive; a lone one is tolerated, as GNU tar does.
    if (++zero_blocks_ == 2) ended_ = true;
    return;
  }
  zero_blocks_ = 0;

  const auto stored = static_cast<unsigned>(parse_number(block, kChecksum, "checksum"));
  unsigned sum = unsigned_checksum(block);
  int signed_sum = 0;  // some historic writers summed signed chars
  for (size_t i = 0; i < kBlockSize; ++i) {
    bool in_field = i >= kChecksum.offset && i < kChecksum.offset + kChecksum.width;
    signed_sum += in_field ? ' ' : static_cast<signed char>(block[i]);
  }
  if (stored != sum && static_cast<int>(stored) != signed_sum) {
    fail("header checksum mismatch at offset " + std::to_string(header_offset));
  }

  const char typeflag = block[kTypeflag.offset];
  const int64_t size = parse_number(block, kSize, "size");
  if (size < 0) fail("negative size at offset " + std::to_string(header_offset));

  in_entry_ = true;
  switch (typeflag) {
    case 'x':
      return begin_meta(Meta::pax, static_cast<uint64_t>(size));
    case 'g':
      return begin_meta(Meta::skip, static_cast<uint64_t>(size));  // global: ignored
    case 'L':
      return begin_meta(Meta::gnu_longname, static_cast<uint64_t>(size));
    case 'K':
      return begin_meta(Meta::gnu_longlink, static_cast<uint64_t>(size));
    default:
      break;
  }

  Entry entry;
  if (next_path_) {
    entry.path = std::move(*next_path_);
  } else {
    entry.path = std::string(field_text(block, kName));
    // POSIX ustar keeps a prefix; GNU's "ustar  " magic uses that area for other things.
    std::string_view prefix = field_text(block, kPrefix);
    if (field_text(block, kMagic) == "ustar" && !prefix.empty()) {
      entry.path = std::string(prefix) + "/" + entry.path;
    }
  }
  entry.link_target =
      next_link_ ? std::move(*next_link_) : std::string(field_text(block, kLinkname));
  entry.typeflag = typeflag;
  entry.type = entry_type(typeflag, entry.path);
  entry.size = header_only(typeflag) ? 0 : next_size_.value_or(static_cast<uint64_t>(size));
  entry.mode = static_cast<uint32_t>(parse_number(block, kMode, "mode"));
  entry.mtime = parse_number(block, kMtime, "mtime");
  next_path_.reset();
  next_link_.reset();
  next_size_.reset();
  awaiting_entry_ = false;

  meta_ = Meta::none;
  data_remaining_ = entry.size;
  padding_remaining_ = padding_for(entry.size);
  handler_.on_entry(entry);
  if (data_remaining_ == 0) end_data();
}

void Reader::begin_meta(Meta kind, uint64_t size) {
  if (kind != Meta::skip && size > kMaxMetaPayload) {
    fail("extended header of " + std::to_string(size) + " bytes is too large");
  }
  meta_ = kind;
  meta_buffer_.clear();
  data_remaining_ = size;
  padding_remaining_ = padding_for(size);
  if (kind != Meta::skip) awaiting_entry_ = true;
  if (size == 0) end_data();
}

void Reader::end_data() {
  if (padding_remaining_ == 0) in_entry_ = false;
  switch (meta_) {
    case Meta::none:
      handler_.on_entry_end();
      return;
    case Meta::skip:
      break;
    case Meta::pax:
      parse_pax(meta_buffer_);
      break;
    case Meta::gnu_longname:
      next_path_ = meta_buffer_.substr(0, meta_buffer_.find('\0'));
      break;
    case Meta::gnu_longlink:
      next_link_ = meta_buffer_.substr(0, meta_buffer_.find('\0'));
      break;
  }
  meta_ = Meta::none;
  meta_buffer_.clear();
}

// Records are "<length> <key>=<value>\n"; only the keys that change how entries are read matter.
void Reader::parse_pax(std::string_view records) {
  while (!records.empty()) {
    size_t space = records.find(' ');
    if (space == std::string_view::npos) fail("truncated PAX record");
    uint64_t length = parse_decimal(records.substr(0, space), "PAX record length");
    if (length <= space + 1 || length > records.size() || records[length - 1] != '\n') {
      fail("truncated PAX record");
    }
    std::string_view record = records.substr(space + 1, length - space - 2);
    records.remove_prefix(length);
    size_t equals = record.find('=');
    if (equals == std::string_view::npos) fail("PAX record without '='");
    std::string_view key = record.substr(0, equals), value = record.substr(equals + 1);
    if (key == "path") {
      next_path_ = std::string(value);
    } else if (key == "linkpath") {
      next_link_ = std::string(value);
    } else if (key == "size") {
      next_size_ = parse_decimal(value, "PAX size");
    }
  }
}

}  // namespace sbx::sdk::tar
