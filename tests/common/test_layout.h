// The layout train() computes for a recipe a test built by hand: its parallel.zero_group auto
// (0) filled as recipe_resolve fills it, then layout_of.
#pragma once

#include "common/recipe/layout.h"
#include "common/recipe/recipe_check.h"

namespace llmtrain {

inline Layout test_layout(Recipe r) {
  fill_zero_group(r.parallel);
  return layout_of(r);
}

}  // namespace llmtrain
