// Drawing a laid-out Chart (cli/plot.h) with cairo into the bytes of a PNG or an SVG file. All the
// geometry is decided by chart_layout; this file only strokes, fills and writes text.
#pragma once

#include <string>

#include "cli/plot.h"

namespace llmtrain::cli {

// The file's bytes. Throws llmtrain::Error (environment) when cairo fails, naming its status.
// An SVG also carries the title and the legend as <title> and <desc> text: cairo draws text as
// glyph outlines, which neither search nor screen readers can read.
std::string chart_render(const Chart& chart, ImageFormat format);

// The colour of run `index`, as "#rrggbb" (a 10-colour palette, repeated beyond 10 runs).
std::string run_colour(int index);

}  // namespace llmtrain::cli
