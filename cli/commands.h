// The subcommands. Each returns the process exit code (common/error.h); main() registers them
// with CLI11 and turns llmtrain::Error / RecipeError into messages and exit status 2.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "launcher/sbatch_script.h"
#include "trainer/data/data_prep.h"

namespace llmtrain::cli {

struct RecipeArgs {
  std::string recipe;
  std::vector<std::string> overrides;  // --set key=value, in order
};

int cmd_validate(const RecipeArgs& args);
// `validate --keys`: every key of the schema (cli/recipe_schema.h), one per line.
int cmd_validate_keys();

struct RunArgs {
  RecipeArgs recipe;
  bool dry_run = false;
  int nproc = 0;                // --nproc N: sets launch.procs_per_node
  std::string gpu;              // --gpu NAME (--dry-run, train.device cuda): the catalogue device
  std::string rates;            // --rates FILE (with --gpu): that GPU's measured rates
  double stop_grace_s = 600.0;  // --stop-grace: time the ranks get to checkpoint after a stop
  // --allow-change KEY[,KEY]: recipe changes since the checkpoint a resume accepts (keys, sections, all)
  std::vector<std::string> allow_changes;
  std::map<std::string, std::string> torchrun_flags;  // --nnodes etc. as given (refused, with what to use)
  std::vector<std::string> rank_command;              // after `--`: the program every rank runs instead of training
};
int cmd_run(const RunArgs& args);

struct SbatchArgs {
  RecipeArgs recipe;
  // The flags (--nodes, --gpus-per-node, --cpus-per-task, --time, --partition, --account,
  // --signal-margin) and the rank command after `--`, parsed straight into the request;
  // cmd_sbatch fills in the paths and the version.
  launcher::SbatchRequest request;
  bool submit = false;
};
int cmd_sbatch(const SbatchArgs& args);

int cmd_env();

struct PlanArgs {
  RecipeArgs recipe;
  int gpus = 0;
  std::string gpu;    // catalogue name; empty: cpu for train.device cpu
  std::string rates;  // --rates FILE: the GPU's measured rates (planner::apply_measured_rates)
  int gpus_per_node = 8;
  double inter_node_gbps = 400;  // per GPU (its NIC)
  std::string apply;             // write the best layout into this copy of the recipe
  bool json = false;
  int top = 0;  // 0: the ten best as a table, all with --json
};
int cmd_plan(const PlanArgs& args);

struct PrepArgs {
  trainer::PrepOptions options;
  std::string separator;
  bool separator_given = false;
  bool no_append_eod = false;
  std::string progress = "auto";  // auto | bar | lines | none
};
int cmd_prep(const PrepArgs& args);

struct GenerateArgs {
  std::string checkpoint;  // a step directory, a checkpoint directory or a run directory
  std::string prompt;
  int64_t max_tokens = 200;
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::string prompt_ids;  // --prompt-ids: token ids instead of --prompt's text ("1,2,3")
  bool prompt_ids_given = false;
  bool ids = false;         // --ids: print the generated ids (one line) instead of text
  bool ignore_eod = false;  // --ignore-eod: go on past the end-of-document token
  std::string logits_out;   // --logits-out: the prompt's logits [tokens, vocab] as safetensors
};
int cmd_generate(const GenerateArgs& args);

struct ExportArgs {
  std::string checkpoint;                       // a step directory, a checkpoint directory or a run directory
  std::string output;                           // --hf: the transformers model directory to create
  std::string dtype = "fp32";                   // --dtype fp32 | bf16 | fp16
  uint64_t max_shard_bytes = 5'000'000'000ull;  // --max-shard-size: transformers' default, 5 GB
};
int cmd_export(const ExportArgs& args);

struct ImportArgs {
  std::string hf_dir;  // a transformers model directory
  std::string output;  // --out: the checkpoint directory to write (step_00000000/)
  std::string recipe;  // --recipe: check the model against this recipe and record it
};
int cmd_import(const ImportArgs& args);

struct CkptInspectArgs {
  std::string checkpoint;
};
int cmd_ckpt_inspect(const CkptInspectArgs& args);

struct PlotArgs {
  std::vector<std::string> runs;     // run directories or metrics.jsonl files
  std::string output;                // -o: .png or .svg; empty: <first run>/loss.png
  std::vector<std::string> metrics;  // --metric (comma-separated); empty: loss and val_loss if present
  bool log_y = false;
  std::string title;  // empty: the metrics and the runs
};
int cmd_plot(const PlotArgs& args);

}  // namespace llmtrain::cli
