// `llmtrain sbatch`: writes the Slurm batch script for a recipe (launcher/sbatch_script.h), prints
// it, or with --submit saves it to <log.dir>/sbatch.sh and submits it, printing the job id.
//
// Rule a reader could get wrong: printing the script writes nothing, not even log.dir, although
// Slurm needs that folder to exist before the job starts (it opens the output file first and does
// not create folders): --submit creates it, and the printed script's note says to.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/recipe_inputs.h"
#include "cli/recipe_load.h"
#include "cli/recipe_parse.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/host.h"
#include "common/strings.h"
#include "launcher/child_process.h"
#include "launcher/launch_plan.h"
#include "launcher/preflight.h"
#include "launcher/sbatch_script.h"
#include "llmtrain_version.h"

namespace llmtrain::cli {
namespace {}  // namespace

int cmd_sbatch(const SbatchArgs& args) {
  namespace fs = std::filesystem;
  // --nodes, when given, overrides the recipe's launch.nodes (which is the default).
  std::vector<std::string> overrides = args.recipe.overrides;
  if (args.request.nodes > 0) overrides.push_back(fmt::format("launch.nodes={}", args.request.nodes));
  LoadedRecipe loaded = recipe_load(args.recipe.recipe, overrides);
  const Recipe& r = loaded.recipe;

  launcher::SbatchRequest q = args.request;
  q.llmtrain = executable_path();
  q.recipe = fs::absolute(args.recipe.recipe).lexically_normal().string();
  q.workdir = fs::current_path().string();
  q.overrides = args.recipe.overrides;
  if (!q.rank_command.empty()) {
    std::string found = launcher::find_program(q.rank_command[0]);
    if (found.empty())
      throw Error(fmt::format("the rank program {} was not found", q.rank_command[0]),
                  "give its path, or put its folder on PATH");
    q.rank_command[0] = fs::absolute(found).lexically_normal().string();
  }
  q.version = LLMTRAIN_VERSION;
  const std::string script = launcher::sbatch_script(r, q);

  auto missing = unsupported_features(r);
  if (!args.submit) {
    std::fputs(script.c_str(), stdout);
    std::error_code ec;
    if (fs::is_directory(r.log.dir, ec))
      std::fprintf(stderr, "# output: %s\n", launcher::sbatch_output_pattern(r).c_str());
    else
      std::fprintf(stderr,
                   "# output: %s; create its folder before `sbatch`: mkdir -p %s (Slurm does not; --submit does)\n",
                   launcher::sbatch_output_pattern(r).c_str(), launcher::shell_quote(r.log.dir).c_str());
    if (args.request.rank_command.empty() && !missing.empty())
      std::fprintf(stderr, "# note: this build cannot run the recipe yet (not supported yet: %s)\n",
                   join(describe(missing), "; ").c_str());
    // The data and tokenizer as seen from here (a login node may not see the cluster's files).
    for (const RecipeInput& in : recipe_inputs(loaded))
      if (!in.missing.empty())
        std::fprintf(stderr, "# note: from here, %s; the job stops unless its nodes see it\n",
                     describe_input(in).c_str());
    return kExitOk;
  }
  if (args.request.rank_command.empty() && !missing.empty())
    throw unsupported_error(missing, ", so the job would fail");
  if (launcher::find_program("sbatch").empty())
    throw environment_error("sbatch was not found on PATH",
                            "run this on a Slurm login node, or install Slurm's client tools (Debian: apt-get install "
                            "slurm-client); without --submit the script is printed");
  // Slurm opens the output file before the script runs and does not create its folder.
  launcher::check_writable_dir(r.log.dir, "log.dir");
  {
    std::error_code ec;
    std::filesystem::create_directories(r.log.dir, ec);  // the check creates nothing; the script goes here
    if (ec)
      throw environment_error(fmt::format("log.dir {}: cannot create it: {}", r.log.dir, ec.message()),
                              "choose a folder this user can write (--set log.dir=PATH)");
  }
  const std::string path = r.log.dir + "/sbatch.sh";
  write_file_atomic(default_file_system(), path, script);
  launcher::CommandResult res = launcher::run_command({"sbatch", "--parsable", path}, 60.0);
  std::string said = trim(res.output);
  if (res.status != 0)
    throw environment_error(fmt::format("sbatch {} failed ({}): {}", path,
                                        res.timed_out ? "no answer within 60s" : fmt::format("exit {}", res.status),
                                        said.empty() ? res.start_error : said),
                            "the script is saved there; fix what sbatch says (partition, account, limits) and submit "
                            "it with `sbatch`");
  // --parsable prints "<jobid>[;<cluster>]" on its last line.
  std::string job = said.substr(said.rfind('\n') == std::string::npos ? 0 : said.rfind('\n') + 1);
  job = job.substr(0, job.find(';'));
  std::printf("%s\n", job.c_str());
  std::string out_file = launcher::sbatch_output_pattern(r);
  out_file.replace(out_file.find("%j"), 2, job);
  std::fprintf(stderr, "submitted Slurm job %s: script %s, output %s\n", job.c_str(), path.c_str(), out_file.c_str());
  return kExitOk;
}

}  // namespace llmtrain::cli
