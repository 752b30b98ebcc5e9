// A float array of a sequence's state (a KV cache, a conv or recurrent state), in memory of the
// backend the sequence runs on (allocated through that backend's buffer type). It behaves as a
// std::vector<float> does: resize keeps the contents, grows the capacity at least twofold and
// zeroes new elements; reserve is exact; a copy is a deep snapshot of the elements in use, in a
// buffer of the same type.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/buffer.h"

namespace qhx {

class StateBuffer {
 public:
  StateBuffer() = default;  // no memory: only assignment gives it some
  explicit StateBuffer(const BufferType& type, int64_t size = 0);
  StateBuffer(const StateBuffer& other);
  StateBuffer& operator=(const StateBuffer& other);
  StateBuffer(StateBuffer&&) noexcept = default;
  StateBuffer& operator=(StateBuffer&&) noexcept = default;

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t capacity() const;
  const BufferType* type() const { return type_; }
  Buffer* buffer() const { return buffer_.get(); }

  // The elements where the host addresses them (null when empty and never allocated). Error when
  // the backend's memory is not host-addressable. The host may write through it: it drops the
  // shadow.
  float* data() const;
  std::span<const float> host_span() const { return {data(), static_cast<size_t>(size_)}; }

  void resize(int64_t size);
  void reserve(int64_t capacity);
  void clear() { size_ = 0; }
  void fill_zero();
  // size() becomes values.size(), with these elements.
  void assign(std::span<const float> values);
  std::vector<float> to_vector() const;

  // A backend's private copy of the elements (a discrete GPU's device-local memory, which it
  // reads faster than this buffer), which that backend keeps equal to this one, or ahead of it
  // while it marks this one behind (behind_shadow below). Anything that may
  // change the elements through the host (data(), assign, fill_zero, assignment) drops it;
  // resize and reserve keep it, as the backend writes the elements they add itself.
  Buffer* shadow() const { return shadow_.get(); }
  // Installs a new shadow; returns the old one (work the backend recorded may still use it).
  std::unique_ptr<Buffer> replace_shadow(std::unique_ptr<Buffer> shadow) const;
  // Whether the shadow holds newer elements than this buffer: a backend that keeps the states
  // it computes in their shadows past a pass (Backend::keep_states) marks them so until it
  // writes them back. Reading the elements through the host meanwhile is an error (it would
  // read old ones); replacing them through the host (assign, fill_zero, assignment) clears it.
  bool behind_shadow() const { return behind_shadow_; }
  void set_behind_shadow(bool behind) const { behind_shadow_ = behind; }
  // The newer elements are lost (the device that held them failed): this buffer's are the
  // state's again, and the shadow is dropped.
  void forget_shadow() const;

 private:
  void reallocate(int64_t capacity);  // keeps the first size_ elements
  void check_current() const;         // before the host reads the elements
  void zero(int64_t begin, int64_t end);

  const BufferType* type_ = nullptr;
  std::unique_ptr<Buffer> buffer_;
  int64_t size_ = 0;
  mutable std::unique_ptr<Buffer> shadow_;  // not copied: a copy's host elements are its truth
  mutable bool behind_shadow_ = false;
};

}  // namespace qhx
