// Streaming tar (POSIX ustar + PAX extended headers) writer and reader for moving files in and out
// of sandboxes, e.g. through the Docker archive API. Neither side buffers file contents: a 1 GiB
// file flows through in small chunks.
#pragma once

#include <sbx/sdk/error.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::sdk::tar {

inline constexpr size_t kBlockSize = 512;

// Writes an archive to `sink`, which receives the bytes in order.
// Paths are relative ("work/in.txt"); a leading "/" is stripped; ".." components are rejected with
// Error::invalid_argument. Names longer than 100 bytes (the ustar name field; the prefix field is
// not used) and sizes of 8 GiB or more get a PAX header; a size that large is also written
// base-256 in the ustar field, as GNU tar does.
class Writer {
 public:
  using Sink = std::function<void(std::string_view bytes)>;
  explicit Writer(Sink sink);

  void add_directory(std::string_view path, uint32_t mode = 0755, int64_t mtime = 0);
  // Starts a regular file of exactly `size` bytes; feed its contents with write(), then end_file().
  void begin_file(std::string_view path, uint64_t size, uint32_t mode = 0644, int64_t mtime = 0);
  void write(std::string_view data);  // throws if more than the announced size
  void end_file();                    // throws if fewer bytes than announced; pads the block
  void finish();                      // writes the two zero blocks that end an archive

  // Exact archive size of one file written with begin_file/end_file/finish and nothing else,
  // for a Content-Length.
  static uint64_t single_file_archive_size(std::string_view path, uint64_t size);

 private:
  void check_between_entries() const;
  void write_header(std::string_view path, char type, uint64_t size, uint32_t mode, int64_t mtime);
  Sink sink_;
  uint64_t remaining_ = 0;
  uint64_t file_size_ = 0;
  bool in_file_ = false;
  bool finished_ = false;
};

enum class EntryType { regular, directory, symlink, hardlink, other };

struct Entry {
  std::string path;  // as stored (directories usually end in '/'), after PAX/GNU long names
  EntryType type = EntryType::other;
  char typeflag = '0';
  uint64_t size = 0;  // data bytes that follow: 0 for links, directories and devices
  uint32_t mode = 0;
  int64_t mtime = 0;
  std::string link_target;
};

// Incremental reader: feed() any chunking of the archive; callbacks fire as entries are decoded.
// Malformed input (bad checksum, bad number field, truncated PAX record) throws
// Error::internal("tar: ..."). Supports ustar, PAX ('x' and 'g') and GNU long names ('L', 'K').
class Reader {
 public:
  struct Handler {
    virtual ~Handler() = default;
    virtual void on_entry(const Entry& entry) = 0;     // header decoded
    virtual void on_data(std::string_view bytes) = 0;  // file contents, in order
    virtual void on_entry_end() = 0;                   // all `size` bytes delivered
  };
  explicit Reader(Handler& handler);

  void feed(std::string_view bytes);
  // Call at end of input: throws if the archive stopped inside an entry. Two zero blocks (or a
  // clean end after a complete entry) are accepted.
  void finish();
  bool at_end() const noexcept { return ended_; }

 private:
  enum class Meta { none, pax, skip, gnu_longname, gnu_longlink };
  void consume(std::string_view& bytes, size_t n);
  void on_header_block(const char* block);
  void begin_meta(Meta kind, uint64_t size);
  void end_data();
  void parse_pax(std::string_view records);

  Handler& handler_;
  std::string pending_;          // a partial header block (at most 512 bytes)
  uint64_t offset_ = 0;          // bytes consumed so far, for messages
  uint64_t data_remaining_ = 0;  // bytes of the current entry's (or extended header's) data to come
  uint64_t padding_remaining_ = 0;
  int zero_blocks_ = 0;
  bool ended_ = false;
  bool in_entry_ = false;        // between a header and the end of its padding
  bool awaiting_entry_ = false;  // an extended header was read; its entry has not come yet
  Meta meta_ = Meta::none;       // what the current data is: file contents or extended header
  std::string meta_buffer_;      // PAX / GNU long-name payload, capped at 1 MiB
  std::optional<std::string> next_path_;
  std::optional<std::string> next_link_;
  std::optional<uint64_t> next_size_;
};

}  // namespace sbx::sdk::tar
