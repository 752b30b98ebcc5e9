// The server's parts and their lifetime: the Host names it answers, the slots and their sessions,
// the threads (workers, preparers, the watch), and the log.
#include "server/server.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include "server/server_impl.h"

namespace qhx::server {
namespace {

constexpr int kPreparers = 2;

}  // namespace

Server::Impl::Impl(qhx_model* m, const ServerOptions& o)
    : options(o), rules(m, o.alias, o.speculative, o.draft_max) {
  if (options.parallel < 1) throw std::runtime_error("--parallel must be at least 1");
  if (options.queue < 0) throw std::runtime_error("--queue must be at least 0");
  if (options.max_connections < 1) throw std::runtime_error("--max-connections must be at least 1");
  if (options.timeout_seconds < 1) throw std::runtime_error("--timeout must be at least 1");
  started_at = static_cast<int64_t>(std::time(nullptr));
  std::random_device entropy;
  id_salt = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();

  // The Host names answered: those `host` stands for (any address of this machine for a wildcard:
  // IP literals cannot be rebound by DNS), and the ones allowed by name.
  const std::string bound = lower(options.host);
  if (is_loopback_name(bound)) {
    host_names = {"localhost", "127.0.0.1", "::1"};
  } else if (is_wildcard_name(bound)) {
    any_ip_host = true;
    host_names = {"localhost"};
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) == 0) host_names.push_back(lower(name));
  }
  host_names.push_back(bound);
  for (const std::string& h : options.allowed_hosts) {
    if (h == "*") any_host = true;
    host_names.push_back(host_name_of(h));
  }

  qhx_session_options session_options;
  qhx_session_options_default(&session_options);
  for (int i = 0; i < options.parallel; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->index = i;
    if (qhx_session_create(rules.model, &session_options, &slot->session) != QHX_OK) {
      const std::string message = qhx_last_error();
      for (auto& s : slots) qhx_session_destroy(s->session);
      throw std::runtime_error(message);
    }
    slots.push_back(std::move(slot));
  }
  for (auto& slot : slots) slot->worker = std::thread([this, s = slot.get()] { work(*s); });
  for (int i = 0; i < kPreparers; ++i) preparers.emplace_back([this] { prepare_loop(); });
  watcher = std::thread([this] { watch_loop(); });
}

Server::Impl::~Impl() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  for (auto& slot : slots) slot->wake.notify_all();
  for (auto& slot : slots) {
    if (slot->worker.joinable()) slot->worker.join();
    qhx_session_destroy(slot->session);
  }
  {
    std::lock_guard lock(prepare_mutex);
    preparers_stop = true;
  }
  prepare_wake.notify_all();
  for (auto& t : preparers) t.join();
  {
    std::lock_guard lock(watch_mutex);
    watch_stop = true;
  }
  watch_wake.notify_all();
  watcher.join();
}

void Server::Impl::log_line(const std::string& line) {
  if (!options.log) return;
  std::lock_guard lock(log_mutex);
  std::fprintf(stderr, "%s\n", line.c_str());
}

void Server::Impl::log_request(Exchange& x) {
  if (!options.log) return;
  std::lock_guard lock(x.mutex);  // a slot's worker may still be finishing it
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - x.start).count();
  char buf[256];
  if (x.done && x.outcome.slot >= 0) {
    const Outcome& o = x.outcome;
    std::snprintf(buf, sizeof buf,
                  "%s %s %d | prompt %lld (reused %lld) | completion %lld | slot %d | %.1f ms",
                  x.method.c_str(), x.path.c_str(), x.status,
                  static_cast<long long>(o.result.n_prompt),
                  static_cast<long long>(o.result.n_reused),
                  static_cast<long long>(o.result.n_generated), o.slot, ms);
  } else {
    std::snprintf(buf, sizeof buf, "%s %s %d | %.1f ms", x.method.c_str(), x.path.c_str(), x.status,
                  ms);
  }
  std::string line = buf;
  if (x.client_gone) line += " | client gone";
  if (x.shutdown) line += " | ended by shutdown";
  if (!x.note.empty()) line += " | " + x.note;
  log_line(line);
}

Server::Server(qhx_model* model, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {}

Server::~Server() {
  stop();
  wait();
}

}  // namespace qhx::server
