// The HTML report: the data as JSON, spliced into the page of report_page.h.

#include "headlight/viz/report.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "headlight/core/atomic_file.h"
#include "headlight/core/error.h"
#include "src/viz/report_page.h"

namespace headlight::viz {

namespace {

nlohmann::json parse(const std::string& text, const char* field) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("report: {} is not JSON ({})", field, e.what());
  }
}

}  // namespace

std::string render_report(const ReportInput& in) {
  check(!in.attention.empty(), "report: needs the attention to draw");
  nlohmann::json d;
  d["title"] = in.title;
  d["model"] = in.model_summary;
  d["continuation"] = in.continuation;
  d["summary"] = in.summary;
  d["capture"] = parse(in.attention, "attention");
  d["heads"] = parse(in.heads, "heads");
  d["curve"] = parse(in.curve, "curve");
  d["curve_measure"] = in.curve_measure;
  d["sweep"] = parse(in.sweep, "sweep");
  if (in.focus) d["focus"] = {in.focus->first, in.focus->second};
  std::string json = d.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Inside <script>, "</" would end the element: write it as "<\\/" (the same JSON string).
  for (size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3))
    json.replace(at, 2, "<\\/");
  return std::string(detail::kPageHead) + json + detail::kPageTail;
}

void write_report(AtomicFile& out, const ReportInput& in) {
  out.write(render_report(in));
  out.commit();
}

}  // namespace headlight::viz
