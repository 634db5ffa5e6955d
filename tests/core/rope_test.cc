// Closed-form checks of the rotary embedding.
#include "core/model/rope.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model/config_reader.h"
#include "core/runtime/step_profile.h"
#include "core/runtime/torch_compat.h"
#include "core/safetensors/safetensors.h"

namespace loraplex {
namespace {

TEST(RopeTest, DefaultFrequenciesAreThetaPowers) {
  RopeConfig rope;
  rope.theta = 10000.0;
  torch::Tensor inv_freq = RopeInverseFrequencies(rope, 8);
  ASSERT_EQ(inv_freq.size(0), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(inv_freq[i].item<double>(), std::pow(10000.0, -2.0 * i / 8),
                1e-7);
  }
}

TEST(RopeTest, LinearScalingDividesEveryFrequency) {
  RopeConfig rope;
  torch::Tensor plain = RopeInverseFrequencies(rope, 16);
  rope.type = RopeType::kLinear;
  rope.factor = 4.0;
  EXPECT_TRUE(torch::allclose(RopeInverseFrequencies(rope, 16), plain / 4.0));
}

TEST(RopeTest, Llama3ScalesOnlyLongWavelengths) {
  RopeConfig rope;
  rope.theta = 500000.0;
  const int64_t head_dim = 64;
  torch::Tensor plain = RopeInverseFrequencies(rope, head_dim);
  rope.type = RopeType::kLlama3;
  rope.factor = 8.0;
  rope.low_freq_factor = 1.0;
  rope.high_freq_factor = 4.0;
  rope.original_max_position_embeddings = 8192;
  torch::Tensor scaled = RopeInverseFrequencies(rope, head_dim);
  for (int64_t i = 0; i < plain.size(0); ++i) {
    const double f = plain[i].item<double>();
    const double wavelen = 2 * M_PI / f;
    const double s = scaled[i].item<double>();
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_NEAR(s, f, 1e-6 * f) << i;  // High frequency: untouched.
    } else if (wavelen > 8192.0 / 1.0) {
      EXPECT_NEAR(s, f / 8.0, 1e-6 * f) << i;  // Low frequency: / factor.
    } else {
      EXPECT_LT(s, f) << i;  // In between: interpolated.
      EXPECT_GT(s, f / 8.0) << i;
    }
  }
}

TEST(RopeTest, AttentionScoreDependsOnlyOnRelativePosition) {
  RopeConfig rope;
  RotaryEmbedding rotary(rope, 16);
  RopeTables tables = rotary.Tables(32, torch::kFloat64, torch::kCPU);
  torch::manual_seed(0);
  torch::Tensor q = torch::randn({16}, torch::kFloat64);
  torch::Tensor k = torch::randn({16}, torch::kFloat64);
  // Place q at every position and k at every position.
  torch::Tensor rq = RotaryEmbedding::Apply(
      q.expand({1, 1, 32, 16}).contiguous(), tables)[0][0];
  torch::Tensor rk = RotaryEmbedding::Apply(
      k.expand({1, 1, 32, 16}).contiguous(), tables)[0][0];
  const double d3 = rq[10].dot(rk[7]).item<double>();
  EXPECT_NEAR(rq[25].dot(rk[22]).item<double>(), d3, 1e-4);
  EXPECT_NEAR(rq[3].dot(rk[0]).item<double>(), d3, 1e-4);
  // Rotation preserves norms.
  EXPECT_NEAR(rq[17].norm().item<double>(), q.norm().item<double>(), 1e-5);
  // Position 0 is the identity.
  EXPECT_TRUE(torch::allclose(rq[0], q, 1e-6, 1e-6));
}

// The textbook rotation, x·cos + rotate_half(x)·sin with rotate_half(x) =
// cat(−x₂, x₁), from tables made here from the inverse frequencies.
torch::Tensor TextbookRope(const torch::Tensor& x,
                           const torch::Tensor& positions,
                           const torch::Tensor& inv_freq) {
  const torch::Tensor freqs =
      positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq.view({1, 1, -1});
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);
  const torch::Tensor cos = emb.cos().to(x.scalar_type());
  const torch::Tensor sin = emb.sin().to(x.scalar_type());
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated =
      torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

// Apply folds rotate_half's sign into the sin table and rolls x instead of
// slicing it: the same products, so the same bits as the textbook form, in
// the result and in the gradient.
TEST(RopeTest, ApplyIsTheTextbookRotationBitForBit) {
  RopeConfig rope;
  RotaryEmbedding rotary(rope, 16);
  const torch::Tensor inv_freq = RopeInverseFrequencies(rope, 16);
  torch::manual_seed(4);
  const torch::Tensor positions =
      torch::tensor({0, 1, 2, 3, 4, 7, 9, 100, 2000, 5}, torch::kInt64)
          .view({2, 5});
  for (torch::ScalarType dtype :
       {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
    SCOPED_TRACE(c10::toString(dtype));
    const torch::Tensor x0 = torch::randn({2, 3, 5, 16}).to(dtype);
    const torch::Tensor weights = torch::randn({2, 3, 5, 16}).to(dtype);
    const torch::Tensor x = x0.clone().requires_grad_(true);
    const torch::Tensor y = RotaryEmbedding::Apply(
        x, rotary.TablesAt(positions, dtype, torch::kCPU));
    (y * weights).sum().backward();
    const torch::Tensor ref_x = x0.clone().requires_grad_(true);
    const torch::Tensor ref = TextbookRope(ref_x, positions, inv_freq);
    (ref * weights).sum().backward();
    EXPECT_TRUE(torch::equal(y, ref));
    EXPECT_TRUE(torch::equal(x.grad(), ref_x.grad()));
    // The tables for positions 0..4 give row 0's result.
    const torch::Tensor first = RotaryEmbedding::Apply(
        x0.narrow(0, 0, 1), rotary.Tables(5, dtype, torch::kCPU));
    EXPECT_TRUE(torch::equal(first, ref.detach().narrow(0, 0, 1)));
  }
}

// Four operators (each at least one kernel on a GPU, plus a node each in
// backward): roll, two products and their sum.
TEST(RopeTest, ApplyDispatchesFourOperators) {
  if (!kTorchIs2OrNewer) GTEST_SKIP() << "profiling needs LibTorch 2.x";
  RotaryEmbedding rotary(RopeConfig{}, 16);
  const RopeTables tables = rotary.Tables(5, torch::kFloat32, torch::kCPU);
  const torch::Tensor x = torch::randn({1, 2, 5, 16});
  const absl::StatusOr<std::vector<ProfiledEvent>> events = ProfileCall(
      [&] { RotaryEmbedding::Apply(x, tables); }, /*cuda=*/false, "");
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(SummarizeProfile(*events).top_level_ops, 4);
}

// --- YaRN against transformers 5.24 (tests/fixtures/golden/rope_mxfp4). ---

using nlohmann::json;

std::string YarnFixtureDir() {
  return std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/golden/rope_mxfp4";
}

json ReadYarnCases() {
  std::ifstream in(YarnFixtureDir() + "/yarn_cases.json");
  return json::parse(in);
}

// The RoPE settings of a config.json as the common parser reads them: the
// 5.x rope_parameters, else the 4.x rope_scaling, with the top-level
// rope_theta winning.
absl::StatusOr<RopeConfig> ParseRopeOf(const json& root) {
  const std::string label = "config.json";
  ConfigReader reader(root, label);
  const char* key =
      root.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const double theta = root.value("rope_theta", 10000.0);
  auto rope = ParseRopeSettings(reader, root[key], std::string(key) + ".",
                                theta, root["head_dim"].get<int64_t>());
  if (rope.ok() && root.contains("rope_theta")) rope->theta = theta;
  return rope;
}

// Largest |a - b| / |b| (fp64) over the elements.
double MaxRelativeDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor a64 = a.to(torch::kFloat64);
  const torch::Tensor b64 = b.to(torch::kFloat64);
  return ((a64 - b64).abs() / b64.abs()).max().item<double>();
}

TEST(RopeTest, YarnGoldenFrequenciesAndTablesMatchTransformers) {
  const json cases = ReadYarnCases();
  auto file = SafetensorsFile::Open(YarnFixtureDir() + "/yarn.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<int64_t> positions =
      cases["positions"].get<std::vector<int64_t>>();
  const torch::Tensor position_ids =
      torch::tensor(positions, torch::kInt64).view({1, -1});
  ASSERT_EQ(cases["cases"].size(), 7u);
  for (const json& c : cases["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    auto rope = ParseRopeOf(c["config"]);
    ASSERT_TRUE(rope.ok()) << rope.status();
    ASSERT_EQ(rope->type, RopeType::kYarn);
    // Python's double arithmetic on the same inputs (libm's log).
    EXPECT_DOUBLE_EQ(rope->attention_factor,
                     c["attention_factor"].get<double>());
    const int64_t head_dim = c["config"]["head_dim"].get<int64_t>();
    const torch::Tensor want = (*file)->Load(name + ".inv_freq").value();
    const torch::Tensor got = RopeInverseFrequencies(*rope, head_dim);
    ASSERT_EQ(got.sizes(), want.sizes());
    // The same fp32 operators as transformers on the same values (equal
    // bit for bit with this LibTorch); one ulp leaves room for another
    // build's pow kernel.
    EXPECT_LE(MaxRelativeDiff(got, want), std::ldexp(1.0, -23));

    // Tables: fp32 angles (one product each) through cos / sin, scaled by
    // the attention factor. CPU kernel families compute cos and sin of a
    // large fp32 angle differently (argument reduction), by up to a few ulps
    // of the angle: each value is held to 4 ulps of its angle (1e-6 where
    // the angle is small), times the attention factor.
    const RopeTables tables =
        RotaryEmbedding(*rope, head_dim)
            .TablesAt(position_ids, torch::kFloat32, torch::kCPU);
    const torch::Tensor cos = tables.cos[0][0];
    const torch::Tensor signed_sin = tables.signed_sin[0][0];
    const torch::Tensor want_cos = (*file)->Load(name + ".cos").value();
    const torch::Tensor want_sin = (*file)->Load(name + ".sin").value();
    ASSERT_EQ(cos.sizes(), want_cos.sizes());
    const int64_t half = want_sin.size(1) / 2;
    const torch::Tensor sin = torch::cat(
        {-signed_sin.narrow(1, 0, half), signed_sin.narrow(1, half, half)}, 1);
    const torch::Tensor inv_freq = got.to(torch::kFloat64);
    const torch::Tensor angles =
        position_ids.to(torch::kFloat64).view({-1, 1}) *
        torch::cat({inv_freq, inv_freq}).view({1, -1});
    const torch::Tensor tolerance =
        (angles.abs() * std::ldexp(4.0, -23) + 1e-6) *
        std::max(1.0, rope->attention_factor);
    EXPECT_TRUE(((cos - want_cos).abs().to(torch::kFloat64) <= tolerance)
                    .all()
                    .item<bool>());
    EXPECT_TRUE(((sin - want_sin).abs().to(torch::kFloat64) <= tolerance)
                    .all()
                    .item<bool>());
    // A wrong attention factor moves values by far more.
    EXPECT_GT((cos * 1.01 - want_cos).abs().max().item<double>(), 1e-3);
  }
}

json YarnConfig(json settings, const char* spelling = "rope_scaling") {
  json root = {{"head_dim", 64}, {"max_position_embeddings", 131072}};
  root[spelling] = std::move(settings);
  return root;
}

TEST(RopeTest, YarnParsesBothSpellingsWithTransformersDefaults) {
  for (const char* spelling : {"rope_scaling", "rope_parameters"}) {
    SCOPED_TRACE(spelling);
    auto rope = ParseRopeOf(
        YarnConfig({{"rope_type", "yarn"}, {"factor", 32}}, spelling));
    ASSERT_TRUE(rope.ok()) << rope.status();
    EXPECT_EQ(rope->type, RopeType::kYarn);
    EXPECT_EQ(rope->factor, 32.0);
    EXPECT_EQ(rope->original_max_position_embeddings, 131072);
    EXPECT_EQ(rope->beta_fast, 32.0);
    EXPECT_EQ(rope->beta_slow, 1.0);
    EXPECT_TRUE(rope->truncate);
    EXPECT_DOUBLE_EQ(rope->attention_factor, 0.1 * std::log(32.0) + 1.0);
  }
  // The 4.x "type" key; a factor up to 1 leaves cos and sin unscaled.
  auto rope = ParseRopeOf(YarnConfig({{"type", "yarn"}, {"factor", 1.0}}));
  ASSERT_TRUE(rope.ok()) << rope.status();
  EXPECT_EQ(rope->type, RopeType::kYarn);
  EXPECT_EQ(rope->attention_factor, 1.0);
  // mscale alone (without mscale_all_dim) is ignored, as in transformers.
  rope = ParseRopeOf(
      YarnConfig({{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", 2.0}}));
  ASSERT_TRUE(rope.ok()) << rope.status();
  EXPECT_DOUBLE_EQ(rope->attention_factor, 0.1 * std::log(4.0) + 1.0);
}

TEST(RopeTest, YarnRefusesInvalidSettingsByName) {
  const struct {
    json settings;
    const char* message;
  } cases[] = {
      {{{"rope_type", "yarn"}}, "rope_scaling.factor is required"},
      {{{"rope_type", "yarn"}, {"factor", -2}}, "rope_scaling.factor must be"},
      {{{"rope_type", "yarn"}, {"factor", 4}, {"truncate", "no"}},
       "rope_scaling.truncate must be true or false"},
      {{{"rope_type", "yarn"},
        {"factor", 4},
        {"beta_fast", 1},
        {"beta_slow", 2}},
       "rope_scaling.beta_fast (1) must be at least beta_slow (2)"},
      {{{"rope_type", "yarn"}, {"factor", 4}, {"beta_slow", 0}},
       "rope_scaling.beta_slow must be a positive number"},
      {{{"rope_type", "yarn"}, {"factor", 4}, {"mscale_all_dim", -1}},
       "rope_scaling.mscale_all_dim must be a positive number"},
      {{{"rope_type", "yarn"}, {"factor", 4}, {"attention_factor", "x"}},
       "rope_scaling.attention_factor must be a positive number"},
      {{{"rope_type", "yarn"},
        {"factor", 4},
        {"original_max_position_embeddings", 4096.5}},
       "rope_scaling.original_max_position_embeddings must be a positive "
       "integer"},
      {{{"rope_type", "yarn_v2"}, {"factor", 4}},
       "\"yarn_v2\" is not supported (supported: default, linear, llama3, "
       "longrope, yarn)"},
  };
  for (const auto& c : cases) {
    auto rope = ParseRopeOf(YarnConfig(c.settings));
    ASSERT_FALSE(rope.ok()) << c.settings.dump();
    EXPECT_EQ(rope.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(rope.status().message().find(c.message), std::string::npos)
        << rope.status();
  }
  // No original context anywhere.
  json root = {{"head_dim", 64},
               {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}}}};
  auto rope = ParseRopeOf(root);
  ASSERT_FALSE(rope.ok());
  EXPECT_NE(rope.status().message().find(
                "rope_scaling.original_max_position_embeddings is required"),
            std::string::npos)
      << rope.status();
  // Per layer type, transformers 5.24 always truncates.
  root = {{"head_dim", 64},
          {"max_position_embeddings", 4096},
          {"rope_parameters",
           {{"full_attention",
             {{"rope_type", "yarn"}, {"factor", 4}, {"truncate", false}}}}}};
  ConfigReader reader(root, "config.json");
  rope = ParseRopeSettings(reader, root["rope_parameters"]["full_attention"],
                           "rope_parameters.full_attention.", 10000.0, 64);
  ASSERT_FALSE(rope.ok());
  EXPECT_NE(rope.status().message().find(
                "rope_parameters.full_attention.truncate false is not "
                "supported"),
            std::string::npos)
      << rope.status();
}

TEST(RopeTest, YarnConfigRoundTripsThroughModelConfigJson) {
  const json cases = ReadYarnCases();
  int checked = 0;
  for (const json& c : cases["cases"]) {
    const std::string name = c["name"].get<std::string>();
    // Llama refuses partial rotation; the others are whole configs.
    if (name == "partial_explicit") continue;
    SCOPED_TRACE(name);
    auto config = ParseModelConfig(c["config"].dump(), name);
    ASSERT_TRUE(config.ok()) << config.status();
    auto again = ParseModelConfig(ModelConfigToJson(*config), "written");
    ASSERT_TRUE(again.ok()) << again.status();
    const RopeConfig& a = config->rope;
    const RopeConfig& b = again->rope;
    EXPECT_EQ(b.type, RopeType::kYarn);
    EXPECT_EQ(b.theta, a.theta);
    EXPECT_EQ(b.factor, a.factor);
    EXPECT_EQ(b.original_max_position_embeddings,
              a.original_max_position_embeddings);
    EXPECT_EQ(b.beta_fast, a.beta_fast);
    EXPECT_EQ(b.beta_slow, a.beta_slow);
    EXPECT_EQ(b.truncate, a.truncate);
    EXPECT_EQ(b.attention_factor, a.attention_factor);
    EXPECT_DOUBLE_EQ(a.attention_factor, c["attention_factor"].get<double>());
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

}  // namespace
}  // namespace loraplex
