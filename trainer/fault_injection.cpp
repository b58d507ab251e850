#include "trainer/fault_injection.h"

#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <regex>
#include <thread>

#include "common/error.h"

namespace llmtrain::trainer {

Fault fault_from_env() {
  const char* v = std::getenv("LLMTRAIN_FAULT");
  if (!v || !*v) return {};
  static const std::regex re(R"((kill|segv|exit|throw|hang|slow)@([0-9]+)(:([0-9]+))?)");
  std::cmatch m;
  if (!std::regex_match(v, m, re))
    throw Error(fmt::format("LLMTRAIN_FAULT={}: expected <kind>@<step>[:<rank>]", v),
                "kinds: kill, segv, exit, throw, hang, slow (a test hook; unset it for real runs)");
  return {m[1].str(), std::stoll(m[2].str()), m[4].matched ? std::stoi(m[4].str()) : -1};
}

double fault_slow_down(const Fault& f, int64_t step, int rank, double compute_s) {
  if (f.kind != "slow" || step < f.step || (f.rank >= 0 && f.rank != rank)) return 0;
  const double seconds = 2 * compute_s;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return seconds;
}

void fault_maybe_fire(const Fault& f, int64_t step, int rank) {
  if (f.kind.empty() || f.step != step || (f.rank >= 0 && f.rank != rank)) return;
  if (f.kind == "kill") std::raise(SIGKILL);
  if (f.kind == "segv") std::raise(SIGSEGV);
  if (f.kind == "exit") std::exit(3);
  if (f.kind == "hang") std::raise(SIGSTOP);
  if (f.kind == "throw") throw environment_error(fmt::format("injected fault (LLMTRAIN_FAULT) after step {}", step));
}

}  // namespace llmtrain::trainer
