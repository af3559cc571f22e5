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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "headlight/core/atomic_file.h"

namespace headlight::viz {

// What the report draws, described in plain data: text, and JSON documents in the formats that
// `headlight` prints with --json (inspect/ writes them: capture.h's to_json, analysis.h's
// head_table_json, curve_json and sweep_json). The report knows no model.
struct ReportInput {
  std::string title = "headlight report";
  std::string model_summary;         // one line about the model
  std::string continuation;          // generated text, shown after the input
  std::vector<std::string> summary;  // lines of the text summary
  // Required: {"n_layer", "n_head", "seq", "layer_heads", "tokens", "token_text", "words",
  // "stats", "probs" [layer][head][row] (each row up to its last non-zero weight), "word_probs"}.
  std::string attention;
  // [{"layer", "head", "kv_head", "role", "importance", "ablation" (null: not measured),
  //   "scores": {name: value}}]; may be empty.
  std::string heads = "[]";
  std::string curve = "[]";                       // [{"method", "fraction", "loss"}]; may be empty
  std::string curve_measure = "validation loss";  // what the curve's "loss" is
  // [{"heads", "val_loss", "tokens_per_second", "best_scores": {name: value}}]; may be empty.
  std::string sweep = "[]";
  std::optional<std::pair<int64_t, int64_t>> focus;  // (layer, head) the head view opens with
};

// The page, one self-contained HTML document. Throws Error naming the field when a JSON document
// does not parse.
std::string render_report(const ReportInput& in);
// Writes render_report(in) to `out` and commits it.
void write_report(AtomicFile& out, const ReportInput& in);

// A heatmap of p [rows, cols] (values in [0, 1], 0 white, 1 dark blue) as a PNG, each entry a
// cell × cell square, through libpng; written to `out` and committed.
void write_heatmap_png(AtomicFile& out, const float* p, int64_t rows, int64_t cols, int cell = 8);

}  // namespace headlight::viz
