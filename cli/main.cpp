// llmtrain's entry point: registers the subcommands with CLI11 and is one of the two places that
// catch llmtrain::Error (the other is a rank's top level): the message and hint go to stderr
// and the process exits with the error's status (2 for user mistakes).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "cli/recipe_parse.h"
#include "common/error.h"
#include "llmtrain_version.h"

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  using namespace llmtrain;
  CLI::App app("llmtrain: train GPT-2 and LLaMA-family transformers on CPUs and CUDA GPUs, from one YAML recipe.",
               "llmtrain");
  app.set_version_flag("--version", version_text());
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  llmtrain validate recipes/tiny.yaml\n"
      "  llmtrain run recipes/tiny.yaml --dry-run --set train.steps=100\n"
      "  llmtrain env\n"
      "Run `llmtrain <command> --help` for a command's options.");

  cli::RecipeArgs validate_args;
  auto* validate =
      app.add_subcommand("validate", "Check a recipe and print it resolved (defaults filled in, paths absolute)");
  add_recipe_args(validate, validate_args);
  validate->footer(
      "Exit status: 0 when valid, 2 with every problem listed (file:line:column, key, found vs expected, hint).\n"
      "Examples:\n"
      "  llmtrain validate recipes/gpt2-124m.yaml\n"
      "  llmtrain validate recipes/tiny.yaml --set parallel.dp=2 --set launch.procs_per_node=2");

  cli::RunArgs run_args;
  auto* run = app.add_subcommand("run", "Train: validate the recipe, start the ranks and run the job");
  add_recipe_args(run, run_args.recipe);
  run->add_flag("--dry-run", run_args.dry_run,
                "Print the resolved recipe, mesh, parameter count, FLOPs per token, batch arithmetic and launch "
                "command; start nothing");
  run->footer(
      "Examples:\n"
      "  llmtrain run recipes/tiny.yaml\n"
      "  llmtrain run recipes/llama-8b.yaml --dry-run\n"
      "  mpirun -np 4 llmtrain run recipes/tiny.yaml     # each process one rank");

  auto* env =
      app.add_subcommand("env", "Describe this machine and build: cores, memory, BLAS, MPI, CUDA devices, NCCL");
  env->footer("Example:\n  llmtrain env     # paste the output into bug reports");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help/version (code 0) or the usage error
    return code == 0 ? 0 : kExitUserError;
  }

  try {
    if (*validate) return cli::cmd_validate(validate_args);
    if (*run) return cli::cmd_run(run_args);
    if (*env) return cli::cmd_env();
  } catch (const cli::RecipeError& e) {
    std::fprintf(stderr, "%s\n", e.format().c_str());
    return kExitUserError;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", format_error(e).c_str());
    return e.exit_code();
  }
  return 0;
}
