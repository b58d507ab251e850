// The subcommands. Each returns the process exit code (common/error.h); main() registers them
// with CLI11 and turns llmtrain::Error / RecipeError into messages and exit status 2.
#pragma once

#include <string>
#include <vector>

#include "trainer/data_prep.h"

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

struct PrepArgs {
  trainer::PrepOptions options;
  std::string separator;
  bool separator_given = false;
  bool no_append_eod = false;
  std::string progress = "auto";  // auto | bar | lines | none
};
int cmd_prep(const PrepArgs& args);

}  // namespace llmtrain::cli
