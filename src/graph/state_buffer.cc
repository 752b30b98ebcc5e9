#include "graph/state_buffer.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace qhx {

StateBuffer::StateBuffer(const BufferType& type, int64_t size) : type_(&type) {
  resize(size);
}

StateBuffer::StateBuffer(const StateBuffer& other) : type_(other.type_) {
  other.check_current();
  if (other.size_ > 0) {
    reallocate(other.size_);
    copy_bytes(*other.buffer_, 0, *buffer_, 0, other.size_ * sizeof(float));
  }
  size_ = other.size_;
}

StateBuffer& StateBuffer::operator=(const StateBuffer& other) {
  if (this == &other) return *this;
  other.check_current();
  shadow_.reset();
  behind_shadow_ = false;
  type_ = other.type_;
  size_ = 0;
  // Kept when large enough and of the same type, as a vector keeps its capacity.
  if (buffer_ != nullptr && buffer_->type() != type_) buffer_.reset();
  if (capacity() < other.size_) reallocate(other.size_);
  if (other.size_ > 0) copy_bytes(*other.buffer_, 0, *buffer_, 0, other.size_ * sizeof(float));
  size_ = other.size_;
  return *this;
}

int64_t StateBuffer::capacity() const {
  return buffer_ == nullptr ? 0 : static_cast<int64_t>(buffer_->bytes() / sizeof(float));
}

void StateBuffer::check_current() const {
  if (behind_shadow_) {
    fail("state", "read by the host while a device holds newer elements of it (not written back)");
  }
}

void StateBuffer::forget_shadow() const {
  shadow_.reset();
  behind_shadow_ = false;
}

float* StateBuffer::data() const {
  check_current();
  if (shadow_ != nullptr) shadow_.reset();  // no write without a shadow: readers may share a state
  if (buffer_ == nullptr) return nullptr;
  if (buffer_->host() == nullptr) {
    fail("state", "the " + type_->name() + " memory it lives in is not addressable by the host");
  }
  return reinterpret_cast<float*>(buffer_->host());
}

void StateBuffer::reallocate(int64_t capacity) {
  if (type_ == nullptr) fail("state", "a state buffer without a buffer type cannot grow");
  std::unique_ptr<Buffer> grown = type_->allocate(capacity * sizeof(float));
  if (size_ > 0) copy_bytes(*buffer_, 0, *grown, 0, size_ * sizeof(float));
  buffer_ = std::move(grown);
}

void StateBuffer::reserve(int64_t capacity) {
  if (capacity > this->capacity()) reallocate(capacity);
}

void StateBuffer::resize(int64_t size) {
  if (size < 0) fail("state", "negative size");
  if (size > capacity()) {
    reallocate(std::max(size, 2 * capacity()));  // fresh memory is zeroed
  } else if (size > size_) {
    zero(size_, size);
  }
  size_ = size;
}

void StateBuffer::fill_zero() {
  forget_shadow();
  zero(0, size_);
}

void StateBuffer::zero(int64_t begin, int64_t end) {
  if (begin == end) return;
  const size_t offset = begin * sizeof(float), n = (end - begin) * sizeof(float);
  if (std::byte* host = buffer_->host()) {
    std::memset(host + offset, 0, n);
  } else {
    const std::vector<std::byte> zeros(n);
    buffer_->write(offset, zeros.data(), n);
  }
}

void StateBuffer::assign(std::span<const float> values) {
  forget_shadow();
  size_ = 0;
  reserve(static_cast<int64_t>(values.size()));
  if (!values.empty()) buffer_->write(0, values.data(), values.size_bytes());
  size_ = static_cast<int64_t>(values.size());
}

std::unique_ptr<Buffer> StateBuffer::replace_shadow(std::unique_ptr<Buffer> shadow) const {
  std::swap(shadow_, shadow);
  return shadow;
}

std::vector<float> StateBuffer::to_vector() const {
  check_current();
  std::vector<float> out(size_);
  if (size_ > 0) buffer_->read(0, out.data(), size_ * sizeof(float));
  return out;
}

}  // namespace qhx
