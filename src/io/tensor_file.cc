#include "io/tensor_file.h"

namespace qhx {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

TensorFile::TensorFile(const std::filesystem::path& path, MappedFile file)
    : path_(std::make_unique<std::filesystem::path>(path)),
      file_(std::move(file)),
      mapped_(std::make_unique<BorrowedBuffer>(BufferKind::kMappedFile, file_.bytes().data(),
                                               file_.bytes().size(), BorrowedBuffer::kReadOnly)) {}

const TensorView* TensorFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace qhx
