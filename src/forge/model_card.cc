#include "forge/model_card.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "io/hf_config.h"

namespace qhx {

Json model_card_data(const Json& manifest) {
  const ModelConfig c = parse_model_config(manifest.at("model_config"), "manifest: model_config");
  int64_t linear_layers = 0;
  for (LayerKind k : c.layer_types) linear_layers += k == LayerKind::kLinearAttention;
  uint64_t total_bytes = 0;
  for (const Json& f : manifest.at("files")) total_bytes += f.at("size").get<uint64_t>();
  return {{"family", manifest.at("family")},
          {"architecture",
           {{"hidden_size", c.hidden_size},
            {"layers", c.num_layers},
            {"gated_deltanet_layers", linear_layers},
            {"attention_heads", c.num_heads},
            {"kv_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab_size}}},
          {"target", manifest.at("target")},
          {"source", manifest.at("source")},
          {"created_at", manifest.at("created_at")},
          {"quantization", manifest.at("precision_policy")},
          {"plan", manifest.at("plan")},
          {"files", manifest.at("files")},
          {"total_bytes", total_bytes},
          {"gate", manifest.at("gate")},
          {"measured", Json::array()}};
}

std::string render_model_card(const Json& card) {
  std::ostringstream md;
  const Json& a = card.at("architecture");
  md << "# " << card.at("family").get<std::string>() << " bundle ("
     << card.at("target").get<std::string>() << ")\n\n"
     << "Converted by `qhx forge convert` on " << card.at("created_at").get<std::string>()
     << " from `" << card.at("source").at("path").get<std::string>() << "`.\n\n"
     << "## Model\n\n| | |\n|---|---|\n"
     << "| hidden size | " << a.at("hidden_size") << " |\n"
     << "| layers | " << a.at("layers") << " (" << a.at("gated_deltanet_layers")
     << " Gated DeltaNet) |\n"
     << "| attention heads / KV heads / head dim | " << a.at("attention_heads") << " / "
     << a.at("kv_heads") << " / " << a.at("head_dim") << " |\n"
     << "| vocabulary | " << a.at("vocab_size") << " |\n\n"
     << "## Quantization\n\n| tensor class | stored as |\n|---|---|\n";
  for (const auto& [k, v] : card.at("quantization").items()) {
    if (!v.is_null())
      md << "| " << k << " | " << (v.is_string() ? v.get<std::string>() : v.dump()) << " |\n";
  }
  md << "\n## Files\n\n| file | bytes | sha256 |\n|---|---:|---|\n";
  for (const Json& f : card.at("files")) {
    md << "| " << f.at("path").get<std::string>() << " | " << f.at("size") << " | `"
       << f.at("sha256").get<std::string>() << "` |\n";
  }
  md << "| **total** | " << card.at("total_bytes") << " | |\n\n## Oracle gate\n\n";
  const Json& gate = card.at("gate");
  if (gate.is_null()) {
    md << "Not gated: this bundle was converted with `--no-gate`.\n";
  } else {
    char line[256];
    std::snprintf(line, sizeof line,
                  "**%s** against `%s`: top-1 %.4f, top-5 %.4f, Pearson r (min) %.6f, KL %.3g, "
                  "greedy %lld/%lld prompts identical.\n\n",
                  gate.at("passed").get<bool>() ? "Passed" : "Failed",
                  gate.at("reference").get<std::string>().c_str(), gate.at("top1").get<double>(),
                  gate.at("top5").get<double>(), gate.at("pearson_min").get<double>(),
                  gate.at("kl_mean").get<double>(), gate.at("greedy_matched").get<long long>(),
                  gate.at("prompts").get<long long>());
    md << line
       << "| prompt | positions | top-1 | top-5 | Pearson (min) | KL | greedy | first divergence "
          "|\n"
       << "|---|---:|---:|---:|---:|---:|---|---:|\n";
    for (const Json& p : gate.at("per_prompt")) {
      std::snprintf(line, sizeof line, "| %s | %lld | %.4f | %.4f | %.6f | %.3g | %s | %lld |\n",
                    p.at("name").get<std::string>().c_str(), p.at("positions").get<long long>(),
                    p.at("top1").get<double>(), p.at("top5").get<double>(),
                    p.at("pearson_min").get<double>(), p.at("kl_mean").get<double>(),
                    p.at("greedy_match").get<bool>() ? "identical" : "differs",
                    p.at("first_divergence").get<long long>());
      md << line;
    }
  }
  md << "\n## Measured\n\n";
  if (card.at("measured").empty()) {
    md << "No `qhx bench` figures recorded yet.\n";
  } else {
    for (const Json& m : card.at("measured")) md << "- `" << m.dump() << "`\n";
  }
  return md.str();
}

void write_model_card(const std::filesystem::path& dir, const Json& manifest) {
  const Json card = model_card_data(manifest);
  std::ofstream(dir / "card.json") << card.dump(2) << "\n";
  std::ofstream(dir / "README.md") << render_model_card(card);
}

}  // namespace qhx
