#include "trainer/report/metrics.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/file_io.h"
#include "common/strings.h"

namespace llmtrain::trainer {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// JSON has no NaN/Inf: a non-finite value is written as null.
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

PhaseTimes& PhaseTimes::operator+=(const PhaseTimes& o) {
  data += o.data, forward += o.forward, backward += o.backward, grad_sync += o.grad_sync;
  optimizer += o.optimizer, checkpoint += o.checkpoint;
  return *this;
}

MetricsLog::MetricsLog(const std::string& dir, int64_t resume_step) {
  if (dir.empty()) return;
  path_ = (fs::path(dir) / "metrics.jsonl").string();
  if (resume_step >= 0 && fs::exists(path_)) {
    std::ifstream in(path_);
    std::string line, kept;
    while (std::getline(in, line)) {
      json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) continue;  // a line cut short by a crash
      // (Steps as JSON integers in [0, 2^63): another type, a float cast, or an unsigned 2^64 − 1
      // read as −1, is not a record of ours.)
      const auto step = j.is_object() ? j.find("step") : j.end();
      const bool integer = step != j.end() && step->is_number_integer() &&
                           !(step->is_number_unsigned() && step->get<uint64_t>() > uint64_t(INT64_MAX));
      if (integer && step->get<int64_t>() >= 0 && step->get<int64_t>() <= resume_step) kept += line + "\n";
    }
    write_file_atomic(default_file_system(), path_, kept);
  }
  file_ = open_append(path_);
  if (!file_) throw environment_error(fmt::format("cannot open {} for appending", path_), "check the run directory");
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::append(const json& j) {
  if (!file_) return;
  std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw environment_error(fmt::format("cannot write {}", path_), "the disk may be full");
}

void MetricsLog::write(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", number(m.loss)},
                      {"lr", m.lr},
                      {"grad_norm", number(m.grad_norm)},
                      {"tokens_per_s", number(m.tokens_per_s)},
                      {"mfu", number(m.mfu)},
                      {"elapsed_s", m.elapsed_s},
                      {"tokens", m.tokens},
                      {"skipped_steps", m.skipped_steps}};
  if (m.loss_scale > 0) j["loss_scale"] = m.loss_scale;
  if (m.comm_exposed >= 0) j["comm_exposed"] = m.comm_exposed;
  const PhaseTimes& t = m.per_step;
  j["t_data_ms"] = 1e3 * t.data;
  j["t_forward_ms"] = 1e3 * t.forward;
  j["t_backward_ms"] = 1e3 * t.backward;
  j["t_grad_sync_ms"] = 1e3 * t.grad_sync;
  j["t_optimizer_ms"] = 1e3 * t.optimizer;
  j["t_checkpoint_ms"] = 1e3 * t.checkpoint;
  if (m.slowest_vs_median > 0) j["slowest_vs_median"] = m.slowest_vs_median;
  if (!m.stragglers.empty()) j["stragglers"] = m.stragglers;
  // MoE blocks: flat fields per block (moe_l<layer>_<what>, so `llmtrain plot --metric` draws any of
  // them) and the sums over blocks.
  if (!m.moe.empty()) {
    double aux = 0, z = 0, dropped = 0;
    for (const MoeLayerStats& l : m.moe) {
      const std::string p = fmt::format("moe_l{}_", l.layer);
      j[p + "tokens_min"] = l.tokens_min();
      j[p + "tokens_max"] = l.tokens_max();
      j[p + "tokens_cv"] = number(l.tokens_cv());
      j[p + "dropped"] = l.dropped;
      j[p + "aux_loss"] = number(l.aux_loss);
      j[p + "z_loss"] = number(l.z_loss);
      aux += l.aux_loss, z += l.z_loss, dropped += l.dropped;
    }
    j["moe_aux_loss"] = number(aux);
    j["moe_z_loss"] = number(z);
    j["moe_dropped"] = dropped;
  }
  append(j);
}

double MoeLayerStats::tokens_min() const {
  return tokens.empty() ? 0 : *std::min_element(tokens.begin(), tokens.end());
}

double MoeLayerStats::tokens_max() const {
  return tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
}

double MoeLayerStats::tokens_cv() const {
  if (tokens.empty()) return 0;
  double sum = 0, sq = 0;
  for (double t : tokens) sum += t;
  const double mean = sum / double(tokens.size());
  if (!(mean > 0)) return 0;
  for (double t : tokens) sq += (t - mean) * (t - mean);
  return std::sqrt(sq / double(tokens.size())) / mean;
}

void MetricsLog::write(const EvalMetrics& m) {
  append({{"step", m.step}, {"val_loss", number(m.val_loss)}, {"val_ppl", number(m.val_ppl)}, {"tokens", m.tokens}});
}

std::string format_step_line(const StepMetrics& m) {
  std::string s =
      fmt::format("step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {} tok/s | MFU {:.1f}% | {} | ETA {}",
                  m.step, m.steps_total, m.loss, m.lr, m.grad_norm, format_count(m.tokens_per_s), 100.0 * m.mfu,
                  format_duration(m.elapsed_s), format_duration(m.eta_s));
  if (m.skipped_steps) s += fmt::format(" | skipped {}", m.skipped_steps);
  if (m.loss_scale > 0) s += fmt::format(" | loss scale {:g}", m.loss_scale);
  if (m.comm_exposed >= 0) s += fmt::format(" | comm exposed {:.1f}%", 100 * m.comm_exposed);
  const PhaseTimes& t = m.per_step;
  s += fmt::format(" | ms/step: data {:.1f} fwd {:.1f} bwd {:.1f} sync {:.1f} opt {:.1f}", 1e3 * t.data,
                   1e3 * t.forward, 1e3 * t.backward, 1e3 * t.grad_sync, 1e3 * t.optimizer);
  if (t.checkpoint > 0) s += fmt::format(" ckpt {:.1f}", 1e3 * t.checkpoint);
  if (!m.stragglers.empty()) s += fmt::format(" | stragglers: rank {}", fmt::join(m.stragglers, ", "));
  return s;
}

std::string format_eval_line(const EvalMetrics& m) {
  return fmt::format("eval at step {} | val loss {:.4f} | val ppl {:.2f}", m.step, m.val_loss, m.val_ppl);
}

}  // namespace llmtrain::trainer
