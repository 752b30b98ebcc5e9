// qhx serve: opens the model, runs src/server on it, and stops it cleanly on SIGINT or SIGTERM.
#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "commands.h"
#include "qhx/qhx.h"
#include "server/server.h"

namespace qhx::cli {

namespace {

// Waits for SIGINT or SIGTERM (blocked in every thread) on a thread of its own, from before the
// model opens: while it opens (minutes for a large bundle with --verify, a GPU upload, the
// device check) there is nothing to end cleanly and the process exits at once; while the server
// serves, it is stopped as Server::stop() does; after that, signals change nothing.
class StopSignals {
 public:
  explicit StopSignals(const sigset_t& signals) : signals_(signals), waiter_([this] { wait(); }) {}
  ~StopSignals() {
    {
      std::lock_guard lock(mutex_);
      phase_ = Phase::kDone;
      if (waiting_) pthread_kill(waiter_.native_handle(), SIGTERM);  // wakes it, to no effect
    }
    waiter_.join();
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // While it lives, a signal stops `server`; then signals change nothing.
  class Serving {
   public:
    Serving(StopSignals& signals, qhx::server::Server& server) : signals_(signals) {
      signals_.set(Phase::kServing, &server);
    }
    ~Serving() { signals_.set(Phase::kDone, nullptr); }  // waits for a stop() under way
    Serving(const Serving&) = delete;
    Serving& operator=(const Serving&) = delete;

   private:
    StopSignals& signals_;
  };

 private:
  enum class Phase { kOpening, kServing, kDone };

  void set(Phase phase, qhx::server::Server* server) {
    std::lock_guard lock(mutex_);
    phase_ = phase;
    server_ = server;
  }

  void wait() {
    int signal_number = 0;
    sigwait(&signals_, &signal_number);
    std::lock_guard lock(mutex_);
    waiting_ = false;
    if (phase_ == Phase::kDone) return;
    if (phase_ == Phase::kOpening) {
      std::fprintf(stderr, "stopping (signal %d) before serving\n", signal_number);
      std::_Exit(0);
    }
    std::fprintf(stderr, "stopping (signal %d)\n", signal_number);
    server_->stop();
  }

  sigset_t signals_;
  std::mutex mutex_;
  Phase phase_ = Phase::kOpening;
  qhx::server::Server* server_ = nullptr;
  bool waiting_ = true;
  std::thread waiter_;  // last: it starts once the members above exist
};

}  // namespace

// The OpenAI-compatible server (src/server), on the C API like any other embedder of qhx.
int run_serve(const ServeArgs& serve_args) {
  // CLI11 takes an empty QHX_API_KEY for an unset one: a key set empty would turn authentication
  // off without a word (--api-key "" is refused by its parser; a key given with it wins).
  if (const char* key = std::getenv("QHX_API_KEY");
      key != nullptr && *key == '\0' && serve_args.server.api_key.empty()) {
    std::fprintf(stderr,
                 "qhx: error: QHX_API_KEY: is set but empty, which would turn authentication "
                 "off: give a key, or unset it\n");
    return 1;
  }
#ifdef __GLIBC__
  // Blocks of 1 MiB or more (KV caches, the prefix cache's states, logits) are mapped on their own
  // and unmapped when freed. glibc's moving threshold would put them in its heaps after the first
  // such free, and RSS would keep what the prefix cache evicted until the next trim.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
  // SIGINT and SIGTERM stop the server cleanly: they are blocked before anything starts a thread
  // (the model's compute threads, a GPU driver's), so that every thread inherits the mask and
  // none takes the signal's default action, and one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  StopSignals stop(stop_signals);
  ServeArgs args = serve_args;
  args.server.speculative = args.speculative.kind();
  args.server.draft_max = args.speculative.draft_max;
  qhx_model_options options;
  qhx_model_options_default(&options);
  options.n_threads = args.threads;
  options.context_length = args.ctx_size;
  options.max_sessions = args.server.parallel;
  options.prefix_cache_bytes = args.cache_mb << 20;
  options.verify_sha256 = args.verify;
  options.device = args.devices.device.c_str();
  options.decode_device = args.devices.decode_or_null();
  options.device_check = args.devices.device_check.c_str();
  options.kv_type = args.devices.kv_type.c_str();
  if (!args.devices.qnn_lib.empty()) options.qnn_lib = args.devices.qnn_lib.c_str();
  if (!args.devices.npu_pack.empty()) options.npu_pack = args.devices.npu_pack.c_str();
  options.draft_model = args.speculative.draft_model();
  options.mtp_vocab_size = args.speculative.mtp_vocab;
  qhx_model* model = nullptr;
  if (qhx_model_open(args.model.c_str(), &options, &model) != QHX_OK) {
    std::fprintf(stderr, "qhx: error: %s\n", qhx_last_error());
    return 1;
  }
  qhx_model_info info{};
  qhx_model_get_info(model, &info);
  std::fprintf(stderr,
               "model %s (%s): context %lld tokens x %d sessions, memory estimate %.1f MB%s%s\n",
               info.name, info.family, static_cast<long long>(info.context_length),
               args.server.parallel, static_cast<double>(info.memory_estimate) / (1 << 20),
               *info.admission_note != '\0' ? " | " : "", info.admission_note);
  std::fprintf(stderr, "devices: prompts on %s, replies on %s%s%s\n", info.prefill_device,
               info.decode_device, *info.device_note != '\0' ? " | " : "", info.device_note);
  print_model_note(info, "");
  int status = 0;
  try {
    qhx::server::Server server(model, args.server);
    const int port = server.start();
    std::fprintf(stderr, "listening on http://%s:%d (%d slots, queue %d)\n",
                 args.server.host.c_str(), port, args.server.parallel, args.server.queue);
    const StopSignals::Serving serving(stop, server);
    server.wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qhx: error: %s\n", e.what());
    status = 1;
  }
  qhx_model_close(model);
  return status;
}

}  // namespace qhx::cli
