#include "common/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace llmtrain {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void on_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    // The second signal: leave now, without running anything that is not async-signal-safe.
    static const char msg[] = "\nllmtrain: second signal, exiting without a checkpoint\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(128 + sig);
  }
}

}  // namespace

void install_stop_handlers() {
  install_signal_handler(SIGTERM, on_signal);
  install_signal_handler(SIGINT, on_signal);
}

void remove_stop_handlers() {
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
}

bool stop_requested() { return g_signal.load() != 0; }
int stop_signal() { return g_signal.load(); }

struct sigaction install_signal_handler(int sig, void (*handler)(int)) {
  struct sigaction sa {
  }, previous{};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, &previous);
  return previous;
}

}  // namespace llmtrain
