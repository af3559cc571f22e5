// The HTML report: the data as JSON, spliced into the page of report_page.h.

#include "headlight/viz/report.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"
#include "src/viz/report_page.h"

namespace headlight::viz {

std::string render_report(const ReportInput& in) {
  check(in.capture != nullptr, "report: needs a capture");
  nlohmann::json d;
  d["title"] = in.title;
  d["model"] = in.model_summary;
  d["continuation"] = in.continuation;
  d["summary"] = in.summary;
  d["capture"] = nlohmann::json::parse(inspect::to_json(*in.capture, true));
  d["heads"] = nlohmann::json::parse(inspect::head_table_json(in.heads))["heads"];
  auto curve = nlohmann::json::array();
  for (const auto& p : in.curve)
    curve.push_back({{"method", p.method}, {"fraction", p.fraction}, {"loss", p.loss}});
  d["curve"] = curve;
  auto sweep = nlohmann::json::array();
  for (const auto& r : in.sweep)
    sweep.push_back({{"heads", r.heads},
                     {"val_loss", r.val_loss},
                     {"tokens_per_second", r.tokens_per_second},
                     {"previous_token", r.best.previous_token},
                     {"induction", r.best.induction},
                     {"coreference", r.best.coreference}});
  d["sweep"] = sweep;
  // The most interesting head opens first: the best coreference head when there is one.
  double best = -1;
  for (const auto& h : in.heads)
    if (h.scores.coreference > best) {
      best = h.scores.coreference;
      d["focus"] = {h.layer, h.head};
    }
  std::string json = d.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Inside <script>, "</" would end the element: write it as "<\/" (the same JSON string).
  for (size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3))
    json.replace(at, 2, "<\\/");
  return std::string(detail::kPageHead) + json + detail::kPageTail;
}

void write_report(const std::string& path, const ReportInput& in) {
  const std::string html = render_report(in);
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    check(out.good(), "{}: cannot write", path);
    out << html;
    check(out.good(), "{}: writing failed", path);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace headlight::viz
