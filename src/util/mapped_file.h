// A read-only memory mapping of a whole file (weights are used in place, never copied).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace qhx {

// Opens a file for reading, refusing anything but a regular file (a FIFO would block the open or
// the read forever, a device never end) before anything waits on it. Returns the descriptor;
// throws Error naming the file.
int open_regular_file(const std::filesystem::path& path);
// A whole regular file's bytes.
std::string read_regular_file(const std::filesystem::path& path);

class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);  // throws Error naming the file
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }

  // Drops the resident pages wholly inside [p, p + n) of any read-only file mapping, such as
  // bytes() of one: they stop counting in this process's memory, and come back from the file if
  // read again. For weights a kernel has copied into a layout of its own.
  static void release_pages(const void* p, size_t n);
  // The opposite, ahead of reading all of [p, p + n) once: maps its pages in one call (Linux ≥
  // 5.14; elsewhere reading faults them in as usual), cheaper than a page fault per page.
  static void populate_pages(const void* p, size_t n);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace qhx
