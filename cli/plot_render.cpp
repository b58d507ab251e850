// Cairo's side of `llmtrain plot` (see plot_render.h). Cairo's errors are sticky: a failed call
// puts the context or surface in an error state and later calls do nothing, so the status is
// checked once after drawing and once after writing, not after every call.
#include "cli/plot_render.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain::cli {

namespace {

struct Rgb {
  double r, g, b;
};

// Tableau 10: distinguishable, and readable on white.
constexpr uint32_t kPalette[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd,
                                 0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr Rgb kInk = {0.15, 0.15, 0.15};   // text, frame, the legend's line-style samples
constexpr Rgb kGrid = {0.88, 0.88, 0.88};  // gridlines
constexpr const char* kFont = "sans-serif";
constexpr double kMarkerRadius = 3.2;

Rgb colour_of(int run) {
  if (run < 0) return kInk;
  uint32_t c = kPalette[run % kPaletteSize];
  return {((c >> 16) & 0xFF) / 255.0, ((c >> 8) & 0xFF) / 255.0, (c & 0xFF) / 255.0};
}

void set_colour(cairo_t* cr, Rgb c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

// Lines of one pixel land on pixel centres, so that a PNG shows them sharp rather than as two grey rows.
double crisp(double v) { return std::floor(v) + 0.5; }

enum class Align { start, middle, end };

// `text` cut (on a code point boundary) and given an ellipsis until it is at most `max_w` wide.
std::string fit(cairo_t* cr, std::string text, double max_w) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, text.c_str(), &e);
  if (e.x_advance <= max_w) return text;
  while (!text.empty()) {
    // Drop the last code point: its continuation bytes, then its lead byte.
    while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
    if (!text.empty()) text.pop_back();
    std::string candidate = text + "…";
    cairo_text_extents(cr, candidate.c_str(), &e);
    if (e.x_advance <= max_w) return candidate;
  }
  return "…";
}

// Draws `text` with its vertical middle at y, aligned horizontally at x; max_w > 0 bounds its width.
void draw_text(cairo_t* cr, const std::string& text, double x, double y, double size, Align align, bool bold = false,
               double max_w = 0) {
  cairo_select_font_face(cr, kFont, CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  std::string shown = max_w > 0 ? fit(cr, text, max_w) : text;
  cairo_text_extents_t e;
  cairo_text_extents(cr, shown.c_str(), &e);
  cairo_font_extents_t f;
  cairo_font_extents(cr, &f);
  double dx = align == Align::start ? 0 : align == Align::middle ? e.x_advance / 2 : e.x_advance;
  cairo_move_to(cr, x - dx, y + (f.ascent - f.descent) / 2);
  cairo_show_text(cr, shown.c_str());
}

void draw_marker(cairo_t* cr, Pixel p) {
  cairo_new_sub_path(cr);
  cairo_arc(cr, p.x, p.y, kMarkerRadius, 0, 2 * M_PI);
  cairo_fill(cr);
}

void line_style(cairo_t* cr, bool evaluation) {
  static const double kDash[] = {6, 4};
  cairo_set_line_width(cr, evaluation ? 1.3 : 1.7);
  cairo_set_dash(cr, kDash, evaluation ? 2 : 0, 0);
}

void draw_axes(cairo_t* cr, const Panel& p) {
  const Rect& r = p.plot;
  cairo_set_line_width(cr, 1);
  cairo_set_dash(cr, nullptr, 0, 0);
  set_colour(cr, kGrid);
  for (double t : p.y.ticks) {
    double y = crisp(axis_map(p.y, t, r.bottom(), r.y));
    cairo_move_to(cr, r.x, y), cairo_line_to(cr, r.right(), y);
  }
  for (double t : p.x.ticks) {
    double x = crisp(axis_map(p.x, t, r.x, r.right()));
    cairo_move_to(cr, x, r.y), cairo_line_to(cr, x, r.bottom());
  }
  cairo_stroke(cr);

  set_colour(cr, kInk);
  cairo_rectangle(cr, crisp(r.x), crisp(r.y), std::round(r.w), std::round(r.h));
  for (size_t i = 0; i < p.y.ticks.size(); ++i) {
    double y = crisp(axis_map(p.y, p.y.ticks[i], r.bottom(), r.y));
    cairo_move_to(cr, r.x - 5, y), cairo_line_to(cr, r.x, y);
  }
  for (size_t i = 0; i < p.x.ticks.size(); ++i) {
    double x = crisp(axis_map(p.x, p.x.ticks[i], r.x, r.right()));
    cairo_move_to(cr, x, r.bottom()), cairo_line_to(cr, x, r.bottom() + 5);
  }
  cairo_stroke(cr);
  for (size_t i = 0; i < p.y.ticks.size(); ++i)
    draw_text(cr, p.y.labels[i], r.x - 8, axis_map(p.y, p.y.ticks[i], r.bottom(), r.y), 12, Align::end);
  for (size_t i = 0; i < p.x.ticks.size(); ++i)
    draw_text(cr, p.x.labels[i], axis_map(p.x, p.x.ticks[i], r.x, r.right()), r.bottom() + 16, 12, Align::middle);

  if (p.x_label) draw_text(cr, "step", r.x + r.w / 2, r.bottom() + 38, 13, Align::middle);
  cairo_save(cr);
  cairo_translate(cr, 16, r.y + r.h / 2);
  cairo_rotate(cr, -M_PI / 2);
  draw_text(cr, p.y_label, 0, 0, 13, Align::middle, false, r.h);
  cairo_restore(cr);
}

void draw_series(cairo_t* cr, const Panel& p) {
  cairo_save(cr);
  const double m = kMarkerRadius + 1;  // markers on the frame stay whole
  cairo_rectangle(cr, p.plot.x - m, p.plot.y - m, p.plot.w + 2 * m, p.plot.h + 2 * m);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  for (const auto& s : p.series) {
    set_colour(cr, colour_of(s.run));
    line_style(cr, s.markers);
    for (const auto& seg : s.segments) {
      if (seg.size() < 2) continue;
      cairo_move_to(cr, seg[0].x, seg[0].y);
      for (size_t i = 1; i < seg.size(); ++i) cairo_line_to(cr, seg[i].x, seg[i].y);
      cairo_stroke(cr);
    }
    // A point with no neighbour would be invisible as a line: it is a marker too.
    for (const auto& seg : s.segments)
      if (s.markers || seg.size() == 1)
        for (const auto& pt : seg) draw_marker(cr, pt);
  }
  cairo_restore(cr);
}

void draw_legend(cairo_t* cr, const Panel& p, double chart_width) {
  cairo_save(cr);  // the line styles stay here
  for (size_t i = 0; i < p.legend.size(); ++i) {
    const LegendEntry& e = p.legend[i];
    double x = p.legend_at.x, y = p.legend_at.y + 8 + 22 * static_cast<double>(i);
    set_colour(cr, colour_of(e.run));
    line_style(cr, e.markers);
    cairo_move_to(cr, x, y), cairo_line_to(cr, x + 24, y);
    cairo_stroke(cr);
    if (e.markers) draw_marker(cr, {x + 12, y});
    set_colour(cr, kInk);
    draw_text(cr, e.label, x + 32, y, 12, Align::start, false, chart_width - x - 32 - 6);
  }
  cairo_restore(cr);
}

void draw_chart(cairo_t* cr, const Chart& chart) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  set_colour(cr, kInk);
  draw_text(cr, chart.title, chart.width / 2.0, 26, 18, Align::middle, true, chart.width - 40);
  for (const auto& p : chart.panels) {
    draw_axes(cr, p);
    draw_series(cr, p);
    draw_legend(cr, p, chart.width);
  }
}

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

// The image is drawn and encoded in memory (the file is written afterwards, by write_file_atomic,
// whose errors name the disk): a cairo failure is about memory, the chart, or cairo itself.
void check(cairo_status_t status, const char* what) {
  if (status == CAIRO_STATUS_SUCCESS) return;
  const std::string message = fmt::format("cairo: {} failed: {}", what, cairo_status_to_string(status));
  if (status == CAIRO_STATUS_NO_MEMORY)
    throw environment_error(message, "this machine ran out of memory drawing the chart (`llmtrain env` shows it)");
  throw environment_error(message,
                          "llmtrain should have drawn this chart: please report it with the command line, the "
                          "metrics.jsonl files and the output of `llmtrain env`");
}

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextDeleter {
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};
using Surface = std::unique_ptr<cairo_surface_t, SurfaceDeleter>;
using Context = std::unique_ptr<cairo_t, ContextDeleter>;

void draw_on(cairo_surface_t* surface, const Chart& chart) {
  check(cairo_surface_status(surface), "creating the image");
  Context cr(cairo_create(surface));
  check(cairo_status(cr.get()), "creating the drawing context");
  draw_chart(cr.get(), chart);
  check(cairo_status(cr.get()), "drawing the chart");
}

// <title> and <desc> as the first children of <svg>.
std::string with_svg_text(std::string svg, const Chart& chart) {
  size_t open = svg.find("<svg");
  size_t end = open == std::string::npos ? open : svg.find('>', open);
  LT_CHECK(end != std::string::npos, "cairo's SVG has no <svg> element");
  std::string desc = "Runs:";
  for (size_t r = 0; r < chart.runs.size(); ++r)
    desc += fmt::format("{} {} ({})", r ? "," : "", chart.runs[r], run_colour(static_cast<int>(r)));
  desc += ". Panels:";
  for (size_t i = 0; i < chart.panels.size(); ++i) desc += fmt::format("{} {}", i ? ";" : "", chart.panels[i].y_label);
  desc += " against step.";
  svg.insert(end + 1, fmt::format("\n<title>{}</title>\n<desc>{}</desc>", xml_escaped(chart.title), xml_escaped(desc)));
  return svg;
}

}  // namespace

std::string run_colour(int index) { return fmt::format("#{:06x}", kPalette[index % kPaletteSize]); }

std::string chart_render(const Chart& chart, ImageFormat format) {
  std::string bytes;
  if (format == ImageFormat::png) {
    Surface surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, chart.width, chart.height));
    draw_on(surface.get(), chart);
    cairo_surface_flush(surface.get());
    check(cairo_surface_write_to_png_stream(surface.get(), append_bytes, &bytes), "writing the PNG");
    return bytes;
  }
  {
    Surface surface(cairo_svg_surface_create_for_stream(append_bytes, &bytes, chart.width, chart.height));
    cairo_svg_surface_set_document_unit(surface.get(), CAIRO_SVG_UNIT_PX);
    draw_on(surface.get(), chart);
    cairo_surface_finish(surface.get());  // writes the document out
    check(cairo_surface_status(surface.get()), "writing the SVG");
  }
  return with_svg_text(std::move(bytes), chart);
}

}  // namespace llmtrain::cli
