#include "trainer/checkpoint/checkpointer.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "common/checkpoint_dir.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/json_integer.h"
#include "common/log.h"
#include "common/recipe/recipe_changes.h"
#include "common/strings.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "parallel/progress.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_inspect.h"

namespace llmtrain::trainer {
namespace fs = std::filesystem;

namespace {
// "2 sources: 14457 documents, 2430489 tokens, lengths CRC-32C 0x1234abcd; ..."
std::string describe_data(const nlohmann::json& data) {
  std::vector<std::string> parts;
  try {
    for (const auto& s : data)
      parts.push_back(fmt::format("{} documents, {} tokens, lengths CRC-32C {:#010x}",
                                  json_integer(s.at("documents"), "documents", "", 0),
                                  json_integer(s.at("tokens"), "tokens", "", 0),
                                  json_integer(s.at("lengths_crc32c"), "lengths_crc32c", "", 0, UINT32_MAX)));
  } catch (const nlohmann::json::exception&) {
    return printable(data.dump().substr(0, 400));
  } catch (const Error&) {  // a count that is no integer in its range: shown as the file has it
    return printable(data.dump().substr(0, 400));
  }
  return fmt::format("{} source(s): {}", parts.size(), join(parts, "; "));
}

std::string change_texts(const std::vector<RecipeChange>& changes) {
  std::vector<std::string> texts;
  for (const RecipeChange& c : changes) texts.push_back(c.text());
  return join(texts, ", ");
}

// checkpoint.resume: <path> names a checkpoint for the run's first start; once checkpoint.dir holds
// the run's own checkpoints, the run continues from those.
bool continues_own(const CheckpointConfig& cc) {
  return cc.resume == ResumeMode::path && !checkpoint_candidates(cc.dir).empty() &&
         !fs::path(cc.resume_path).lexically_relative(cc.dir).string().starts_with("step_");
}

}  // namespace

std::unique_ptr<CheckpointDirLock> checkpoint_dir_lock(const std::string& dir, parallel::Comm& world) {
  std::unique_ptr<CheckpointDirLock> lock;
  checkpoint_collective(world, [&] {
    if (world.rank() == 0) lock = CheckpointDirLock::acquire(dir, checkpoint_job_id());
  });
  return lock;
}

std::string checkpoint_to_continue(const CheckpointConfig& cc) {
  if (cc.resume == ResumeMode::none) return "";
  if (cc.resume == ResumeMode::automatic || continues_own(cc)) return checkpoint_to_resume(cc.dir);
  if (cc.load_weights_only) return "";
  if (fs::exists(fs::path(cc.resume_path) / kManifestFile)) return cc.resume_path;
  return checkpoint_to_resume(cc.resume_path);
}

void check_resume_changes(const std::string& step_dir, const std::string& recipe_yaml,
                          const std::vector<std::string>& allowed) {
  if (step_dir.empty()) return;
  std::string saved;
  try {
    saved = checkpoint_read_manifest(step_dir).recipe_yaml;
  } catch (const Error&) {
    return;
  }
  if (!saved.empty()) require_resume_changes_allowed(classify_resume_changes(saved, recipe_yaml, allowed), step_dir);
}

Checkpointer::Checkpointer(const Recipe& recipe, const std::string& recipe_yaml, const Tokenizer& tokenizer,
                           Model& model, CheckpointedStep& step, int dp_rank, parallel::Comm& world, FileSystem& fs,
                           std::unique_ptr<CheckpointDirLock> lock, nlohmann::json data)
    : recipe_(recipe),
      recipe_yaml_(recipe_yaml),
      tokenizer_(tokenizer),
      model_(model),
      step_(step),
      dp_rank_(dp_rank),
      world_(world),
      fs_(fs),
      data_(std::move(data)),
      lock_(std::move(lock)) {
  LT_CHECK((world_.rank() == 0) == (lock_ != nullptr), "rank {} {} checkpoint.dir's lock", world_.rank(),
           lock_ ? "holds" : "does not hold");
  lock_renewed_ = now_s();
  // Saves that died (a double Ctrl-C, a kill mid-write) leave `step_<N>.partial/`: holding the lock,
  // no live job can be writing them.
  if (lock_) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(recipe_.checkpoint.dir, ec)) {
      const std::string name = e.path().filename().string();
      if (!name.ends_with(kPartialSuffix) ||
          checkpoint_parse_step_dir(name.substr(0, name.size() - std::string_view(kPartialSuffix).size())) < 0 ||
          !e.is_directory(ec) || e.is_symlink(ec))
        continue;
      std::error_code rm;
      fs::remove_all(e.path(), rm);
      if (rm)
        log_warn("could not remove {}, left by a save that did not finish: {}", e.path().string(), rm.message());
      else
        log_progress("removed {}, left by a save that did not finish (no live job holds {})", e.path().string(),
                     recipe_.checkpoint.dir);
    }
  }
  if (recipe_.checkpoint.async) {
    async_ = std::make_unique<AsyncCheckpointWriter>(fs_, recipe_.checkpoint.dir, recipe_.checkpoint.keep, world_,
                                                     recipe_.checkpoint.timeout_s);
    async_->reserve(slices());
    log_progress("checkpoint.async: {} of host memory for the snapshot of this rank's slices",
                 format_bytes(double(async_->snapshot_bytes())));
  }
}

std::vector<CheckpointSlice> rank_checkpoint_slices(const Model& model, CheckpointedStep& step, int replica,
                                                    bool moments) {
  // Sharded experts: the first rank of each expert-data-parallel group (dp × cp position < ep)
  // writes its experts, and the expert sync's first copies their moments.
  ExpertWriters experts;
  const parallel::GradSync& sync = step.grad_sync();
  for (const ModelParam& p : model.parameters())
    if (p.expert_shard) {
      experts = {replica < step.layout().ep, sync.first_copy_at(p.offset)};
      break;
    }
  return checkpoint_slices(model, &step.optimizer(), replica == 0, sync.first_copy(), moments, &experts);
}

std::vector<CheckpointSlice> Checkpointer::slices(bool moments) const {
  return rank_checkpoint_slices(model_, step_, dp_rank_, moments);
}

void Checkpointer::keep_lock() {
  if (!lock_ || now_s() - lock_renewed_ < 60) return;
  lock_->renew();  // rank 0 alone; a lock taken over ends this job through rank 0's error
  lock_renewed_ = now_s();
}

nlohmann::json data_identity(const GptDataset& data) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t s = 0; s < data.num_sources(); ++s) {
    const IndexedDataset& d = data.source(s);
    out.push_back(
        {{"documents", d.num_documents()}, {"tokens", d.num_tokens()}, {"lengths_crc32c", d.lengths_crc32c()}});
  }
  return out;
}

namespace {

// While a checkpoint is saved or loaded: the phase the supervisor's hang detection sees
// (parallel/progress.h), and the world's waits bounded by checkpoint.timeout instead of
// parallel.timeout (writing a large model's shards takes longer than a collective should).
class CheckpointPhase {
 public:
  CheckpointPhase(parallel::Comm& world, double timeout_s, int64_t step, parallel::Phase phase)
      : world_(world), saved_timeout_s_(world.timeout()), step_(step) {
    world_.set_timeout(std::max(saved_timeout_s_, timeout_s));
    parallel::set_progress(step, phase);
  }
  ~CheckpointPhase() {
    world_.set_timeout(saved_timeout_s_);
    parallel::set_progress(step_, parallel::Phase::train);
  }
  CheckpointPhase(const CheckpointPhase&) = delete;
  CheckpointPhase& operator=(const CheckpointPhase&) = delete;

 private:
  parallel::Comm& world_;
  double saved_timeout_s_;
  int64_t step_;
};

}  // namespace

RunPosition Checkpointer::resume() {
  const CheckpointConfig& cc = recipe_.checkpoint;
  if (cc.resume == ResumeMode::none) return {};
  bool weights_only = cc.load_weights_only;
  bool explicit_path = cc.resume == ResumeMode::path;
  if (continues_own(cc)) {
    log_progress(
        "{} already holds this run's checkpoints: continuing from them (checkpoint.resume: {}{} applies to the "
        "run's first start)",
        cc.dir, cc.resume_path, weights_only ? " with load_weights_only" : "");
    explicit_path = weights_only = false;
  }
  std::optional<LoadedCheckpoint> loaded;
  {
    CheckpointPhase phase(world_, cc.timeout_s, 0, parallel::Phase::load);
    loaded = checkpoint_resume(explicit_path ? cc.resume_path : cc.dir, explicit_path,
                               slices(/*moments=*/!weights_only), world_, recipe_yaml_);
  }
  if (!loaded) return {};
  step_.params_from_master();  // 16-bit parameters: the loaded fp32 master, rounded into the model
  if (weights_only) {
    log_progress("fine-tuning from the weights of {} (step, optimizer and data position start fresh)", loaded->path);
    return {};
  }
  const RunPosition at{loaded->manifest.step, loaded->manifest.consumed_samples};
  // The data position is step × global_batch unless an accepted batch change moved it; bounded so
  // that a hostile manifest's value cannot overflow the samples the run goes on to add.
  constexpr int64_t kMaxConsumed = int64_t(1) << 60;
  if (at.consumed_samples > kMaxConsumed)
    throw Error(
        fmt::format("{}: consumed_samples {} is beyond any run (at most 2^60)", loaded->path, at.consumed_samples),
        "the checkpoint's manifest.json is damaged");
  log_progress("resuming from {} at step {} ({} samples consumed)", loaded->path, at.step, at.consumed_samples);
  // What the recipe changed since the checkpoint (the CLI refused the same before any rank started,
  // against the checkpoint it expected; this is the one loaded).
  const ResumeChanges changes = classify_resume_changes(loaded->manifest.recipe_yaml, recipe_yaml_, allowed_changes_);
  require_resume_changes_allowed(changes, loaded->path);
  if (!changes.allowed.empty())
    log_progress("changed since that checkpoint, accepted by --allow-change: {}", change_texts(changes.allowed));
  if (!changes.harmless.empty())
    log_progress("changed since that checkpoint, taken as they are (they do not change what the run computes): {}",
                 change_texts(changes.harmless));
  const nlohmann::json saved_data = loaded->manifest.extra.value("data", nlohmann::json());
  if (!saved_data.is_null() && !data_.is_null() && saved_data != data_ &&
      !change_allowed("data.train", allowed_changes_))
    throw Error(fmt::format("{} was written with other training data: {} there, {} in this recipe's data.train",
                            loaded->path, describe_data(saved_data), describe_data(data_)),
                "resume with the data it was written with (its path may differ), continue on this data from the "
                "checkpoint's position with --allow-change data.train, or set checkpoint.load_weights_only: true to "
                "fine-tune from its weights on this data");
  step_.restore(loaded->manifest.extra, at.step);
  last_saved_ = at.step;
  return at;
}

CheckpointMeta Checkpointer::meta_at(const RunPosition& at) const {
  CheckpointMeta meta;
  meta.step = at.step;
  meta.consumed_samples = at.consumed_samples;
  meta.rng = {{"seed", recipe_.train.seed}};
  meta.extra = step_.state();
  if (!data_.is_null()) meta.extra["data"] = data_;
  meta.recipe_yaml = recipe_yaml_;
  const Layout& l = step_.layout();
  meta.mesh = {l.tp, l.pp, l.dp, l.zero, l.optimizer_sharded() ? l.shard_group / l.cp : 0, l.cp};
  meta.tokenizer_kind = tokenizer_.source().kind;
  meta.tokenizer_bytes = tokenizer_.source().bytes;
  return meta;
}

double Checkpointer::save(const RunPosition& at) {
  const CheckpointMeta meta = meta_at(at);
  if (async_) {
    double seconds = 0;
    if (async_->in_flight()) {  // at most one save in flight: the next one waits for it
      CheckpointPhase phase(world_, recipe_.checkpoint.timeout_s, at.step, parallel::Phase::save);
      seconds += report(*async_->finish());
    }
    CheckpointPhase phase(world_, recipe_.checkpoint.timeout_s, at.step, parallel::Phase::save);
    const AsyncSaveResult started = async_->start(meta, slices());
    if (!async_->in_flight()) return seconds + report(started);
    log_progress(
        "checkpoint step {}: snapshot of {} in host memory taken in {} (the step was held that long); "
        "writing it in the background",
        at.step, format_bytes(double(async_->snapshot_bytes())), format_duration(started.held_s));
    return seconds + started.held_s;
  }
  const double t0 = now_s();
  CheckpointPhase phase(world_, recipe_.checkpoint.timeout_s, at.step, parallel::Phase::save);
  const std::string path =
      checkpoint_save(fs_, recipe_.checkpoint.dir, meta, slices(), world_, recipe_.checkpoint.keep);
  const double seconds = now_s() - t0;
  log_progress("checkpoint {} written in {}", path, format_duration(seconds));
  last_saved_ = at.step;
  return seconds;
}

double Checkpointer::report(const AsyncSaveResult& r) {
  if (r.committed()) {
    log_progress(
        "checkpoint {} written in {} behind training (rank 0's write; the step was held {} for the "
        "snapshot, {} for the commit)",
        r.path, format_duration(r.write_s), format_duration(r.held_s), format_duration(r.commit_s));
    last_saved_ = r.step;
  } else {
    log_warn("{}; {}; training goes on and the next save is tried", r.error,
             last_saved_ >= 0 ? fmt::format("`latest` still names {}", checkpoint_step_dir(last_saved_))
                              : std::string("no checkpoint of this run is committed yet"));
  }
  return r.commit_s;
}

double Checkpointer::step_boundary(int64_t step) {
  if (!async_ || !async_->in_flight()) return 0;
  std::optional<AsyncSaveResult> done;
  {
    CheckpointPhase phase(world_, recipe_.checkpoint.timeout_s, step, parallel::Phase::save);
    done = async_->poll();
  }
  return done ? report(*done) : 0;
}

double Checkpointer::save_final(const RunPosition& at) {
  double seconds = 0;
  if (async_ && async_->in_flight()) {
    CheckpointPhase phase(world_, recipe_.checkpoint.timeout_s, at.step, parallel::Phase::save);
    seconds += report(*async_->finish());
  }
  if (last_saved_ == at.step) return seconds;
  if (!async_) return seconds + save(at);
  // The last save: started as any other, then waited for; its failure ends the run as a
  // synchronous save's would.
  seconds += save(at);
  if (!async_->in_flight())
    throw environment_error(fmt::format("checkpoint step {} could not be saved (see the warning above)", at.step),
                            "free space or fix the file system under checkpoint.dir, then run the same command: it "
                            "resumes from the checkpoint `latest` names");
  CheckpointPhase phase(world_, recipe_.checkpoint.timeout_s, at.step, parallel::Phase::save);
  const AsyncSaveResult r = *async_->finish();
  seconds += report(r);
  if (!r.committed())
    throw environment_error(r.error,
                            "free space or fix the file system under checkpoint.dir, then run the same "
                            "command: it resumes from the checkpoint `latest` names");
  return seconds;
}

int64_t Checkpointer::snapshot_bytes() const { return async_ ? async_->snapshot_bytes() : 0; }

void Checkpointer::set_writer_hook(AsyncCheckpointWriter::WriterHook hook) {
  if (async_) async_->set_hook(std::move(hook));
}

}  // namespace llmtrain::trainer
