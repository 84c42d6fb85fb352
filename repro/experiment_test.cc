// Experiments: the checked-in files parse; every bad value is an
// InvalidArgument naming its field (the issue's list: stage 4, zero or
// negative bucket sizes, a negative persistence threshold; a world size
// that does not match the launch is zero_memory_test.py's); and the
// harness's quoting.
#include "repro/experiment.h"
#include "repro/sweep.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "repro/harness.h"
#include "zero/config.h"
#include "runtime/files.h"

namespace memwall::repro {
namespace {

// Every experiment of every result folder parses, and names its results
// for its place: repro/<paper>/<result>/experiment.textproto writes
// results/<paper>_<result>/, a sibling X.textproto results/<paper>_<result>_X/.
TEST(Experiment, CheckedInExperimentsParse) {
  int n = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator("repro")) {
    const std::filesystem::path& path = entry.path();
    if (path.extension() != ".textproto") continue;
    auto e = LoadExperiment(path.string());
    EXPECT_TRUE(e.ok()) << path << ": " << e.status();
    const std::filesystem::path folder = path.parent_path().lexically_relative("repro");
    std::string want = folder.parent_path().string() + "_" + folder.filename().string();
    if (path.stem() != "experiment") want += "_" + path.stem().string();
    if (e.ok()) {
      EXPECT_EQ(e->name(), want) << path;
    }
    ++n;
  }
  EXPECT_GE(n, 20);
}

constexpr char kGood[] = R"pb(
  name: "t"
  kind: ZERO_MEMORY
  model { name: "m" layers: 1 hidden: 16 heads: 2 vocab: 32 positions: 8 }
  training { seq: 8 micro_batch: 1 }
  world_sizes: [1, 2]
  stages: [0, 3]
)pb";

// kGood with `extra` appended, or with the line holding `extra`'s field
// name replaced when kGood already sets it (a message field may appear once).
void ExpectError(const std::string& extra, const std::string& want) {
  std::string text = kGood;
  const std::string field = extra.substr(0, extra.find_first_of(" :"));
  size_t at = text.find("\n  " + field + " ");
  if (at == std::string::npos) at = text.find("\n  " + field + ":");
  if (at != std::string::npos) {
    text.erase(at + 1, text.find('\n', at + 1) - at);
  }
  text += extra;
  auto e = ParseExperiment(text, "bad.textproto");
  ASSERT_FALSE(e.ok()) << text;
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find(want), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("bad.textproto"), std::string::npos) << e.status().message();
}

TEST(Experiment, DefaultsAndTrainerOptions) {
  auto e = ParseExperiment(kGood, "good");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->training().accumulation(), 1);
  EXPECT_EQ(e->training().precision(), zero::BF16);
  EXPECT_EQ(e->steps(), 2);
  EXPECT_EQ(e->device(), "cpu");
  const zero::TrainerOptions o = TrainerOptionsFor(*e, 3, 2);
  EXPECT_EQ(o.training.zero().stage(), 3);
  EXPECT_EQ(o.training.seq(), 8);
  EXPECT_EQ(o.training.precision(), zero::Precision::BF16);
  // The trainer reads the same config: the same defaults, checked the same way.
  auto checked = zero::TrainingOptions::Create(o.training);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ((*checked)->micro_batch(), 1);
}

TEST(Experiment, EachBadValueNamesItsField) {
  ExpectError("stages: 4", "Experiment stages = 4 must be 0, 1, 2 or 3");
  auto zero = [](const std::string& fields) { return "training { seq: 8 micro_batch: 1 zero { " + fields + " } }"; };
  ExpectError(zero("stage: 4"), "Experiment training.zero.stage = 4 must be unset");
  // Experiment.zero moved to training.zero: an old file is told, not run without it.
  ExpectError("zero { reduce_bucket_bytes: 1024 }", "Experiment no longer has a field \"zero\" (memwall removed it: see "
                                                    "repro/experiment.proto)");
  ExpectError(zero("reduce_bucket_bytes: 0"), "Experiment training.zero.reduce_bucket_bytes = 0 must be > 0");
  ExpectError(zero("reduce_bucket_bytes: -1"), "Experiment training.zero.reduce_bucket_bytes = -1 must be > 0");
  ExpectError(zero("allgather_bucket_bytes: 0"), "Experiment training.zero.allgather_bucket_bytes = 0 must be > 0");
  ExpectError(zero("prefetch_bucket_bytes: -8"), "Experiment training.zero.prefetch_bucket_bytes = -8 must be >= 0");
  ExpectError(zero("param_persistence_threshold: -1"),
              "Experiment training.zero.param_persistence_threshold = -1 must be >= 0");
  ExpectError(zero("max_live_params: 0"), "Experiment training.zero.max_live_params = 0 must be > 0");
  ExpectError("world_sizes: 0", "Experiment world_sizes = 0 must be in [1, 64]");
  ExpectError("training { seq: 9 micro_batch: 1 }",
              "Experiment training.seq = 9 must be in [1, model.positions = 8]");
  ExpectError("training { seq: 8 micro_batch: -1 }", "training.micro_batch = -1 must be > 0");
  ExpectError("training { seq: 8 micro_batch: 1 precision: fp8 }",
              "Unknown enumeration value of \"fp8\" for field \"precision\"");
  ExpectError("training { seq: 8 micro_batch: 1 adam { lr: -1 } }", "Experiment training.adam.lr = -1");
  ExpectError("training { seq: 8 micro_batch: 1 schedule { min_lr_ratio: 2 } }",
              "Experiment training.schedule.min_lr_ratio = 2 must be in [0, 1]");
  ExpectError("training { seq: 8 micro_batch: 1 clip_norm: -1 }", "Experiment training.clip_norm = -1 must be");
  ExpectError("training { seq: 8 micro_batch: 1 loss_scaling { growth_interval: 0 } }",
              "Experiment training.loss_scaling.growth_interval = 0 must be > 0");
  ExpectError("steps: -1", "Experiment steps = -1 must be > 0");
  ExpectError("device: \"tpu\"", "Experiment device = \"tpu\" must be cpu");
  ExpectError("device: \"cuda\"",
              "Experiment device = \"cuda\" must be cpu, or cuda for OFFLOAD_MAX_MODEL, OFFLOAD_THROUGHPUT");
  ExpectError("name: \"Bad Name\"", "Experiment name = \"Bad Name\" must be non-empty lower case");
  ExpectError("modeled { params: 0 ranks: 1 }", "modeled.params = 0 must be > 0");
  ExpectError("modeled { params: 10 ranks: 1 paper_bytes: [1, 2] }", "modeled.paper_bytes = 2 values given");
  ExpectError("model { name: \"m\" layers: 1 hidden: 16 heads: 3 vocab: 32 positions: 8 }", "Experiment model:");
  ExpectError("stagez: 1", "line 8 column 7: Message type \"memwall.repro.Experiment\" has no field named \"stagez\"");
  EXPECT_EQ(LoadExperiment("no/such.textproto").status().code(), absl::StatusCode::kNotFound);
}

constexpr char kGoodOffload[] = R"pb(
  name: "o"
  kind: OFFLOAD_MAX_MODEL
  training { seq: 8 micro_batch: 1 }
  steps: 3
  offload {
    ladder { name: "a" layers: 1 hidden: 16 heads: 2 vocab: 32 positions: 8 }
    ladder { name: "b" layers: 2 hidden: 16 heads: 2 vocab: 32 positions: 8 }
  }
)pb";

absl::Status ParseOffload(const std::string& edit_from, const std::string& edit_to) {
  std::string text = kGoodOffload;
  if (!edit_from.empty()) {
    const size_t at = text.find(edit_from);
    EXPECT_NE(at, std::string::npos) << edit_from;
    text.replace(at, edit_from.size(), edit_to);
  }
  return ParseExperiment(text, "offload.textproto").status();
}

TEST(Experiment, OffloadDefaults) {
  auto e = ParseExperiment(kGoodOffload, "good");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->offload().modes_size(), 4);
  EXPECT_EQ(e->offload().modes(0), OffloadSweep::STAGE0);
  EXPECT_EQ(e->offload().modes(3), OffloadSweep::OFFLOAD_DPU);
  EXPECT_EQ(e->offload().device_memory_bytes(), int64_t{1} << 30);
  EXPECT_EQ(e->offload().dpu_after_steps(), 1);
  EXPECT_EQ(e->offload().warmup_steps(), 2);
}

TEST(Experiment, EachBadOffloadValueNamesItsField) {
  auto expect = [](const absl::Status& st, const std::string& want) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("offload.textproto"), std::string::npos) << st.message();
  };
  expect(ParseOffload("layers: 2", "layers: 1"), "offload.ladder[1] (\"b\") = 3952 parameters must be larger than the model before it (3952)");
  expect(ParseOffload("heads: 2 vocab: 32 positions: 8 }\n  }", "heads: 3 vocab: 32 positions: 8 }\n  }"), "Experiment offload.ladder[1] (\"b\"):");
  expect(ParseOffload("seq: 8", "seq: 9"), "training.seq = 9 must be <= offload.ladder[0] (\"a\").positions = 8");
  expect(ParseOffload("steps: 3", "steps: 2"), "Experiment steps = 2 must be >= offload.dpu_after_steps + 2 = 3");
  expect(ParseOffload("offload {", "offload { modes: [OFFLOAD, OFFLOAD]"), "offload.modes = OFFLOAD is listed twice");
  expect(ParseOffload("offload {", "offload { device_memory_bytes: 4096"), "offload.device_memory_bytes = 4096 must be >= 1 MiB");
  EXPECT_TRUE(ParseOffload("offload {", "offload { write_traces: true").ok()) << "the max-model walk traces its attempts";
  std::string throughput = kGoodOffload;
  throughput.replace(throughput.find("OFFLOAD_MAX_MODEL"), 17, "OFFLOAD_THROUGHPUT");
  throughput.replace(throughput.find("offload {"), 9, "offload { warmup_steps: 1");
  expect(ParseExperiment(throughput, "offload.textproto").status(),
         "offload.warmup_steps = 1 must be >= offload.dpu_after_steps + 1 = 2");
  expect(ParseOffload("offload {", "offload { micro_batches: [2, 4]"),
         "offload.micro_batches = [...] is for OFFLOAD_THROUGHPUT");
  expect(ParseOffload("offload {", "offload { halve_micro_batch_to_fit: true"),
         "offload.halve_micro_batch_to_fit = true is for OFFLOAD_THROUGHPUT");
  auto throughput_with = [](const std::string& fields) {
    std::string text = kGoodOffload;
    text.replace(text.find("OFFLOAD_MAX_MODEL"), 17, "OFFLOAD_THROUGHPUT");
    text.replace(text.find("offload {"), 9, "offload { " + fields);
    return ParseExperiment(text, "offload.textproto").status();
  };
  EXPECT_TRUE(throughput_with("micro_batches: [2, 4] halve_micro_batch_to_fit: true").ok());
  expect(throughput_with("start_at_estimate: true"),
         "offload.start_at_estimate = true is for OFFLOAD_MAX_MODEL and INFINITY_MAX_MODEL");
  EXPECT_TRUE(ParseOffload("offload {", "offload { start_at_estimate: true").ok());
  expect(ParseOffload("offload {", "offload { modes: [STAGE0, OFFLOAD] dpu_values_on_device: true"),
         "offload.dpu_values_on_device = true needs a mode with the delayed update (OFFLOAD_DPU)");
  EXPECT_TRUE(ParseOffload("offload {", "offload { modes: [OFFLOAD_DPU] dpu_values_on_device: true").ok());
  EXPECT_TRUE(ParseOffload("offload {", "offload { dpu_values_on_device: true").ok()) << "the default modes run DPU";
  expect(throughput_with("micro_batches: [2]"), "offload.micro_batches = 1 entries must give one per ladder model (2)");
  expect(throughput_with("micro_batches: [2, 0]"), "offload.micro_batches[1] (\"b\") = 0 must be in [1, 268435455] (at most 2147483647 tokens at training.seq = 8)");
  expect(throughput_with("micro_batches: [2, 4294967296]"), "offload.micro_batches[1] (\"b\") = 4294967296 must be in");
  expect(throughput_with("micro_batches: [2, 268435456]"), "offload.micro_batches[1] (\"b\") = 268435456 must be in");
  expect(ParseOffload("training {", "stages: 2 training {"), "stages = [...] must be unset for OFFLOAD_MAX_MODEL");
  expect(ParseOffload("training {", "training { zero { offload_optimizer { device: CPU } }"),
         "training.zero.offload_optimizer = {...} must be unset: offload.modes set it");
  expect(ParseOffload("training {", "model { name: \"m\" layers: 1 hidden: 16 heads: 2 vocab: 32 positions: 8 } training {"),
         "model = {...} must be unset for OFFLOAD_MAX_MODEL");
  expect(ParseExperiment(std::string(kGood) + "offload { dpu_after_steps: 1 }", "offload.textproto").status(),
         "offload = {...} must be unset for ZERO_MEMORY");
  expect(ParseOffload("offload {", "offload { host_pinned_memory_bytes: -1"),
         "offload.host_pinned_memory_bytes = -1 must be >= 0");
  expect(ParseOffload("offload {", "offload { tile_elements: -2"), "offload.tile_elements = -2 must be >= 0");
  expect(ParseOffload("offload {", "offload { nvme_path: \"/nvme\""),
         "offload.nvme_path = \"/nvme\" needs an NVMe mode");
  expect(ParseOffload("offload {", "offload { modes: [STAGE3_NVME] swap_buffer_bytes: -1"),
         "offload.swap_buffer_bytes = -1 must be >= 0");
  std::string no_ladder = kGoodOffload;
  no_ladder = no_ladder.substr(0, no_ladder.find("  offload {"));
  expect(ParseExperiment(no_ladder, "offload.textproto").status(), "offload.ladder = [] must list at least one model");
}

// INFINITY_TILING: one ZeRO-3 mode (ZeRO-Inf-CPU unless given) and the
// tiling factors; each bad value named.
TEST(Experiment, TilingSweepDefaultsAndRefusals) {
  std::string text = kGoodOffload;
  text.replace(text.find("OFFLOAD_MAX_MODEL"), 17, "INFINITY_TILING");
  text.replace(text.find("offload {"), 9, "offload { tiling_factors: [1, 4]");
  auto e = ParseExperiment(text, "tiling");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->offload().modes_size(), 1);
  EXPECT_EQ(e->offload().modes(0), OffloadSweep::STAGE3_OFFLOAD_CPU_PARAMS);
  auto refused = [&](const std::string& from, const std::string& to, const std::string& want) {
    std::string bad = text;
    bad.replace(bad.find(from), from.size(), to);
    const absl::Status st = ParseExperiment(bad, "tiling.textproto").status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
  };
  refused("tiling_factors: [1, 4]", "tiling_factors: [1, 0]", "offload.tiling_factors = 0 must be >= 1");
  refused("tiling_factors: [1, 4]", "", "offload.tiling_factors = [] must list at least one factor");
  refused("tiling_factors: [1, 4]", "tiling_factors: [1] modes: [STAGE3, STAGE3_OFFLOAD]",
          "offload.modes = 2 must name exactly one mode for INFINITY_TILING");
  refused("tiling_factors: [1, 4]", "tiling_factors: [1] modes: [OFFLOAD]", "must be a ZeRO-3 mode");
  refused("positions: 8 }\n  }", "positions: 8 tiling: 2 }\n  }", "offload.ladder[1].tiling = 2 must be unset");
  refused("offload {", "offload { write_traces: true",
          "offload.write_traces = true is for OFFLOAD_THROUGHPUT, OFFLOAD_MAX_MODEL and INFINITY_MAX_MODEL");
  EXPECT_NE(ParseOffload("offload {", "offload { tiling_factors: [2]").message().find(
                "offload.tiling_factors = [...] is for INFINITY_TILING"),
            std::string::npos);
}

// INFINITY_PREFETCH and INFINITY_ACTIVATION_OFFLOAD: one ZeRO-3 mode
// (ZeRO-Inf-CPU unless given); prefetch needs a prefetch to compare with,
// activation offload needs checkpointing models it can set it on.
TEST(Experiment, PairedSweepsDefaultsAndRefusals) {
  auto with_kind = [](const std::string& kind, const std::string& from, const std::string& to) {
    std::string text = kGoodOffload;
    text.replace(text.find("OFFLOAD_MAX_MODEL"), 17, kind);
    for (size_t at = text.find("positions: 8 }"); at != std::string::npos; at = text.find("positions: 8 }", at + 1)) {
      text.replace(at, 14, "positions: 8 activation_checkpointing: true }");
    }
    if (!from.empty()) text.replace(text.find(from), from.size(), to);
    return ParseExperiment(text, "paired.textproto");
  };
  for (const char* kind : {"INFINITY_PREFETCH", "INFINITY_ACTIVATION_OFFLOAD"}) {
    auto e = with_kind(kind, "", "");
    ASSERT_TRUE(e.ok()) << kind << ": " << e.status();
    ASSERT_EQ(e->offload().modes_size(), 1);
    EXPECT_EQ(e->offload().modes(0), OffloadSweep::STAGE3_OFFLOAD_CPU_PARAMS);
    EXPECT_NE(with_kind(kind, "offload {", "offload { modes: [STAGE2]").status().message().find("must be a ZeRO-3 mode"),
              std::string::npos);
  }
  EXPECT_NE(with_kind("INFINITY_PREFETCH", "training {", "training { zero { prefetch_bucket_bytes: 0 }")
                .status().message().find("training.zero.prefetch_bucket_bytes = 0 must be > 0"),
            std::string::npos);
  EXPECT_NE(with_kind("INFINITY_ACTIVATION_OFFLOAD", "vocab: 32 positions: 8 activation_checkpointing: true }",
                      "vocab: 32 positions: 8 }")
                .status().message().find("offload.ladder[0] = \"a\" needs activation_checkpointing"),
            std::string::npos);
}

// INFINITY_MEMORY: models by name, ranks, ZeRO-3 placements (Figure 2a's
// three, ZeRO-Inf-NVMe with and without the gradients, unless given);
// nothing else of a sweep.
TEST(Experiment, MemoryTableDefaultsAndRefusals) {
  const std::string good = R"pb(
    name: "m"
    kind: INFINITY_MEMORY
    training { seq: 1024 micro_batch: 1 }
    memory_table { models: ["infinity_10b"] ranks: 16 }
  )pb";
  auto e = ParseExperiment(good, "memory");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->memory_table().placements_size(), 4);
  EXPECT_EQ(e->memory_table().placements(2), OffloadSweep::STAGE3_NVME_NVME_PARAMS);
  EXPECT_EQ(e->memory_table().placements(3), OffloadSweep::STAGE3_NVME_ALL);
  auto refused = [&](const std::string& from, const std::string& to, const std::string& want) {
    std::string bad = good;
    bad.replace(bad.find(from), from.size(), to);
    const absl::Status st = ParseExperiment(bad, "memory.textproto").status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
  };
  refused("ranks: 16", "ranks: 0", "memory_table.ranks = 0 must be >= 1");
  refused("models: [\"infinity_10b\"] ", "", "memory_table.models = [] must name at least one model");
  refused("ranks: 16", "ranks: 16 placements: [OFFLOAD]", "memory_table.placements = OFFLOAD must be a ZeRO-3 mode");
  refused("memory_table {", "stages: 3 memory_table {", "must be unset for INFINITY_MEMORY");
  EXPECT_NE(ParseOffload("offload {", "memory_table { ranks: 1 } offload {").message().find(
                "memory_table = {...} must be unset for OFFLOAD_MAX_MODEL (read by INFINITY_MEMORY)"),
            std::string::npos);
}

// INFINITY_MAX_MODEL's modes default to the ZeRO-3 three; each mode's
// trainer options are its stage and offload placement.
TEST(Experiment, InfinityModesAndTheirOptions) {
  std::string text = kGoodOffload;
  text.replace(text.find("OFFLOAD_MAX_MODEL"), 17, "INFINITY_MAX_MODEL");
  text.replace(text.find("offload {"), 9, "offload { nvme_path: \"/nvme\" tile_elements: 4096 swap_buffer_bytes: 1048576");
  auto e = ParseExperiment(text, "infinity");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->offload().modes_size(), 3);
  EXPECT_EQ(e->offload().modes(0), OffloadSweep::STAGE3);
  EXPECT_EQ(e->offload().modes(2), OffloadSweep::STAGE3_NVME);
  const zero::TrainerOptions plain = OffloadTrainerOptions(*e, OffloadSweep::STAGE3);
  EXPECT_EQ(plain.training.zero().stage(), 3);
  EXPECT_EQ(plain.training.zero().offload_optimizer().device(), zero::OffloadOptimizerConfig::NONE);
  const zero::TrainerOptions cpu = OffloadTrainerOptions(*e, OffloadSweep::STAGE3_OFFLOAD);
  EXPECT_EQ(cpu.training.zero().stage(), 3);
  EXPECT_EQ(cpu.training.zero().offload_optimizer().device(), zero::OffloadOptimizerConfig::CPU);
  EXPECT_EQ(cpu.training.zero().offload_optimizer().tile_elements(), 4096);
  const zero::TrainerOptions nvme = OffloadTrainerOptions(*e, OffloadSweep::STAGE3_NVME);
  EXPECT_EQ(nvme.training.zero().offload_optimizer().device(), zero::OffloadOptimizerConfig::NVME);
  EXPECT_EQ(nvme.training.zero().offload_optimizer().nvme_path(), "/nvme");
  EXPECT_EQ(nvme.training.zero().offload_optimizer().pinned_budget_bytes(), 1048576);
  EXPECT_TRUE(zero::ValidateTrainingConfig(nvme.training, "").ok());
  const zero::TrainerOptions both = OffloadTrainerOptions(*e, OffloadSweep::STAGE3_NVME_CPU_PARAMS);
  EXPECT_EQ(both.training.zero().offload_optimizer().device(), zero::OffloadOptimizerConfig::NVME);
  EXPECT_EQ(both.training.zero().offload_param().device(), zero::OffloadParamConfig::CPU);
  EXPECT_EQ(OffloadTrainerOptions(*e, OffloadSweep::STAGE3_OFFLOAD).training.zero().offload_param().device(),
            zero::OffloadParamConfig::NONE);
  // ZeRO-Inf-NVMe: both on NVMe, the parameters' swap file beside the states'.
  const zero::TrainerOptions disk = OffloadTrainerOptions(*e, OffloadSweep::STAGE3_NVME_NVME_PARAMS);
  EXPECT_EQ(disk.training.zero().offload_optimizer().device(), zero::OffloadOptimizerConfig::NVME);
  EXPECT_EQ(disk.training.zero().offload_param().device(), zero::OffloadParamConfig::NVME);
  EXPECT_EQ(disk.training.zero().offload_param().nvme_path(), "/nvme");
  EXPECT_TRUE(zero::ValidateTrainingConfig(disk.training, "").ok());
  EXPECT_FALSE(disk.training.zero().offload_optimizer().gradients_on_nvme());
  // Every model state on NVMe: the gradient shard's swap file too.
  const zero::TrainerOptions all = OffloadTrainerOptions(*e, OffloadSweep::STAGE3_NVME_ALL);
  EXPECT_EQ(all.training.zero().offload_param().device(), zero::OffloadParamConfig::NVME);
  EXPECT_TRUE(all.training.zero().offload_optimizer().gradients_on_nvme());
  EXPECT_TRUE(zero::ValidateTrainingConfig(all.training, "").ok());
}

TEST(Experiment, CiSizedExperimentsParse) {
  for (const char* path : {"repro/offload/max_model/ci.textproto", "repro/offload/throughput/ci.textproto",
                           "repro/infinity/max_model/ci.textproto"}) {
    auto e = LoadExperiment(path);
    EXPECT_TRUE(e.ok()) << path << ": " << e.status();
  }
}

TEST(Experiment, KindMustBeGiven) {
  auto e = ParseExperiment("name: \"x\" model { name: \"m\" layers: 1 hidden: 16 heads: 2 vocab: 32 positions: 8 }"
                           " training { seq: 8 micro_batch: 1 } world_sizes: 1 stages: 0", "k");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("Experiment kind = KIND_UNSPECIFIED"), std::string::npos) << e.status();
}

TEST(Harness, QuotesForShellCsvAndJson) {
  EXPECT_EQ(ShellQuote("a b'c"), "'a b'\\''c'");
  EXPECT_EQ(CsvField("plain"), "plain");
  EXPECT_EQ(CsvField("ZeRO Figure 1: 7.5B, 64 ranks"), "\"ZeRO Figure 1: 7.5B, 64 ranks\"");
  EXPECT_EQ(CsvField("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(JsonString("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
}

// The results directory is checked before an experiment measures anything:
// a path under a file, and one where nothing may be written, are refused
// naming --results_dir.
TEST(Harness, ResultsDirRefusesWhatCannotHoldResults) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = tmp != nullptr ? tmp : "/tmp";
  Experiment e;
  e.set_name("x");
  RunContext run;
  run.results_root = root + "/results";
  auto ok = ResultsDir(e, run);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(std::filesystem::is_directory(*ok));
  ASSERT_TRUE(WriteFileAtomically(root + "/a_file", "x").ok());
  run.results_root = root + "/a_file";
  auto under_file = ResultsDir(e, run);
  ASSERT_FALSE(under_file.ok());
  EXPECT_EQ(under_file.status().code(), absl::StatusCode::kInvalidArgument) << under_file.status();
  EXPECT_NE(under_file.status().message().find("--results_dir"), std::string::npos) << under_file.status();
  run.results_root = "/proc/memwall_results";
  auto unwritable = ResultsDir(e, run);
  ASSERT_FALSE(unwritable.ok());
  EXPECT_NE(unwritable.status().message().find("--results_dir"), std::string::npos) << unwritable.status();
}

}  // namespace
}  // namespace memwall::repro
