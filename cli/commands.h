// The subcommands. Each returns the process exit code (common/error.h); main() registers them
// with CLI11 and turns llmtrain::Error / RecipeError into messages and exit status 2.
#pragma once

#include <string>
#include <vector>

namespace llmtrain::cli {

struct RecipeArgs {
  std::string recipe;
  std::vector<std::string> overrides;  // --set key=value, in order
};

int cmd_validate(const RecipeArgs& args);

struct RunArgs {
  RecipeArgs recipe;
  bool dry_run = false;
};
int cmd_run(const RunArgs& args);

int cmd_env();

}  // namespace llmtrain::cli
