#include "launcher/stop_relay.h"

#include <unistd.h>

#include <atomic>

#include "common/signals.h"

namespace llmtrain::launcher {
namespace {

std::atomic<bool> g_relayed{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_relay_signal(int) {
  // Async-signal-safe: atomics and kill(2) only.
  if (stop_requested() || g_relayed.exchange(true)) return;
  ::kill(::getpid(), SIGTERM);
}

}  // namespace

void install_stop_relay() { install_signal_handler(kStopRelaySignal, on_relay_signal); }

}  // namespace llmtrain::launcher
