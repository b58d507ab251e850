#include "trainer/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "common/signals.h"
#include "common/strings.h"
#include "kernels/backend_info.h"
#include "parallel/grad_buckets.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/data/gpt_dataset.h"
#include "trainer/data/sampler.h"
#include "trainer/data/tokenizer.h"
#include "trainer/fault_injection.h"
#include "trainer/lr_schedule.h"
#include "trainer/metrics.h"
#include "trainer/model/model.h"
#include "trainer/optimizer.h"
#include "trainer/progress_bar.h"

extern "C" void openblas_set_num_threads(int);

namespace llmtrain::trainer {
namespace fs = std::filesystem;
using kernels::DType;
using kernels::Tensor;
using parallel::ReduceOp;

namespace {

// Progress messages come from world rank 0 only; warnings and errors from every rank.
bool g_say = true;
template <typename... Args>
void say(fmt::format_string<Args...> f, Args&&... args) {
  if (g_say) log_info(f, std::forward<Args>(args)...);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Token and target buffers of one micro-batch: samples are seq_len + 1 tokens; the model reads
// the first seq_len as input and the last seq_len as next-token targets.
class BatchBuffer {
 public:
  BatchBuffer(int micro_batch, int seq_len)
      : b_(micro_batch),
        t_(seq_len),
        sample_(size_t(seq_len) + 1),
        tokens_(size_t(micro_batch) * seq_len),
        targets_(size_t(micro_batch) * seq_len),
        indices_(size_t(micro_batch)) {}

  int64_t* indices() { return indices_.data(); }

  MicroBatch fill(const GptDataset& data) {
    for (int b = 0; b < b_; ++b) {
      data.sample(indices_[b], sample_.data());
      std::copy(sample_.begin(), sample_.end() - 1, tokens_.begin() + size_t(b) * t_);
      std::copy(sample_.begin() + 1, sample_.end(), targets_.begin() + size_t(b) * t_);
    }
    return {Tensor(tokens_.data(), DType::int32, {b_, t_}), Tensor(targets_.data(), DType::int32, {b_, t_})};
  }

 private:
  int b_, t_;
  std::vector<int32_t> sample_, tokens_, targets_;
  std::vector<int64_t> indices_;
};

// The per-rank peak MFU is measured against, in FLOP/s.
double peak_flops(const Recipe& r) {
  if (r.log.peak_tflops > 0) return r.log.peak_tflops * 1e12;
  return kernels::measure_sgemm_gflops() * 1e9;
}

}  // namespace

int train(const TrainContext& ctx) {
  const Recipe& r = *ctx.recipe;
  const ModelConfig& mc = r.model;
  const parallel::Mesh& mesh = *ctx.mesh;
  parallel::MeshComms& comms = *ctx.comms;
  FileSystem& fsys = ctx.fs ? *ctx.fs : default_file_system();
  const bool root = comms.world->rank() == 0;
  g_say = root;
  const int dp_rank = comms.dp->rank(), dp = comms.dp->size();

  omp_set_num_threads(ctx.threads);
  openblas_set_num_threads(ctx.threads);

  // The run directory: the resolved recipe and the log. Rank 0 writes; the others log to stderr.
  if (root) {
    fsys.make_dirs(r.log.dir);
    write_file_atomic(fsys, (fs::path(r.log.dir) / "recipe.yaml").string(), ctx.recipe_yaml);
    log_open_file((fs::path(r.log.dir) / "train.log").string());
  }
  say("llmtrain run {}: {} rank(s) = {}, {} thread(s) per rank", r.name, comms.world->size(),
      parallel::Mesh::describe(mesh.shape()), ctx.threads);

  // Data.
  auto tokenizer = load_tokenizer(r.data.tokenizer);
  GptDataset train_data(r.data.train, mc.seq_len, r.train.seed, mc.vocab);
  std::optional<GptDataset> valid_data;
  if (!r.data.valid.empty())
    valid_data.emplace(std::vector<DataSource>{{r.data.valid, 1.0}}, mc.seq_len, r.train.seed, mc.vocab);
  say("data: {}", train_data.describe());
  Sampler sampler(r.train.global_batch, r.train.micro_batch, dp_rank, dp);
  const int accum = sampler.micro_batches_per_step();

  // Model and optimizer.
  ModelOptions mo;
  mo.stage = pipeline_stage_layout(mc, mesh.coord().pp, mesh.shape().pp);
  mo.micro_batch = r.train.micro_batch;
  mo.seq_len = mc.seq_len;
  mo.checkpointing = r.train.activation_checkpointing;
  Model model(mc, mo, *comms.tp);
  model.init_parameters(r.train.seed);
  AdamW opt(r.optimizer, decay_ranges(model.parameters()), 0, model.numel());
  say("model: {} parameters on this rank ({}), activations {}", format_count(double(model.numel())),
      format_bytes(double(model.numel()) * 4 * 4), format_bytes(double(model.activation_bytes())));

  // Resume.
  int64_t step = 0, consumed = 0;
  nlohmann::json extra = nlohmann::json::object();
  const CheckpointConfig& cc = r.checkpoint;
  // checkpoint.resume: <path> and load_weights_only say how a run STARTS; once the run has written
  // checkpoints of its own, running the same command again (after exit 75, a crash or preemption)
  // must continue from those, not start over from the given path.
  bool weights_only = cc.load_weights_only;
  bool explicit_path = cc.resume == ResumeMode::path;
  if (explicit_path && !checkpoint_candidates(cc.dir).empty() &&
      !fs::path(cc.resume_path).lexically_relative(cc.dir).string().starts_with("step_")) {
    say("{} already holds this run's checkpoints: continuing from them (checkpoint.resume: {}{} applies to the "
        "run's first start)",
        cc.dir, cc.resume_path, weights_only ? " with load_weights_only" : "");
    explicit_path = weights_only = false;
  }
  if (cc.resume != ResumeMode::none) {
    auto slices = checkpoint_slices(model, weights_only ? nullptr : &opt, dp_rank, r.parallel.zero);
    auto loaded = checkpoint_resume(explicit_path ? cc.resume_path : cc.dir, explicit_path, slices, *comms.world);
    if (loaded && weights_only) {
      say("fine-tuning from the weights of {} (step, optimizer and data position start fresh)", loaded->path);
    } else if (loaded) {
      step = loaded->manifest.step;
      consumed = loaded->manifest.consumed_samples;
      extra = loaded->manifest.extra;
      opt.set_steps(step - extra.value("skipped_total", int64_t(0)));
      say("resuming from {} at step {} ({} samples consumed)", loaded->path, step, consumed);
      if (consumed != step * r.train.global_batch)
        throw Error(
            fmt::format("{} was written with another global batch ({} samples after {} steps, this recipe "
                        "consumes {} per step)",
                        loaded->path, consumed, step, r.train.global_batch),
            "resume with the train.global_batch it was written with, or set checkpoint.load_weights_only: true");
    }
  }
  if (step >= r.train.steps) {
    say("nothing to do: the checkpoint is at step {} and train.steps is {}", step, r.train.steps);
    return kExitOk;
  }

  const double flops_per_token = training_flops_per_token(mc);
  const double peak = peak_flops(r) * comms.world->size();
  const int64_t tokens_per_step = int64_t(r.train.global_batch) * mc.seq_len;
  say("{} steps of {} sequences × {} tokens ({} micro-batches of {} per data-parallel rank); MFU against {:.3g} "
      "TFLOP/s{}",
      r.train.steps, r.train.global_batch, mc.seq_len, accum, r.train.micro_batch, peak / 1e12,
      r.log.peak_tflops > 0 ? "" : " (measured sgemm rate)");

  // Data parallelism: gradients averaged in buckets launched during the last micro-batch's
  // backward, as each group of parameters completes (trainer/model/model.h GradReadyHook).
  std::vector<parallel::ParamRange> ranges;
  std::vector<std::vector<int>> ready_groups(size_t(mc.layers) + 2);  // [0] head, [1 + layer], [last] embedding
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const ModelParam& p = model.parameters()[i];
    ranges.push_back({p.offset, p.numel()});
    size_t g = p.spec.place == ParamPlace::head    ? 0
               : p.spec.place == ParamPlace::block ? size_t(1 + p.spec.layer)
                                                   : ready_groups.size() - 1;
    ready_groups[g].push_back(int(i));
  }
  std::optional<parallel::GradBuckets> buckets;
  if (dp > 1) buckets.emplace(*comms.dp, model.grads(), ranges, r.parallel.bucket_mb);
  auto on_ready = [&](ParamPlace place, int layer) {
    size_t g = place == ParamPlace::head ? 0 : place == ParamPlace::block ? size_t(1 + layer) : ready_groups.size() - 1;
    for (int i : ready_groups[g]) buckets->mark_ready(i);
  };

  MetricsLog metrics(root ? r.log.dir : "", step);
  BatchBuffer batch(r.train.micro_batch, mc.seq_len);
  int64_t skipped_total = extra.value("skipped_total", int64_t(0));
  int64_t skipped_in_a_row = extra.value("skipped_in_a_row", int64_t(0));
  int64_t last_saved = -1, last_eval = -1;

  auto evaluate = [&](int64_t at_step) {
    if (!valid_data) return;
    // eval.batches global batches of the validation set, split over data-parallel ranks as in
    // training: the same samples (and the same loss) at any layout.
    double sum = 0;
    for (int b = 0; b < r.eval.batches; ++b)
      for (int m = 0; m < accum; ++m) {
        sampler.micro_batch_indices(int64_t(b) * r.train.global_batch, m, batch.indices());
        sum += model.forward_loss(batch.fill(*valid_data));
      }
    float mean = float(sum / (double(r.eval.batches) * accum));
    comms.dp->all_reduce(Tensor(&mean, DType::fp32, {1}), ReduceOp::avg);
    EvalMetrics em{at_step, mean, std::exp(double(mean)), at_step * tokens_per_step};
    if (root) {
      metrics.write(em);
      say("{}", format_eval_line(em));
    }
    last_eval = at_step;
  };
  auto save = [&](int64_t at_step) {
    CheckpointMeta meta;
    meta.step = at_step;
    meta.consumed_samples = consumed;
    meta.rng = {{"seed", r.train.seed}};
    meta.extra = {{"skipped_total", skipped_total}, {"skipped_in_a_row", skipped_in_a_row}};
    meta.recipe_yaml = ctx.recipe_yaml;
    meta.mesh = {r.parallel.tp, r.parallel.pp, r.parallel.dp, r.parallel.zero};
    meta.tokenizer_kind = tokenizer->source().kind;
    meta.tokenizer_bytes = tokenizer->source().bytes;
    double t0 = now_s();
    std::string path = checkpoint_save(fsys, cc.dir, meta, checkpoint_slices(model, &opt, dp_rank, r.parallel.zero),
                                       *comms.world, cc.keep);
    say("checkpoint {} written in {}", path, format_duration(now_s() - t0));
    last_saved = at_step;
  };

  const Fault fault = fault_from_env();
  install_stop_handlers();
  const bool terminal = root && isatty(STDERR_FILENO);
  ProgressBar bar(stderr, terminal, 0, r.name);
  const double start = now_s();
  double interval_start = start;
  int64_t interval_steps = 0;
  double loss_sum_interval = 0;
  int64_t loss_count_interval = 0;
  int64_t start_step = step;
  double exposed_at_interval = 0;

  while (step < r.train.steps) {
    model.zero_grads();
    double loss = 0;
    for (int m = 0; m < accum; ++m) {
      sampler.micro_batch_indices(consumed, m, batch.indices());
      if (buckets && m == accum - 1) model.set_grad_ready_hook(on_ready);
      loss += model.forward_backward(batch.fill(train_data), 1.0f / float(accum));
    }
    // The gradient average over data-parallel ranks completes, and the loss is averaged over
    // micro-batches and replicas.
    float step_loss = float(loss / accum);
    if (buckets) {
      model.set_grad_ready_hook({});
      buckets->finish();
      comms.dp->all_reduce(Tensor(&step_loss, DType::fp32, {1}), ReduceOp::avg);
    }
    // Σg² over the model-parallel group (each element counted once per replica); fp32 is enough
    // for a norm that only scales the update.
    float sqf = float(grad_sum_squares(model.parameters(), comms.tp->rank()));
    comms.mp->all_reduce(Tensor(&sqf, DType::fp32, {1}), ReduceOp::sum);
    const double grad_norm = std::sqrt(double(sqf));
    const double lr = lr_at(r.optimizer, step);

    const bool finite = std::isfinite(step_loss) && std::isfinite(grad_norm);
    if (!finite) {
      if (r.train.on_nonfinite == NonFiniteAction::stop)
        throw Error(fmt::format("non-finite {} at step {} (loss {}, grad norm {}); the last checkpoint is intact",
                                std::isfinite(step_loss) ? "gradient" : "loss", step + 1, step_loss, grad_norm),
                    "lower optimizer.lr, lengthen optimizer.warmup, set train.grad_clip, or set train.on_nonfinite: "
                    "skip to skip such steps");
      ++skipped_total;
      if (++skipped_in_a_row > r.train.max_skipped_steps)
        throw Error(fmt::format("{} non-finite steps in a row (up to step {}): stopping", skipped_in_a_row, step + 1),
                    "the run diverged: lower optimizer.lr or resume from an earlier checkpoint");
      log_warn("step {}: non-finite loss or gradient, update skipped ({} in a row)", step + 1, skipped_in_a_row);
    } else {
      skipped_in_a_row = 0;
      opt.step(model.params(), model.grads(), lr, clip_factor(grad_norm, r.train.grad_clip));
      loss_sum_interval += step_loss;
      ++loss_count_interval;
    }
    consumed += r.train.global_batch;
    ++step;
    ++interval_steps;

    // Report.
    const bool last = step == r.train.steps;
    if (root && (step % r.log.every == 0 || last)) {
      double t = now_s();
      double tps = double(interval_steps * tokens_per_step) / std::max(1e-9, t - interval_start);
      double elapsed = t - start;
      StepMetrics sm;
      sm.step = step;
      sm.steps_total = r.train.steps;
      sm.loss = loss_count_interval ? loss_sum_interval / double(loss_count_interval) : double(step_loss);
      sm.lr = lr;
      sm.grad_norm = grad_norm;
      sm.tokens_per_s = tps;
      sm.mfu = flops_per_token * tps / peak;
      sm.elapsed_s = elapsed;
      sm.eta_s = elapsed / double(step - start_step) * double(r.train.steps - step);
      sm.tokens = step * tokens_per_step;
      sm.skipped_steps = skipped_total;
      if (buckets) {
        sm.comm_exposed = (buckets->stats().exposed_s - exposed_at_interval) / std::max(1e-9, t - interval_start);
        exposed_at_interval = buckets->stats().exposed_s;
      }
      metrics.write(sm);
      if (terminal) bar.finish();
      say("{}", format_step_line(sm));
      interval_start = t;
      interval_steps = 0;
      loss_sum_interval = 0;
      loss_count_interval = 0;
    }
    if (terminal) bar.update(double(step) / double(r.train.steps), fmt::format("step {}/{}", step, r.train.steps));

    if (r.eval.every > 0 && step % r.eval.every == 0 && !last) evaluate(step);
    if (cc.every > 0 && step % cc.every == 0 && !last) save(step);

    fault_maybe_fire(fault, step, comms.world->rank());  // tests of failure handling only

    // Stop on SIGTERM/SIGINT: every rank agrees, checkpoints this step, and exits 75.
    int32_t stop = stop_requested() ? 1 : 0;
    comms.world->all_reduce(Tensor(&stop, DType::int32, {1}), ReduceOp::max);
    if (stop && !last) {
      if (terminal) bar.finish();
      say("stop requested (signal): writing a checkpoint at step {}", step);
      if (last_saved != step) save(step);
      remove_stop_handlers();
      say("interrupted at step {} of {}; resume with the same command", step, r.train.steps);
      return kExitInterrupted;
    }
  }
  if (terminal) bar.finish();
  if (last_eval != step) evaluate(step);
  if (last_saved != step) save(step);
  remove_stop_handlers();
  say("done: {} steps in {}", r.train.steps, format_duration(now_s() - start));
  return kExitOk;
}

}  // namespace llmtrain::trainer
