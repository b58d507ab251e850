// The subcommands. Each returns the process exit code (common/error.h); main() registers them
// with CLI11 and turns llmtrain::Error / RecipeError into messages and exit status 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/data/data_prep.h"

namespace llmtrain::cli {

struct RecipeArgs {
  std::string recipe;
  std::vector<std::string> overrides;  // --set key=value, in order
};

int cmd_validate(const RecipeArgs& args);

struct RunArgs {
  RecipeArgs recipe;
  bool dry_run = false;
  int nproc = 0;                          // --nproc N: sets launch.procs_per_node
  std::string gpu;                        // --gpu NAME (--dry-run, train.device cuda): the catalogue device
  double stop_grace_s = 600.0;            // --stop-grace: time the ranks get to checkpoint after a stop
  std::vector<std::string> rank_command;  // after `--`: the program every rank runs instead of training
};
int cmd_run(const RunArgs& args);

struct SbatchArgs {
  RecipeArgs recipe;
  int nodes = 0;  // 0: the recipe's launch.nodes
  int gpus_per_node = -1;
  int cpus_per_task = 0;
  std::string time, partition, account;
  int signal_margin_s = 300;
  bool submit = false;
  std::vector<std::string> rank_command;  // after `--`, passed on to `llmtrain run ... --`
};
int cmd_sbatch(const SbatchArgs& args);

int cmd_env();

struct PlanArgs {
  RecipeArgs recipe;
  int gpus = 0;
  std::string gpu;  // catalogue name; empty: cpu for train.device cpu
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
};
int cmd_generate(const GenerateArgs& args);

struct PlotArgs {
  std::vector<std::string> runs;     // run directories or metrics.jsonl files
  std::string output;                // -o: .png or .svg; empty: <first run>/loss.png
  std::vector<std::string> metrics;  // --metric (comma-separated); empty: loss and val_loss if present
  bool log_y = false;
  std::string title;  // empty: the metrics and the runs
};
int cmd_plot(const PlotArgs& args);

}  // namespace llmtrain::cli
