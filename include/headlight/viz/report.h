// The HTML report and PNG heatmaps.
//
// The report is one self-contained HTML file (inline CSS, inline JavaScript, the data as embedded
// JSON; no network access, no external scripts):
//   - a head view: the text as tokens in two columns, a layer and head picker, lines from each
//     query token to the keys it attends to with the weight as opacity, numbers on hover;
//   - a model view: every layer × head as a small heatmap, framed in its role's colour;
//   - a head table: role scores, importance, ablation (the loss change when the head is removed),
//     sortable by any column;
//   - the pruning curves and the head-count sweep as inline SVG plots.
// When its script has run, the page's <body> carries data-rendered="ok", data-lines (the number of
// lines the head view drew) and data-errors (script errors caught), for headless tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "headlight/inspect/analysis.h"
#include "headlight/inspect/capture.h"

namespace headlight::viz {

struct ReportInput {
  std::string title = "headlight report";
  std::string model_summary;                  // one line about the model
  std::string continuation;                   // generated text, shown after the input
  std::vector<std::string> summary;           // lines of the text summary
  const inspect::Capture* capture = nullptr;  // required
  std::vector<inspect::HeadRow> heads;        // may be empty
  std::vector<inspect::CurvePoint> curve;     // may be empty
  std::vector<inspect::SweepRow> sweep;       // may be empty
};

std::string render_report(const ReportInput& in);
// Writes render_report(in) to path (through a temporary file and a rename).
void write_report(const std::string& path, const ReportInput& in);

// A heatmap of p [rows, cols] (values in [0, 1], 0 white, 1 dark blue) as a PNG, each entry a
// cell × cell square, through libpng. Written atomically.
void write_heatmap_png(const std::string& path, const float* p, int64_t rows, int64_t cols,
                       int cell = 8);

}  // namespace headlight::viz
