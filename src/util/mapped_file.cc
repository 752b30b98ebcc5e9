#include "util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "util/error.h"

namespace qhx {

int open_regular_file(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer; for a regular file it means nothing.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path.string(), std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path.string(), "not a regular file");
  }
  return fd;
}

std::string read_regular_file(const std::filesystem::path& path) {
  const int fd = open_regular_file(path);
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      fail(path.string(), std::string("read error: ") + std::strerror(e));
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return bytes;
}

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  const int fd = open_regular_file(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(path.string(), std::string("cannot stat: ") + std::strerror(e));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail(path.string(), std::string("cannot map: ") + std::strerror(errno));
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
}

namespace {

// madvise on the pages of [p, p + n): those wholly inside it (inner) or all it touches.
void advise_pages(const void* p, size_t n, bool inner, int advice) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(p), last = first + n;
  const uintptr_t begin = inner ? (first + page - 1) / page * page : first / page * page;
  const uintptr_t end = inner ? last / page * page : (last + page - 1) / page * page;
  // Advice only: if the kernel declines, the pages stay as they are.
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, advice);
}

}  // namespace

void MappedFile::release_pages(const void* p, size_t n) {
  advise_pages(p, n, /*inner=*/true, MADV_DONTNEED);
}

void MappedFile::populate_pages(const void* p, size_t n) {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14; older kernels reject it, harmlessly
#endif
  advise_pages(p, n, /*inner=*/false, MADV_POPULATE_READ);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace qhx
