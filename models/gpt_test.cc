// models/: the GPT-2 module tree, parameter counting, initialization, hooks,
// and the whole model's gradient against central finite differences.
#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "models/flat_storage.h"
#include "models/gpt_io.h"
#include "runtime/cpu_device.h"

namespace memwall::models {
namespace {

GptConfig Tiny(bool checkpointing = false) {
  GptConfig c;
  c.set_name("test");
  c.set_layers(2);
  c.set_hidden(16);
  c.set_heads(2);
  c.set_vocab(23);
  c.set_positions(12);
  c.set_activation_checkpointing(checkpointing);
  return c;
}

std::string ConfigPath(const std::string& file) { return "models/configs/" + file; }

TEST(Gpt, ParameterNamesAndShapesAreHuggingFaceGpt2s) {
  auto model = *Gpt::Create(Tiny());
  std::vector<std::string> names;
  for (Parameter* p : model->Parameters()) names.push_back(p->name);
  // GPT2Model.state_dict() order and names, minus the "attn.bias" mask buffers.
  const std::vector<std::string> block = {
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
      "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
      "mlp.c_proj.weight", "mlp.c_proj.bias"};
  std::vector<std::string> want = {"wte.weight", "wpe.weight"};
  for (int l = 0; l < 2; ++l) {
    for (const auto& n : block) want.push_back("h." + std::to_string(l) + "." + n);
  }
  want.push_back("ln_f.weight");
  want.push_back("ln_f.bias");
  EXPECT_EQ(names, want);
  const auto params = model->Parameters();
  EXPECT_EQ(params[0]->shape, (std::vector<int64_t>{23, 16}));
  EXPECT_EQ(params[4]->shape, (std::vector<int64_t>{16, 48})) << "c_attn is (in, out)";
  EXPECT_EQ(params[12]->shape, (std::vector<int64_t>{64, 16})) << "mlp.c_proj is (4d, d)";
}

TEST(Gpt, CountParametersEqualsTheModuleTreeAndKnownSizes) {
  for (const char* file : {"gpt.textproto", "papers.textproto"}) {
    auto list = LoadConfigs(ConfigPath(file));
    ASSERT_TRUE(list.ok()) << list.status();
    for (const GptConfig& c : list->configs()) {
      auto model = *Gpt::Create(c);  // no storage: a 20T model costs nothing
      int64_t sum = 0;
      for (Parameter* p : model->Parameters()) sum += p->numel();
      EXPECT_EQ(CountParameters(c), sum) << c.name();
      // Every paper model is within 12% of the size its name says (the papers
      // round, and count the head and embeddings differently).
      const std::string label = c.name().substr(c.name().rfind('_') + 1);
      if (std::string(file) == "papers.textproto") {
        const double nominal = std::stod(label) * (label.back() == 't' ? 1e12 : 1e9);
        EXPECT_GT(sum / nominal, 0.95) << c.name();
        EXPECT_LT(sum / nominal, 1.12) << c.name();
      }
    }
  }
  // GPT-2 small as Hugging Face reports it: 124,439,808 parameters.
  auto gpt2 = *FindConfig(*LoadConfigs(ConfigPath("gpt.textproto")), "gpt2");
  EXPECT_EQ(CountParameters(gpt2), 124439808);
}

TEST(Gpt, ConfigErrorsNameTheField) {
  GptConfig c = Tiny();
  c.set_heads(3);
  EXPECT_NE(ValidateConfig(c).message().find("heads = 3 must divide hidden = 16"), std::string::npos);
  c = Tiny();
  c.set_vocab(0);
  EXPECT_NE(ValidateConfig(c).message().find("'test': vocab = 0"), std::string::npos);
  c = Tiny();
  c.set_tiling(3);
  EXPECT_NE(ValidateConfig(c).message().find("tiling = 3 must be 0 or 1 (untiled) or divide hidden = 16"),
            std::string::npos);
  c.set_tiling(-1);
  EXPECT_FALSE(ValidateConfig(c).ok());
  c = Tiny(false);
  c.set_offload_activations(true);
  EXPECT_NE(ValidateConfig(c).message().find("offload_activations = true needs activation_checkpointing"),
            std::string::npos);
  EXPECT_EQ(LoadConfigs("models/configs/missing.textproto").status().code(),
            absl::StatusCode::kNotFound);
  auto list = *LoadConfigs(ConfigPath("gpt.textproto"));
  EXPECT_NE(FindConfig(list, "nope").status().message().find("have: gpt_125m"), std::string::npos);
}

// --model as a file: one GptConfig (named after the file when it sets no
// name, its errors its own), or a list whose entries --model_name picks.
TEST(Gpt, ResolveModelTakesOneConfigOrAListFromAFile) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  const std::string unnamed = write("mine.textproto", "layers: 1 hidden: 16 heads: 2 vocab: 32 positions: 8\n");
  auto one = ResolveModel(unnamed);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->name(), "mine");
  EXPECT_EQ(one->hidden(), 16);
  EXPECT_EQ(ResolveModel(write("named.textproto", "name: 'x' layers: 1 hidden: 16 heads: 2 vocab: 32 positions: 8"))
                ->name(),
            "x");
  const absl::Status no_layers =
      ResolveModel(write("flat.textproto", "name: 'flat' layers: 0 hidden: 16 heads: 2 vocab: 32 positions: 8"))
          .status();
  EXPECT_NE(no_layers.message().find("flat.textproto: GptConfig 'flat': layers = 0 must be > 0"), std::string::npos)
      << no_layers;
  const absl::Status entry = ResolveModel(unnamed, "gpt_125m").status();
  EXPECT_NE(entry.message().find("holds one GptConfig, not a GptConfigList, so it has no entry 'gpt_125m'"),
            std::string::npos)
      << entry;
  const std::string list = write("list.textproto",
                                 "configs { name: 'a' layers: 1 hidden: 16 heads: 2 vocab: 32 positions: 8 }\n"
                                 "configs { name: 'b' layers: 2 hidden: 16 heads: 2 vocab: 32 positions: 8 }\n");
  EXPECT_EQ(ResolveModel(list, "b")->layers(), 2);
  EXPECT_NE(ResolveModel(list).status().message().find("lists 2 models; pick one with --model_name (a, b)"),
            std::string::npos);
  // Neither kind: the error of the kind it was meant to be.
  const absl::Status typo = ResolveModel(write("typo.textproto", "name: 'x' layer: 1")).status();
  EXPECT_NE(typo.message().find("typo.textproto: not a GptConfig text proto: line 1 column 16"), std::string::npos)
      << typo;
  const absl::Status list_typo = ResolveModel(write("list_typo.textproto", "configs { layer: 1 }")).status();
  EXPECT_NE(list_typo.message().find("list_typo.textproto: not a GptConfigList text proto"), std::string::npos)
      << list_typo;
  const absl::Status empty = ResolveModel(write("empty.textproto", "# nothing yet\n")).status();
  EXPECT_NE(empty.message().find("empty.textproto sets no model"), std::string::npos) << empty;
}

// Binds flat storage on a fresh CpuDevice and initializes from `seed`.
struct Bound {
  std::unique_ptr<Device> device;
  std::unique_ptr<Gpt> model;
  FlatStorage storage;
};
Bound Make(const GptConfig& c, uint64_t seed = 7) {
  Bound b;
  b.device = *CreateCpuDevice();
  b.model = *Gpt::Create(c);
  b.storage = *BindFlatStorage(*b.model, *b.device, true);
  EXPECT_TRUE(b.model->Initialize(seed, *b.device).ok());
  return b;
}

std::vector<float> Values(const FlatStorage& s) {
  return std::vector<float>(s.values.as<float>(), s.values.as<float>() + s.numel);
}
std::vector<float> Grads(const FlatStorage& s) {
  return std::vector<float>(s.grads.as<float>(), s.grads.as<float>() + s.numel);
}

TEST(Gpt, InitializationFollowsGpt2AndDependsOnlyOnSeedAndName) {
  GptConfig c = Tiny();
  c.set_hidden(64);
  c.set_vocab(300);
  Bound a = Make(c, 1), b = Make(c, 1), other = Make(c, 2);
  EXPECT_EQ(Values(a.storage), Values(b.storage));
  EXPECT_NE(Values(a.storage), Values(other.storage));
  for (Parameter* p : a.model->Parameters()) {
    const float* x = p->value.data_as<float>();
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < p->numel(); ++i) {
      sum += x[i];
      sq += double(x[i]) * x[i];
    }
    const double mean = sum / p->numel(), std = std::sqrt(sq / p->numel() - mean * mean);
    if (p->name.find("ln_") != std::string::npos || p->name.find("ln_f") != std::string::npos) {
      EXPECT_EQ(mean, p->name.ends_with(".weight") ? 1.0 : 0.0) << p->name;
    } else if (p->name.ends_with(".bias")) {
      EXPECT_EQ(sq, 0.0) << p->name;
    } else {
      const double want = p->name.ends_with("c_proj.weight") ? 0.02 / std::sqrt(4.0) : 0.02;
      // Sample std of >= 4096 normals: within 5% (> 3 sigma for n = 4096).
      EXPECT_NEAR(std, want, 0.05 * want) << p->name;
      EXPECT_NEAR(mean, 0.0, 4 * want / std::sqrt(double(p->numel()))) << p->name;
    }
  }
  // The values come in pairs (the cosine and sine of one Box-Muller draw):
  // any range, at any parity, is the whole parameter's values bit for bit,
  // and the two of a pair are uncorrelated (|r| < 4 / sqrt(pairs)), with a
  // normal's kurtosis, 3 (within 0.15 for 19200 values, whose sampling sd
  // is sqrt(24 / n) = 0.035).
  Parameter* wte = a.model->Parameters()[0];
  ASSERT_EQ(wte->name, "wte.weight");
  const int64_t n = wte->numel();
  std::vector<float> whole(n);
  a.model->InitialValues(1, *wte, 0, n, whole.data());
  EXPECT_TRUE(std::equal(whole.begin(), whole.end(), wte->value.data_as<float>()));
  for (int64_t begin : {1, 2, 3, 7}) {
    for (int64_t count : {1, 2, 3, 6}) {
      std::vector<float> part(count);
      a.model->InitialValues(1, *wte, begin, count, part.data());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + begin)) << begin << " +" << count;
    }
  }
  double even_odd = 0, sq = 0, fourth = 0;
  for (int64_t i = 0; i + 1 < n; i += 2) even_odd += double(whole[i]) * whole[i + 1];
  for (float x : whole) {
    sq += double(x) * x;
    fourth += double(x) * x * x * x;
  }
  const double var = sq / n;
  EXPECT_LT(std::fabs(even_odd / (n / 2) / var), 4 / std::sqrt(n / 2.0));
  EXPECT_NEAR(fourth / n / (var * var), 3.0, 0.15);
}

std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(gen() % vocab);
  return v;
}

// The whole model's gradient, one parameter tensor at a time: along a random
// direction u restricted to that tensor, (L(p + hu) - L(p - hu)) / 2h must
// equal g . u. In fp32 with h = 1e-2 and L ~ 3, rounding contributes
// ~ 3 * 2^-24 * sqrt(tokens) / h ~ 1e-4 and truncation O(h^2) ~ 1e-4, so the
// tolerance is 2e-3 relative (plus 2e-4 absolute for tiny directional derivatives).
void GradientMatchesFiniteDifferences(bool checkpointing) {
  const GptConfig c = Tiny(checkpointing);
  Bound b = Make(c);
  const int64_t batch = 2, t = 12;
  const auto ids = RandomTokens(batch * t, c.vocab(), 3);
  auto targets = RandomTokens(batch * t, c.vocab(), 4);
  targets[5] = -1;  // an ignored position
  // Perturb LayerNorm weights and biases away from 1 and 0 so their
  // gradients are exercised in general position.
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> unit(-0.5f, 0.5f);
  for (Parameter* p : b.model->Parameters()) {
    if (p->name.find("ln") != std::string::npos || p->name.ends_with(".bias")) {
      for (int64_t i = 0; i < p->numel(); ++i) p->value.data_as<float>()[i] += unit(gen);
    }
  }
  const float scale = 1.0f / 23.0f;  // 1 / tokens counted
  auto loss = [&]() {
    auto r = b.model->ForwardBackward(*b.device, ids.data(), targets.data(), batch, t, scale, false);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tokens, 23);
    return r->sum * scale;
  };
  ASSERT_TRUE(b.model->ForwardBackward(*b.device, ids.data(), targets.data(), batch, t, scale, true).ok());
  const std::vector<float> grads = Grads(b.storage);
  const double h = 1e-2;
  for (Parameter* p : b.model->Parameters()) {
    const int64_t offset = p->value.data_as<float>() - b.storage.values.as<float>();
    std::vector<float> u(p->numel());
    for (auto& x : u) x = unit(gen) * 2;
    double analytic = 0;
    for (int64_t i = 0; i < p->numel(); ++i) analytic += double(grads[offset + i]) * u[i];
    float* x = p->value.data_as<float>();
    const std::vector<float> saved(x, x + p->numel());
    for (int64_t i = 0; i < p->numel(); ++i) x[i] = saved[i] + float(h) * u[i];
    const double up = loss();
    for (int64_t i = 0; i < p->numel(); ++i) x[i] = saved[i] - float(h) * u[i];
    const double down = loss();
    std::copy(saved.begin(), saved.end(), x);
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic, numeric, 2e-3 * std::fabs(numeric) + 2e-4) << p->name;
  }
}

TEST(GradCheck, WholeModel) { GradientMatchesFiniteDifferences(false); }
TEST(GradCheck, WholeModelWithActivationCheckpointing) { GradientMatchesFiniteDifferences(true); }

TEST(Gpt, CheckpointingGivesBitwiseTheSameGradientsAndAccumulates) {
  Bound plain = Make(Tiny(false)), ckpt = Make(Tiny(true));
  const auto ids = RandomTokens(24, 23, 8), targets = RandomTokens(24, 23, 9);
  for (Bound* b : {&plain, &ckpt}) {
    ASSERT_TRUE(b->model->ForwardBackward(*b->device, ids.data(), targets.data(), 2, 12, 0.1f, true).ok());
  }
  EXPECT_EQ(Grads(plain.storage), Grads(ckpt.storage));
  // A second identical micro-batch doubles every gradient (+= contract).
  const std::vector<float> once = Grads(plain.storage);
  ASSERT_TRUE(plain.model->ForwardBackward(*plain.device, ids.data(), targets.data(), 2, 12, 0.1f, true).ok());
  const std::vector<float> twice = Grads(plain.storage);
  // (Not bitwise: BLAS folds the += into its own summation order.)
  float largest = 0;
  for (float g : once) largest = std::max(largest, std::fabs(g));
  for (size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(twice[i], 2 * once[i], 1e-6 * largest) << i;
}

// Memory-centric tiling: the same model stored as tiles. Initial values
// are the untiled model's (JoinTiles); one pass gives the same loss and
// gradients up to the rounding of dx's split sums (models/layers_test.cc
// bounds one layer; here, through the whole model: loss within 1e-6
// relative, each gradient within 1e-4 of the largest).
TEST(Gpt, TilingStoresTheSameModelInTiles) {
  for (bool checkpointing : {false, true}) {
    GptConfig tiled_config = Tiny(checkpointing);
    tiled_config.set_tiling(4);
    Bound plain = Make(Tiny(checkpointing)), tiled = Make(tiled_config);
    EXPECT_EQ(tiled.model->Parameters().size(), plain.model->Parameters().size() + 2 * 4 * (4 - 1) * 2)
        << "each of 2 blocks' 4 projections: 4 tiles of (weight, bias) for one (weight, bias)";
    EXPECT_EQ(tiled.storage.numel, plain.storage.numel);
    EXPECT_EQ(tiled.model->Parameters()[4]->name, "h.0.attn.c_attn.tile0.weight");
    auto joined = [&](const std::vector<float>& flat) {
      std::vector<float> out;
      const std::vector<LogicalParameter> logical = *JoinTiles(*tiled.model, flat);
      for (const LogicalParameter& p : logical) out.insert(out.end(), p.values.begin(), p.values.end());
      return out;
    };
    EXPECT_EQ(joined(Values(tiled.storage)), Values(plain.storage)) << "initialized as the untiled model";
    // A partition's range of a tile starts and ends anywhere: mid-row,
    // across rows, at any parity. c_attn's tiles are 12 wide, 16 rows.
    const Parameter& tile = *tiled.model->Parameters()[4];
    ASSERT_EQ(tile.shape.back(), 12);
    std::vector<float> whole(tile.numel());
    tiled.model->InitialValues(7, tile, 0, tile.numel(), whole.data());  // Make's seed
    EXPECT_TRUE(std::equal(whole.begin(), whole.end(), tile.value.data_as<float>()));
    for (int64_t begin : {0, 1, 5, 11, 12, 13, 30}) {
      for (int64_t count : {1, 2, 11, 13, 25, 40}) {
        std::vector<float> part(count);
        tiled.model->InitialValues(7, tile, begin, count, part.data());
        EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + begin)) << begin << " +" << count;
      }
    }
    const auto ids = RandomTokens(24, 23, 8), targets = RandomTokens(24, 23, 9);
    auto want = *plain.model->ForwardBackward(*plain.device, ids.data(), targets.data(), 2, 12, 0.1f, true);
    auto got = *tiled.model->ForwardBackward(*tiled.device, ids.data(), targets.data(), 2, 12, 0.1f, true);
    EXPECT_NEAR(got.sum, want.sum, 1e-6 * std::fabs(want.sum));
    const std::vector<float> g = joined(Grads(tiled.storage)), g_want = Grads(plain.storage);
    float largest = 0;
    for (float x : g_want) largest = std::max(largest, std::fabs(x));
    ASSERT_EQ(g.size(), g_want.size());
    for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], g_want[i], 1e-4 * largest) << i;
  }
}

// Activation checkpoint offload moves the checkpoints, not the math: the
// same loss and gradients bit for bit, with 5 layers (6 checkpoints: three
// leave the device and come back) and with 2 (3 checkpoints: all stay in
// the slots). The device holds 3 checkpoint slots instead of L + 1, pinned
// host memory all L + 1, each what ActivationPlan states.
TEST(Gpt, OffloadedCheckpointsGiveBitwiseTheSameTraining) {
  for (int layers : {5, 2}) {
    GptConfig c = Tiny(true);
    c.set_layers(layers);
    GptConfig offloaded = c;
    offloaded.set_offload_activations(true);
    Bound plain = Make(c), off = Make(offloaded);
    const auto ids = RandomTokens(24, 23, 8), targets = RandomTokens(24, 23, 9);
    for (int pass = 0; pass < 2; ++pass) {  // the second accumulates onto the first
      auto want = *plain.model->ForwardBackward(*plain.device, ids.data(), targets.data(), 2, 12, 0.1f, true);
      auto got = *off.model->ForwardBackward(*off.device, ids.data(), targets.data(), 2, 12, 0.1f, true);
      EXPECT_EQ(got.sum, want.sum) << layers << " layers";
    }
    EXPECT_EQ(Grads(off.storage), Grads(plain.storage)) << layers << " layers";
    auto logits = *off.model->Logits(*off.device, ids.data(), 2, 12);
    EXPECT_EQ(logits, *plain.model->Logits(*plain.device, ids.data(), 2, 12)) << "evaluation: the slots are a ring";
    const int act = static_cast<int>(MemoryTag::kActivations);
    const int64_t checkpoint_bytes = 4 * 24 * 16;  // rows x hidden, fp32
    for (const auto& [bound, config] : {std::pair{&plain, c}, std::pair{&off, offloaded}}) {
      const MemoryPlan plan = ActivationPlan(config, 2, 12, DType::kF32, true);
      EXPECT_EQ(int64_t(bound->device->memory().account().peak(MemoryTag::kActivations)),
                plan.ByTag(MemorySpace::kDevice)[act]) << config.offload_activations();
      EXPECT_EQ(int64_t(bound->device->pinned_host().account().peak(MemoryTag::kActivations)),
                plan.ByTag(MemorySpace::kPinnedHost)[act]) << config.offload_activations();
    }
    const int64_t saved = plain.device->memory().account().peak(MemoryTag::kActivations) -
                          off.device->memory().account().peak(MemoryTag::kActivations);
    EXPECT_EQ(saved, layers + 1 > 3 ? (layers + 1 - 3) * checkpoint_bytes : 0) << layers << " layers";
    EXPECT_EQ(int64_t(off.device->pinned_host().account().peak(MemoryTag::kActivations)),
              layers + 1 > 3 ? (layers + 1) * checkpoint_bytes : 0);
  }
}

// Sum over rows of log(sum_j exp(logit_j)) - logit_target, in double.
double CrossEntropySum(const std::vector<float>& logits, const std::vector<int32_t>& targets, int v) {
  double sum = 0;
  for (size_t r = 0; r < targets.size(); ++r) {
    double m = -1e30, z = 0;
    for (int j = 0; j < v; ++j) m = std::max(m, double(logits[r * v + j]));
    for (int j = 0; j < v; ++j) z += std::exp(logits[r * v + j] - m);
    sum += std::log(z) + m - logits[r * v + targets[r]];
  }
  return sum;
}

TEST(Gpt, LogitsAgreeWithTheLoss) {
  Bound b = Make(Tiny());
  const auto ids = RandomTokens(12, 23, 10), targets = RandomTokens(12, 23, 11);
  auto logits = *b.model->Logits(*b.device, ids.data(), 1, 12);
  const double want = CrossEntropySum(logits, targets, 23);
  auto got = *b.model->ForwardBackward(*b.device, ids.data(), targets.data(), 1, 12, 1.0f, false);
  EXPECT_NEAR(got.sum, want, 1e-5 * want);
  EXPECT_EQ(got.tokens, 12);
}

TEST(Gpt, HooksRunAroundEveryModulesPassesInOrder) {
  Bound b = Make(Tiny());
  std::vector<std::string> events;
  b.model->AddHookRecursive([&](Module& m, HookPoint point) {
    events.push_back(std::string(HookPointName(point)) + " " + m.path());
    return absl::OkStatus();
  });
  const auto ids = RandomTokens(12, 23, 12);
  ASSERT_TRUE(b.model->ForwardBackward(*b.device, ids.data(), ids.data(), 1, 12, 1.0f, true).ok());
  auto index = [&](const std::string& e) {
    return std::find(events.begin(), events.end(), e) - events.begin();
  };
  const auto n = static_cast<long>(events.size());
  // Every Linear and LayerNorm runs forward and backward exactly once.
  for (Parameter* p : b.model->Parameters()) {
    const std::string& path = p->owner->path();
    EXPECT_LT(index("before_forward " + path), n) << path;
    EXPECT_LT(index("after_backward " + path), n) << path;
    EXPECT_LT(index("before_forward " + path), index("after_forward " + path)) << path;
  }
  // Nesting: a block's before/after bracket its children's; blocks run 0, 1
  // forward and 1, 0 backward.
  EXPECT_LT(index("before_forward h.0"), index("before_forward h.0.ln_1"));
  EXPECT_LT(index("after_forward h.0.mlp.c_proj"), index("after_forward h.0"));
  EXPECT_LT(index("after_forward h.0"), index("before_forward h.1"));
  EXPECT_LT(index("after_backward h.1"), index("before_backward h.0"));
  EXPECT_LT(index("before_backward h.0"), index("before_backward h.0.mlp.c_proj"));
  // A failing hook stops the pass with its Status.
  b.model->AddHookRecursive([](Module& m, HookPoint point) {
    if (m.path() == "h.1.attn" && point == HookPoint::kBeforeForward) {
      return absl::ResourceExhaustedError("gather failed for h.1.attn");
    }
    return absl::OkStatus();
  });
  auto st = b.model->ForwardBackward(*b.device, ids.data(), ids.data(), 1, 12, 1.0f, true);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kResourceExhausted);
}

// Mixed precision: parameters and gradients bound as bf16 or fp16, so every
// matmul takes 16-bit operands. Against an fp32 model holding the same
// (16-bit) values, only roundings differ: with fp16, of the activations at
// matmul inputs and of the gradients; with bf16 (activations bf16 end to
// end), of every op's activation output and of the gradients. Measured on
// this tiny model: loss within 1e-3 of an ulp (relative), gradients within
// 0.61 (fp16) and 1.28 (bf16) of a 16-bit ulp (relative L2); the bounds are
// 1 ulp for the loss and 2 for the gradients.
void SixteenBitModelTracksFp32(DType dtype, bool checkpointing) {
  const GptConfig c = Tiny(checkpointing);
  auto device = *CreateCpuDevice();
  auto model16 = *Gpt::Create(c);
  const FlatStorage s16 = *BindFlatStorage(*model16, *device, true, MemoryTag::kParams16, dtype);
  ASSERT_TRUE(model16->Initialize(7, *device).ok());
  Bound b32 = Make(c);
  ASSERT_EQ(s16.numel, b32.storage.numel);
  ASSERT_TRUE(Convert(s16.values.data(), dtype, b32.storage.values.data(), DType::kF32, s16.numel).ok());
  const auto ids = RandomTokens(24, 23, 13), targets = RandomTokens(24, 23, 14);
  auto l16 = model16->ForwardBackward(*device, ids.data(), targets.data(), 2, 12, 0.25f, true);
  auto l32 = b32.model->ForwardBackward(*b32.device, ids.data(), targets.data(), 2, 12, 0.25f, true);
  ASSERT_TRUE(l16.ok()) << l16.status();
  ASSERT_TRUE(l32.ok()) << l32.status();
  const double ulp = dtype == DType::kBF16 ? 0x1p-8 : 0x1p-11;
  EXPECT_NEAR(l16->sum, l32->sum, ulp * l32->sum) << DTypeName(dtype);
  std::vector<float> g16(s16.numel);
  ASSERT_TRUE(Convert(s16.grads.data(), dtype, g16.data(), DType::kF32, s16.numel).ok());
  const std::vector<float> g32 = Grads(b32.storage);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g32.size(); ++i) {
    diff += (double(g16[i]) - g32[i]) * (double(g16[i]) - g32[i]);
    norm += double(g32[i]) * g32[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), 2 * ulp) << DTypeName(dtype) << " gradient, relative L2 error";
  EXPECT_GT(diff, 0) << "16-bit storage must change something";
  if (dtype != DType::kBF16) return;
  // bf16 logits reach the caller widened exactly, and the loss is their
  // cross-entropy (summed here in double from the same values).
  const std::vector<float> logits = *model16->Logits(*device, ids.data(), 2, 12);
  ASSERT_EQ(logits.size(), 24u * 23);
  const double want = CrossEntropySum(logits, targets, 23);
  uint16_t bits;
  for (float x : logits) {
    ASSERT_TRUE(Convert(&x, DType::kF32, &bits, DType::kBF16, 1).ok());
    float back;
    ASSERT_TRUE(Convert(&bits, DType::kBF16, &back, DType::kF32, 1).ok());
    ASSERT_EQ(back, x) << "a logit that bf16 cannot hold";
  }
  auto forward = *model16->ForwardBackward(*device, ids.data(), targets.data(), 2, 12, 1.0f, false);
  EXPECT_NEAR(forward.sum, want, 1e-5 * want);
}

TEST(Gpt, LogitsRowsArePaddedToAMultipleOf128) {
  GptConfig c = Tiny();
  for (const auto& [vocab, padded] : {std::pair<int64_t, int64_t>{50257, 50304}, {128, 128}, {129, 256}, {1, 128}}) {
    c.set_vocab(vocab);
    EXPECT_EQ(PaddedVocab(c), padded) << vocab;
  }
  c.set_vocab(50257);
  EXPECT_EQ(LogitsChunkRows(c, 1 << 20), (int64_t{1} << 26) / 50304);
}

// ActivationPlan against its formula (models/gpt.h) in each precision, and
// a pass's measured device peak against the plan: with bf16 parameters every
// activation is 2 bytes and no rounded operand copies exist; with fp16 the
// activations stay fp32 and the copies do.
TEST(Gpt, ActivationPlanFollowsTheActivationType) {
  GptConfig c = Tiny();
  c.set_tiling(2);
  // The vocabulary (23) padded to a multiple of 128: the logits' stored rows.
  const int64_t batch = 2, t = 12, rows = batch * t, d = 16, h = 2, v = 23, vp = 128, layers = 2, k = 2;
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t a = dtype == DType::kBF16 ? 2 : 4;
    const MemoryPlan plan = ActivationPlan(c, batch, t, dtype, false);
    const std::string name(DTypeName(dtype));
    EXPECT_EQ(plan.at("residual stream").bytes, a * (layers + 1) * rows * d) << name;
    EXPECT_EQ(plan.at("block activations").bytes, layers * (a * rows * 15 * d + 4 * rows * (h + 4))) << name;
    EXPECT_EQ(plan.at("embeddings, ln_f, losses, ids").bytes, a * rows * 2 * d + 4 * rows * 6) << name;
    EXPECT_EQ(plan.at("backward scratch").bytes, a * rows * 12 * d + 4 * rows * h) << name;
    EXPECT_EQ(plan.at("logits chunk").bytes, a * rows * vp) << name;
    EXPECT_EQ(plan.at("tiled linear scratch").bytes, a * rows * 4 * d / k) << name;
    EXPECT_EQ(plan.contains("16-bit operands"), dtype == DType::kF16) << name;
    if (dtype == DType::kF16) {
      EXPECT_EQ(plan.at("16-bit operands").bytes, 2 * (2 * rows * 4 * d + rows * d + rows * vp));
    }
    auto device = *CreateCpuDevice();
    auto model = *Gpt::Create(c);
    const FlatStorage storage = *BindFlatStorage(*model, *device, true, MemoryTag::kParams16, dtype);
    ASSERT_TRUE(model->Initialize(7, *device).ok());
    const auto ids = RandomTokens(rows, v, 15);
    ASSERT_TRUE(model->ForwardBackward(*device, ids.data(), ids.data(), batch, t, 1.0f, true).ok()) << name;
    const auto peak = [&](MemoryTag tag) { return int64_t(device->memory().account().peak(tag)); };
    const auto planned = plan.ByTag(MemorySpace::kDevice);
    EXPECT_EQ(peak(MemoryTag::kActivations), planned[int(MemoryTag::kActivations)]) << name;
    EXPECT_EQ(peak(MemoryTag::kWorkspace), planned[int(MemoryTag::kWorkspace)]) << name;
  }
}

TEST(Gpt, Bf16ParametersTrackFp32) { SixteenBitModelTracksFp32(DType::kBF16, false); }
TEST(Gpt, Fp16ParametersWithCheckpointingTrackFp32) { SixteenBitModelTracksFp32(DType::kF16, true); }

TEST(Gpt, RefusesParametersBoundInMixedTypes) {
  Bound b = Make(Tiny());
  Parameter* p = b.model->Parameters()[3];
  std::vector<uint16_t> half(p->numel());
  p->value = Tensor(half.data(), DType::kBF16, p->shape, b.device.get());
  std::vector<int32_t> ids(12, 1);
  auto r = b.model->ForwardBackward(*b.device, ids.data(), ids.data(), 1, 12, 1.0f, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find(p->name + " is bound as bf16"), std::string::npos) << r.status();
}

TEST(Gpt, RefusesUnboundStorageAndBadInputs) {
  auto device = *CreateCpuDevice();
  auto model = *Gpt::Create(Tiny());
  std::vector<int32_t> ids(12, 1);
  auto r = model->ForwardBackward(*device, ids.data(), ids.data(), 1, 12, 1.0f, false);
  EXPECT_NE(r.status().message().find("parameter wte.weight has no storage bound"), std::string::npos)
      << r.status();
  auto storage = *BindFlatStorage(*model, *device, false);
  r = model->ForwardBackward(*device, ids.data(), ids.data(), 1, 12, 1.0f, true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << "no gradients bound";
  r = model->ForwardBackward(*device, ids.data(), ids.data(), 1, 13, 1.0f, false);
  EXPECT_NE(r.status().message().find("0 < sequence <= 12 positions"), std::string::npos) << r.status();
  ids[3] = 23;
  r = model->ForwardBackward(*device, ids.data(), ids.data(), 1, 12, 1.0f, false);
  EXPECT_NE(r.status().message().find("token id 23 at position 3"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace memwall::models
