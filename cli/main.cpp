// llmtrain's entry point: registers the subcommands with CLI11 and is one of the two places that
// catch llmtrain::Error (the other is a rank's top level): the message and hint go to stderr
// and the process exits with the error's status (2 for user mistakes). Every other exception ends
// in a message and status 1 too, never in std::terminate's abort.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <new>

#include "cli/commands.h"
#include "cli/recipe_parse.h"
#include "cli/recipe_section.h"
#include "common/error.h"
#include "common/host.h"
#include "common/strings.h"
#include "llmtrain_version.h"

namespace {

// Counts of ranks, nodes, CPUs (the recipe's own bound): CLI11's PositiveNumber would say "not in
// range 2.2250738585072014e-308 to 1.7976931348623157e+308" for a 0.
constexpr int kMaxCount = 1 << 16;

// A floating-point option's values (every one of them: tests/e2e/cli_numbers.sh finds each FLOAT
// option in the help and feeds it NaN, infinities and subnormals): a decimal number, finite, zero
// or normal (cli::parse_float: no option means a subnormal such as 1e-320, whose reciprocal is
// infinite), in [lo, hi] (lo excluded with `above_lo`, hi with `below_hi`). CLI11's Range passes
// NaN, for which every comparison is false.
CLI::Validator finite_in(double lo, double hi, bool above_lo = false, bool below_hi = false) {
  const std::string range = fmt::format("{}{}, {}{}", above_lo ? "(" : "[", lo, hi, below_hi ? ")" : "]");
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (llmtrain::cli::parse_float(text, v) && (above_lo ? v > lo : v >= lo) && (below_hi ? v < hi : v <= hi))
          return "";
        return fmt::format("{} is not a finite number in {}", llmtrain::printable(text), range);
      },
      "finite in " + range, "finite");
}

std::string version_text() {
  std::string cuda = LLMTRAIN_HAVE_CUDA ? std::string("CUDA (") + LLMTRAIN_CUDA_ARCHS + ")" : "CPU only";
  return std::string("llmtrain ") + LLMTRAIN_VERSION + " (commit " + LLMTRAIN_GIT_COMMIT + ", " + cuda + ")";
}

void add_recipe_args(CLI::App* cmd, llmtrain::cli::RecipeArgs& args) {
  cmd->add_option("recipe", args.recipe, "Recipe YAML file (see recipes/ and docs/recipe.md)")->required();
  cmd->add_option("--set", args.overrides,
                  "Override a recipe key before validation: --set train.steps=100 (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
}

void add_prep_args(CLI::App* cmd, llmtrain::cli::PrepArgs& a) {
  auto& o = a.options;
  cmd->add_option("--input,-i", o.inputs,
                  "Input files: text (one document per file, or per --separator line), JSONL (.jsonl/.json/.ndjson), "
                  "either optionally .gz")
      ->required()
      ->type_name("FILE...");
  cmd->add_option("--tokenizer,-t", o.tokenizer,
                  "byte, a Hugging Face tokenizer.json, GPT-2's vocab.json (merges.txt beside it), or a directory "
                  "holding them")
      ->required()
      ->type_name("byte|PATH");
  cmd->add_option("--output,-o", o.output,
                  "Output PREFIX: writes PREFIX.bin + PREFIX.idx (with --valid-fraction: PREFIX-train.* and "
                  "PREFIX-valid.*). Ending in / it is a directory: DIR/train.* (and DIR/valid.*)")
      ->required()
      ->type_name("PREFIX");
  cmd->add_option("--jsonl-key", o.jsonl_key, "JSONL: the key whose string is the document")
      ->capture_default_str()
      ->type_name("KEY");
  cmd->add_option("--format", o.format, "Input format: auto (by file name), text or jsonl")
      ->capture_default_str()
      ->type_name("auto|text|jsonl");
  cmd->add_option_function<std::string>(
         "--separator",
         [&a](const std::string& v) {
           a.separator = v;
           a.separator_given = true;
         },
         "Text: a line equal to LINE ends a document (fortune files: %; '' = blank lines). Default: one "
         "document per file")
      ->type_name("LINE");
  cmd->add_flag("--no-append-eod", a.no_append_eod,
                "Do not append the end-of-document token to each document (appended by default, as Megatron's "
                "--append-eod)");
  cmd->add_option("--workers,-j", o.workers, "Tokenizer threads (default: the usable cores)")->type_name("N");
  cmd->add_option("--valid-fraction", o.valid_fraction,
                  "Send this fraction of the documents (whole, evenly spread) to a validation dataset")
      ->check(finite_in(0, 1, false, true));
  cmd->add_flag("--skip-bad", o.skip_bad,
                "Skip bad documents (malformed JSON, missing key, invalid UTF-8 for BPE, too large), count and "
                "report them, instead of stopping at the first");
  cmd->add_option("--max-doc-mib", o.max_document_mib, "Largest document accepted, in MiB (bounds memory)")
      ->capture_default_str()
      ->type_name("N");
  cmd->add_option("--progress", a.progress,
                  "auto: a progress bar on a terminal, plain lines otherwise; bar; lines; none")
      ->capture_default_str()
      ->type_name("auto|bar|lines|none");
  cmd->add_option("--progress-interval", o.progress_interval_s, "Seconds between plain progress lines (0 = none)")
      ->check(finite_in(0, 604800))
      ->capture_default_str();
  cmd->footer(
      "Output: Megatron-LM's indexed dataset (docs/indexed-dataset-format.md), uint16 tokens when the vocabulary\n"
      "has fewer than 65500 ids, else int32; written under temporary names and renamed when complete, so a\n"
      "failure leaves nothing behind. Same inputs give the same bytes for any --workers.\n"
      "Examples:\n"
      "  llmtrain prep --input corpus.jsonl.gz --tokenizer gpt2/tokenizer.json --output data/corpus\n"
      "  llmtrain prep --input notes/*.txt --tokenizer byte --output data/notes/ --valid-fraction 0.05\n"
      "  llmtrain prep --input /usr/share/games/fortunes/fortunes --separator % --tokenizer byte \\\n"
      "      --output data/fortunes/ --valid-fraction 0.05\n"
      "  llmtrain prep --input dump.jsonl --jsonl-key content --tokenizer llama3/ --output data/dump --skip-bad");
}

// CLI11 answers a first word that is no subcommand with "A subcommand is required". Returns the
// exit status for such a word after saying what it is, or 0 for a known command.
int refuse_unknown_command(CLI::App& app, const std::string& word) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->check_name(word)) return 0;
    names.push_back(sub->get_name());
  }
  std::string hint = "the commands are " + llmtrain::join(names, ", ") + " (`llmtrain --help`)";
  llmtrain::Error e(fmt::format("unknown command '{}'", word), hint);
  std::fprintf(stderr, "%s\n", llmtrain::format_error(e).c_str());
  return llmtrain::kExitUserError;
}

// OpenMP threads that spin while they wait for work take the cores the rest of the machine needs
// (another rank, a second job, a build): on a loaded 2-core host libgomp's default spin (300,000
// rounds) ran a rank 2.5× slower than a short one (docs/benchmarks.md "OpenMP's wait policy").
// GOMP_SPINCOUNT=1000 spins for about a microsecond, then sleeps: the quiet machine keeps its
// speed (a thread woken at once is still spinning) and a loaded one gets its cores back. libgomp
// reads it once, when it is loaded, before main(): unless the user chose (OMP_WAIT_POLICY or
// GOMP_SPINCOUNT), the process runs itself again with it set, once. Ranks that mpirun or srun
// start inherit it. Nothing has been opened or started yet.
void run_with_short_openmp_spin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  ::setenv("GOMP_SPINCOUNT", "1000", 1);
  // By its path, not /proc/self/exe: the process keeps its name (ps, pgrep, Slurm's step list).
  const std::string self = llmtrain::executable_path();
  ::execv(self.c_str(), argv);  // returns only on failure: the run goes on with libgomp's default
}

// "--node_rank,--node-rank" → "--node_rank": the first spelling of a flag.
std::string leaf_flag(const char* names) {
  const std::string s(names);
  return s.substr(0, s.find(','));
}

}  // namespace

int main(int argc, char** argv) {
  run_with_short_openmp_spin(argv);
  using namespace llmtrain;
  CLI::App app("llmtrain: train GPT-2 and LLaMA-family transformers on CPUs and CUDA GPUs, from one YAML recipe.",
               "llmtrain");
  app.set_version_flag("--version", version_text());
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  llmtrain validate recipes/tiny.yaml\n"
      "  llmtrain run recipes/tiny.yaml --dry-run --set train.steps=100\n"
      "  llmtrain run recipes/tiny.yaml --nproc 4\n"
      "  llmtrain sbatch recipes/gpt2-124m.yaml --nodes 2 --time 04:00:00 --submit\n"
      "  llmtrain env\n"
      "  llmtrain plan recipes/llama-8b.yaml --gpus 8 --gpu h100\n"
      "  llmtrain prep --input corpus.jsonl --tokenizer byte --output data/corpus/ --valid-fraction 0.05\n"
      "  llmtrain generate runs/tiny --prompt \"Once upon a time\"\n"
      "  llmtrain plot runs/tiny -o loss.png\n"
      "Run `llmtrain <command> --help` for a command's options.");

  cli::RecipeArgs validate_args;
  bool validate_keys = false;
  auto* validate =
      app.add_subcommand("validate", "Check a recipe and print it resolved (defaults filled in, paths absolute)");
  add_recipe_args(validate, validate_args);
  validate->get_option("recipe")->required(false);
  validate->add_flag("--keys", validate_keys,
                     "Print every recipe key instead: key, type, default, meaning (the schema docs/recipe.md follows)");
  validate->footer(
      "Exit status: 0 when valid, 2 with every problem listed (file:line:column, key, found vs expected, hint).\n"
      "Examples:\n"
      "  llmtrain validate recipes/gpt2-124m.yaml\n"
      "  llmtrain validate --keys\n"
      "  llmtrain validate recipes/tiny.yaml --set parallel.dp=2 --set launch.procs_per_node=2");

  cli::RunArgs run_args;
  auto* run = app.add_subcommand("run", "Train: validate the recipe, start the ranks and run the job");
  add_recipe_args(run, run_args.recipe);
  run->add_flag("--dry-run", run_args.dry_run,
                "Print the resolved recipe, mesh, parameter count, FLOPs per token, batch arithmetic, launch "
                "command and input files (missing ones marked); start nothing");
  run->add_option("--nproc,--nproc_per_node,--nproc-per-node", run_args.nproc,
                  "Ranks on this host (sets launch.procs_per_node; --nproc_per_node as torchrun)")
      ->check(CLI::Range(1, kMaxCount));
  run->add_option("--gpu", run_args.gpu,
                  "With --dry-run and train.device cuda: the catalogue GPU to check the predicted memory per rank "
                  "against (a100-40g, a100-80g, h100, h200; docs/plan.md)")
      ->type_name("NAME");
  run->add_option("--rates", run_args.rates,
                  "With --dry-run and --gpu: that GPU's rates as measured on a device (the file "
                  "scripts/gpu_check.sh writes; docs/plan.md §1) instead of the catalogue's")
      ->type_name("FILE");
  run->add_option("--allow-change", run_args.allow_changes,
                  "On a resume: accept these changes of the recipe since the checkpoint (a key such as train.steps, "
                  "a section such as optimizer, or all; repeat it or separate by commas). Without it a resume "
                  "refuses changes to what the run computes, naming each")
      ->type_name("KEY")
      ->delimiter(',');
  // torchrun's multi-node flags: llmtrain starts every node's ranks from one command, so each is
  // refused with what to use instead (cli/cmd_run.cpp refuse_torchrun_flags).
  for (const char* flag : {"--nnodes", "--node_rank,--node-rank", "--master_addr,--master-addr",
                           "--master_port,--master-port", "--rdzv_endpoint,--rdzv-endpoint"})
    run->add_option(flag, run_args.torchrun_flags[leaf_flag(flag)], "torchrun's flag: refused, naming what to use")
        ->group("");
  run->add_option("--stop-grace", run_args.stop_grace_s,
                  "Seconds the ranks get to write a checkpoint and exit after SIGTERM/SIGINT before they are killed")
      ->check(finite_in(0.001, 604800.0))
      ->capture_default_str();
  run->footer(
      "Usage: llmtrain run RECIPE [--set KEY=VALUE]... [--nproc N] [-- PROGRAM ARGS...]\n"
      "After `--`, every rank runs PROGRAM instead of training (to check placement, environment or a cluster).\n"
      "Exit status: 0 finished, 1 the job failed (after launch.max_restarts restarts), 2 user error, 75 interrupted\n"
      "with a checkpoint written. SIGTERM/SIGINT: every rank checkpoints and exits 75; Ctrl-C twice kills (130).\n"
      "Examples:\n"
      "  llmtrain run recipes/tiny.yaml\n"
      "  llmtrain run recipes/tiny.yaml --nproc 4 --set launch.max_restarts=3\n"
      "  llmtrain run recipes/llama-8b.yaml --dry-run\n"
      "  llmtrain run recipes/tiny.yaml --nproc 2 --set launch.hostfile=hosts.txt -- hostname\n"
      "  mpirun -np 4 llmtrain run recipes/tiny.yaml     # each process one rank\n"
      "Details: docs/launching.md");

  cli::SbatchArgs sbatch_args;
  auto* sbatch = app.add_subcommand(
      "sbatch",
      "Write (or --submit) a Slurm batch script that runs the recipe with srun, checkpoints before the time "
      "limit and requeues itself");
  add_recipe_args(sbatch, sbatch_args.recipe);
  sbatch
      ->add_option("--nodes", sbatch_args.request.nodes,
                   "Nodes (sets launch.nodes; default: the recipe's launch.nodes)")
      ->check(CLI::Range(1, kMaxCount));
  sbatch
      ->add_option("--gpus-per-node", sbatch_args.request.gpus_per_node,
                   "GPUs per node (default: launch.procs_per_node with train.device cuda, none on CPU)")
      ->check(CLI::Range(0, kMaxCount));
  sbatch
      ->add_option("--cpus-per-task", sbatch_args.request.cpus_per_task,
                   "CPUs per rank (default: train.threads, or whole nodes with --exclusive)")
      ->check(CLI::Range(1, kMaxCount));
  sbatch->add_option("--time", sbatch_args.request.time, "Time limit, e.g. 04:00:00 (default: launch.slurm.time)");
  sbatch->add_option("--partition", sbatch_args.request.partition, "Partition (default: launch.slurm.partition)");
  sbatch->add_option("--account", sbatch_args.request.account, "Account (default: launch.slurm.account)");
  sbatch
      ->add_option("--signal-margin", sbatch_args.request.signal_margin_s,
                   "Seconds before the time limit at which the ranks get SIGTERM to checkpoint")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  sbatch->add_flag("--submit", sbatch_args.submit,
                   "Save the script to <log.dir>/sbatch.sh and submit it with sbatch; print the job id");
  sbatch->footer(
      "Usage: llmtrain sbatch RECIPE [--nodes N] [options] [--set KEY=VALUE]... [-- PROGRAM ARGS...]\n"
      "The script runs `llmtrain run` on the first node, which starts launch.procs_per_node ranks per node with\n"
      "`srun --mpi=pmix`. `scancel --signal=TERM JOBID`: checkpoint, exit 75, requeue; `scancel JOBID`: checkpoint\n"
      "and end. Output: <log.dir>/slurm-<jobid>.out. Printing the script writes nothing; --submit creates log.dir\n"
      "(Slurm does not create the output's folder).\n"
      "Examples:\n"
      "  llmtrain sbatch recipes/gpt2-124m.yaml --nodes 1 > job.sh && mkdir -p runs/gpt2-124m && sbatch job.sh\n"
      "  llmtrain sbatch recipes/llama-8b.yaml --nodes 2 --gpus-per-node 8 --time 1-00:00:00 --partition gpu --submit\n"
      "Details: docs/launching.md");

  auto* env =
      app.add_subcommand("env", "Describe this machine and build: cores, memory, BLAS, MPI, CUDA devices, NCCL");
  env->footer("Example:\n  llmtrain env     # paste the output into bug reports");

  cli::GenerateArgs gen_args;
  auto* gen = app.add_subcommand("generate", "Sample text from a checkpoint (KV-cached, streamed as it is produced)");
  gen->add_option("checkpoint", gen_args.checkpoint,
                  "A checkpoint: step_<N>/ directory, a checkpoint directory (its newest), or a run directory")
      ->required();
  gen->add_option("--prompt", gen_args.prompt, "Text to continue (default: start a new document)");
  gen->add_option("--max-tokens", gen_args.max_tokens, "Tokens to generate (default 200)")
      ->check(CLI::Range(int64_t(1), std::numeric_limits<int64_t>::max()));
  gen->add_option("--temperature", gen_args.temperature, "Softmax temperature; 0 = greedy (default 1.0)")
      ->check(finite_in(0.0, 100.0));
  gen->add_option("--top-k", gen_args.top_k, "Sample among the K likeliest tokens; 0 = all (default 0)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  gen->add_option("--top-p", gen_args.top_p, "Nucleus sampling: the smallest set of probability >= P (default 1.0)")
      ->check(finite_in(0.0, 1.0));
  gen->add_option("--seed", gen_args.seed, "Random seed; the same seed gives the same text (default 0)");
  gen->add_option_function<std::string>(
         "--prompt-ids",
         [&gen_args](const std::string& v) {
           gen_args.prompt_ids = v;
           gen_args.prompt_ids_given = true;
         },
         "The prompt as token ids instead of text")
      ->type_name("ID,ID,...")
      ->excludes("--prompt");
  gen->add_flag("--ignore-eod", gen_args.ignore_eod,
                "Go on past the end-of-document token (as transformers' generate with no eos_token_id)");
  gen->add_flag("--ids", gen_args.ids, "Print the generated token ids (space-separated) instead of text");
  gen->add_option("--logits-out", gen_args.logits_out,
                  "Also write the prompt's logits [tokens, vocab] and ids to this safetensors file (to compare "
                  "with another implementation)")
      ->type_name("FILE");
  gen->footer(
      "Examples:\n"
      "  llmtrain generate runs/tiny --prompt \"The meaning of life is\" --max-tokens 300\n"
      "  llmtrain generate runs/tiny/ckpt/step_00002000 --prompt \"Q:\" --temperature 0.8 --top-k 40 --seed 1\n"
      "The tokenizer is the one recorded in the checkpoint.");

  cli::ExportArgs export_args;
  std::string max_shard = "5GB";
  auto* exp = app.add_subcommand("export", "Write a checkpoint as a Hugging Face transformers model directory");
  exp->add_option("checkpoint", export_args.checkpoint,
                  "A checkpoint: step_<N>/ directory, a checkpoint directory (its newest), or a run directory")
      ->required();
  exp->add_option("--hf", export_args.output, "The model directory to create (must not exist, or be empty)")
      ->required()
      ->type_name("DIR");
  exp->add_option("--dtype", export_args.dtype, "Tensor dtype of the files (default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  exp->add_option("--max-shard-size", max_shard,
                  "Largest tensor file; more become model-0000K-of-0000N.safetensors with an index (default 5GB)")
      ->type_name("SIZE");
  exp->footer(
      "Writes config.json (GPT2Config / LlamaConfig), model.safetensors (or shards and model.safetensors.index.json),\n"
      "generation_config.json, tokenizer.json and tokenizer_config.json; transformers' AutoModelForCausalLM and\n"
      "AutoTokenizer load the directory. Any checkpoint layout (tp, pp, dp, ZeRO) exports the same files.\n"
      "Examples:\n"
      "  llmtrain export runs/gpt2-124m --hf hf/gpt2-124m\n"
      "  llmtrain export runs/llama/ckpt/step_00010000 --hf hf/llama --dtype bf16 --max-shard-size 2GB\n"
      "Details: docs/hf.md");

  cli::ImportArgs import_args;
  auto* imp = app.add_subcommand("import", "Turn a Hugging Face transformers model directory into a checkpoint");
  imp->add_option("hf_dir", import_args.hf_dir, "A transformers model directory (config.json, model.safetensors)")
      ->required();
  imp->add_option("--out", import_args.output, "The checkpoint directory to write (step_00000000/ inside it)")
      ->required()
      ->type_name("DIR");
  imp->add_option("--recipe", import_args.recipe,
                  "Check the model against this recipe (an error per differing field) and record it; default: derive "
                  "one from config.json into <out>/recipe.yaml")
      ->type_name("RECIPE");
  imp->footer(
      "The checkpoint holds the weights only: fine-tune with checkpoint.resume: <out> and load_weights_only: true.\n"
      "GPT-2 and LLaMA architectures; options llmtrain does not implement are refused, naming the field.\n"
      "Examples:\n"
      "  llmtrain import hf/gpt2 --out ckpt/gpt2 && llmtrain generate ckpt/gpt2 --prompt \"Hello\"\n"
      "  llmtrain import hf/llama --out ckpt/llama --recipe finetune.yaml\n"
      "Details: docs/hf.md");

  cli::CkptInspectArgs inspect_args;
  auto* ckpt = app.add_subcommand("ckpt", "Checkpoint tools");
  ckpt->require_subcommand(1);
  ckpt->footer(
      "Commands: inspect (step, layout, model and tensors, every checksum verified).\nExample:\n"
      "  llmtrain ckpt inspect runs/tiny\nRun `llmtrain ckpt inspect --help` for its options.");
  auto* inspect =
      ckpt->add_subcommand("inspect", "Show a checkpoint's step, layout, model and tensors, and verify every checksum");
  inspect
      ->add_option("checkpoint", inspect_args.checkpoint,
                   "A checkpoint: step_<N>/ directory, a checkpoint directory (its newest), or a run directory")
      ->required();
  inspect->footer(
      "Exit status: 0 intact, 1 damaged (every problem listed).\nExample:\n  llmtrain ckpt inspect runs/tiny");

  cli::PrepArgs prep_args;
  auto* prep = app.add_subcommand(
      "prep", "Tokenize text or JSONL files into a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx)");
  add_prep_args(prep, prep_args);

  cli::PlotArgs plot_args;
  auto* plot = app.add_subcommand("plot", "Draw runs' metrics (loss curves) from metrics.jsonl into a PNG or SVG");
  plot->add_option("runs", plot_args.runs, "Run directories (holding metrics.jsonl) or metrics.jsonl files")
      ->required()
      ->type_name("RUN...");
  plot->add_option("-o,--output", plot_args.output, "Image file: .png or .svg (default: <first run>/loss.png)")
      ->type_name("FILE");
  plot->add_option("--metric", plot_args.metrics,
                   "Fields to draw, comma-separated: any numeric field of metrics.jsonl (default: loss, and val_loss "
                   "where a run has it)")
      ->delimiter(',')
      ->type_name("M1,M2,...");
  plot->add_flag("--log-y", plot_args.log_y, "Logarithmic y axes");
  plot->add_option("--title", plot_args.title, "Chart title (default: the metrics and the runs)");
  plot->footer(
      "One colour per run; X and val_X (loss and val_loss) share a panel, with val_X as markers on a dashed\n"
      "line; every other metric gets its own panel below, all against the step. The file is replaced atomically.\n"
      "Examples:\n"
      "  llmtrain plot runs/tiny\n"
      "  llmtrain plot runs/tiny runs/tiny-lr1e-3 -o compare.svg --title \"lr sweep\"\n"
      "  llmtrain plot runs/gpt2 --metric loss,val_loss,lr,grad_norm --log-y -o gpt2.png\n"
      "Details: docs/metrics.md");
  cli::PlanArgs plan_args;
  auto* plan = app.add_subcommand(
      "plan", "Rank every layout of a recipe's model on N GPUs by predicted step time, with memory per GPU");
  add_recipe_args(plan, plan_args.recipe);
  // (cmd_plan checks its numbers and names their ranges.)
  plan->add_option("--gpus", plan_args.gpus, "Ranks (GPUs, or CPU ranks with --gpu cpu) in all")->required();
  plan->add_option("--gpu", plan_args.gpu,
                   "Device from the catalogue: a100-40g, a100-80g, h100, h200, cpu (default: cpu for train.device "
                   "cpu; required for cuda)")
      ->type_name("NAME");
  plan->add_option("--rates", plan_args.rates,
                   "The GPU's rates as measured on a device (the file scripts/gpu_check.sh writes; docs/plan.md "
                   "§1) instead of the catalogue's")
      ->type_name("FILE");
  plan->add_option("--gpus-per-node", plan_args.gpus_per_node, "GPUs per node (one NVLink domain)")
      ->capture_default_str();
  plan->add_option("--inter-node-gbps", plan_args.inter_node_gbps, "Network bandwidth per GPU between nodes, Gb/s")
      ->check(finite_in(0.001, 1e6))
      ->capture_default_str();
  plan->add_option("--apply", plan_args.apply,
                   "Write a copy of the recipe with the best layout (parallel.*, train.micro_batch, "
                   "activation_checkpointing, launch) to this file, validated")
      ->type_name("OUT.yaml");
  plan->add_flag("--json", plan_args.json, "Print the ranking as JSON");
  plan->add_option("--top", plan_args.top, "Layouts shown (default: the ten fastest; with --json every one that fits)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  plan->footer(
      "Memory per GPU is the one memory account (`run --dry-run`'s) plus the device's reserved bytes; step time\n"
      "is the performance model's (compute, tensor-parallel collectives, pipeline transfers and bubble,\n"
      "data-parallel/ZeRO collectives, optimizer). Formulas, catalogue and their errors: docs/plan.md.\n"
      "Examples:\n"
      "  llmtrain plan recipes/llama-8b.yaml --gpus 8 --gpu h100\n"
      "  llmtrain plan recipes/llama-70b.yaml --gpus 64 --gpu a100-80g --inter-node-gbps 200 --apply 70b-64.yaml\n"
      "  llmtrain plan recipes/tiny.yaml --gpus 2 --json");

  // `run ... -- PROGRAM ARGS`: everything after the first `--` is the ranks' command.
  std::vector<std::string> rank_command;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--") continue;
    rank_command.assign(argv + i + 1, argv + argc);
    argc = i;
    std::string sub = argc > 1 ? argv[1] : "";
    if (sub != "run" && sub != "sbatch") {
      std::fprintf(stderr, "error: `-- PROGRAM` is for `llmtrain run` and `llmtrain sbatch` only\n");
      return kExitUserError;
    }
    if (rank_command.empty()) {
      std::fprintf(stderr, "error: nothing after `--`: give the program every rank runs\n");
      return kExitUserError;
    }
    break;
  }
  run_args.rank_command = rank_command;
  sbatch_args.request.rank_command = rank_command;
  if (argc > 1 && argv[1][0] != '-')
    if (int status = refuse_unknown_command(app, argv[1])) return status;

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help/version (code 0) or the usage error
    return code == 0 ? 0 : kExitUserError;
  }

  try {
    if (*validate) return validate_keys ? cli::cmd_validate_keys() : cli::cmd_validate(validate_args);
    if (*run) return cli::cmd_run(run_args);
    if (*sbatch) return cli::cmd_sbatch(sbatch_args);
    if (*env) return cli::cmd_env();
    if (*plan) return cli::cmd_plan(plan_args);
    if (*prep) return cli::cmd_prep(prep_args);
    if (*gen) return cli::cmd_generate(gen_args);
    if (*plot) return cli::cmd_plot(plot_args);
    if (*exp) {
      auto bytes = parse_byte_size(max_shard);
      if (!bytes || *bytes == 0)
        throw Error(fmt::format("--max-shard-size {}: expected a size such as 5GB, 500MB or 1000000", max_shard),
                    "units: B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB");
      export_args.max_shard_bytes = *bytes;
      return cli::cmd_export(export_args);
    }
    if (*imp) return cli::cmd_import(import_args);
    if (*inspect) return cli::cmd_ckpt_inspect(inspect_args);
  } catch (const cli::RecipeError& e) {
    std::fprintf(stderr, "%s\n", printable(e.format(), /*keep_newlines=*/true).c_str());
    return kExitUserError;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", format_error(e).c_str());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "error: out of memory\n  hint: a smaller train.micro_batch or model, fewer threads, or an input "
                 "file far larger than it should be\n");
    return kExitFailure;
  } catch (const std::exception& e) {
    // Anything else is a bug of ours or an input we failed to check: a message, never a signal.
    std::fprintf(stderr,
                 "error: internal error: %s\n  hint: llmtrain should have reported this clearly: please report it with "
                 "the command line and the output of `llmtrain env`\n",
                 printable(e.what()).c_str());
    return kExitFailure;
  } catch (...) {
    std::fprintf(stderr, "error: internal error: an unknown exception\n");
    return kExitFailure;
  }
  return 0;
}
