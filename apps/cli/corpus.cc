// headlight corpus detective: prints stories of the detective corpus (text, or JSON records with
// the pronoun, names and answer positions).

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "headlight/train/corpus.h"
#include "options.h"

namespace headlight::cli {

void add_corpus(CLI::App& app) {
  auto* cmd = app.add_subcommand("corpus", "Generate a built-in corpus");
  cmd->require_subcommand(1);
  struct Args {
    std::string split = "train";
    train::CorpusOptions o{.stories = 10};
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* det = cmd->add_subcommand(
      "detective", "Short stories where a pronoun refers back to one of two or three characters");
  det->add_option("--split", args->split, "train, validation or test")->capture_default_str();
  positive(
      det->add_option("--stories", args->o.stories, "Number of stories")->capture_default_str());
  det->add_option("--seed", args->o.seed, "Base seed (each split has its own stream)")
      ->capture_default_str();
  add_corpus_shape_options(det, args->o);
  det->add_flag("--json", args->json,
                "One JSON record per line: text, characters, pronoun and answer with offsets");
  det->callback([args] {
    train::CorpusOptions o = args->o;
    o.split = train::parse_split(args->split);
    const auto stories = train::detective_stories(o);
    for (const auto& s : stories) {
      if (!args->json) {
        fmt::print("{}", s.text);
        continue;
      }
      nlohmann::json chars = nlohmann::json::array();
      for (const auto& c : s.characters)
        chars.push_back({{"name", c.name},
                         {"offset", c.offset},
                         {"length", c.length},
                         {"pronoun", c.pronoun},
                         {"sentence_offset", c.sentence_offset},
                         {"sentence_length", c.sentence_length}});
      nlohmann::json refs = nlohmann::json::array();
      for (const auto& r : s.references)
        refs.push_back({{"antecedent", r.antecedent},
                        {"pronoun", r.pronoun},
                        {"pronoun_offset", r.pronoun_offset},
                        {"subject", r.subject},
                        {"subject_offset", r.subject_offset},
                        {"answer", r.answer},
                        {"answer_offset", r.answer_offset},
                        {"signature", r.signature},
                        {"signature_pronoun_offset", r.signature_pronoun_offset},
                        {"signature_offset", r.signature_offset}});
      fmt::print("{}\n", nlohmann::json{{"text", s.text},
                                        {"references", refs},
                                        {"characters", chars},
                                        {"antecedent", s.antecedent},
                                        {"pronoun", s.pronoun},
                                        {"pronoun_offset", s.pronoun_offset},
                                        {"answer", s.answer},
                                        {"answer_offset", s.answer_offset}}
                             .dump());
    }
  });
}

}  // namespace headlight::cli
