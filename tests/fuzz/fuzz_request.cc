// Fuzz target: any bytes as the body of a completion or chat request (the first byte picks which)
// must be served or refused with an HTTP status, never crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "qhx/qhx.h"
#include "server/server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static qhx_model* model = [] {
    qhx_model_options options;
    qhx_model_options_default(&options);
    options.context_length = 512;
    options.max_sessions = 1;
    qhx_model* m = nullptr;
    if (qhx_model_open(QHX_SOURCE_DIR "/models/qwen3.5-tiny-random", &options, &m) != QHX_OK) {
      __builtin_trap();
    }
    return m;
  }();
  if (size == 0) return 0;
  const std::string path = data[0] % 2 ? "/v1/chat/completions" : "/v1/completions";
  std::string error;
  const int status = qhx::server::check_request(
      model, path, std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), &error);
  if (status != 0 && (status < 400 || status > 599 || error.empty())) __builtin_trap();
  return 0;
}
