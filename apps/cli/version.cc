// headlight version: the version, the build and what this CPU offers.

#include <oneapi/dnnl/dnnl.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "headlight/core/cpu_info.h"

namespace headlight::cli {

void add_version(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("version", "Print the version, the build and the CPU's SIMD targets");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Machine-readable output");
  cmd->callback([json] {
    apply_isa_from_environment();
    const CpuInfo info = cpu_info();
    const dnnl_version_t* dnnl = dnnl_version();
    const std::string dnnl_version = fmt::format("{}.{}.{}", dnnl->major, dnnl->minor, dnnl->patch);
    if (*json) {
      nlohmann::json j{{"version", HEADLIGHT_VERSION},
                       {"compiler", __VERSION__},
                       {"onednn", dnnl_version},
                       {"cpu", info.model_name},
                       {"simd_target", info.best_target},
                       {"supported_targets", info.supported_targets},
                       {"hardware_threads", info.hardware_threads}};
      fmt::print("{}\n", j.dump(2));
      return;
    }
    fmt::print("headlight {}\n", HEADLIGHT_VERSION);
    fmt::print("  compiler       {}\n", __VERSION__);
    fmt::print("  oneDNN         {}\n", dnnl_version);
    fmt::print("  cpu            {} ({} hardware threads)\n", info.model_name,
               info.hardware_threads);
    fmt::print("  simd target    {} (supported: {})\n", info.best_target,
               fmt::join(info.supported_targets, ", "));
  });
}

}  // namespace headlight::cli
