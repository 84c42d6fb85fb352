// What a checkpoint means beyond its bytes: the model it was trained with
// (a model of the same shapes but other heads is refused), weights that are
// numbers (NaN or infinity neither loads nor consolidates), a step number
// within bounds, consolidation that cannot overwrite a checkpoint, and a
// tiled model consolidating to the untiled Hugging Face file.

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "models/gpt.h"
#include "models/gpt_io.h"
#include "runtime/cpu_device.h"
#include "zero/checkpoint.h"
#include "zero/testing.h"
#include "zero/trainer.h"

namespace memwall::zero {
namespace {

namespace fs = std::filesystem;

models::GptConfig Model(int heads, int tiling = 0) {
  models::GptConfig c;
  c.set_name(absl::StrCat("heads", heads));
  c.set_layers(2);
  c.set_hidden(32);
  c.set_heads(heads);
  c.set_vocab(256);
  c.set_positions(16);
  c.set_tiling(tiling);
  return c;
}

const models::TokenSource& Data() {
  static const auto* data = models::SyntheticSource(20000, 256, 5).release();
  return *data;
}


struct Training {
  std::unique_ptr<Device> device = *CreateCpuDevice();
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  std::unique_ptr<models::Gpt> model;
  std::unique_ptr<Trainer> trainer;
  explicit Training(const models::GptConfig& config, const std::function<void(TrainingConfig&)>& edit = {}) {
    model = *models::Gpt::Create(config);
    TrainerOptions o;
    o.training.set_seq(16);
    o.training.set_micro_batch(2);
    o.training.set_precision(FP32);
    o.training.mutable_zero()->set_stage(1);
    if (edit) edit(o.training);
    auto t = engine::CreateTrainer(*model, *device, *comm, o);
    EXPECT_TRUE(t.ok()) << t.status();
    trainer = std::move(*t);
  }
};

class CheckpointMeaning : public test::PerTestDirectory {
 protected:
  // A checkpoint of one step of `config`'s model.
  std::string Saved(const models::GptConfig& config) {
    Training run(config);
    EXPECT_TRUE(run.trainer->Step(Data()).ok());
    auto dir = run.trainer->Save((root_ / "run").string());
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.ok() ? *dir : "";
  }
};

// The size a save is checked against before it writes (and a loader
// checks each shard against) is the size a save writes.
TEST_F(CheckpointMeaning, ShardFilesAreTheSizeTheFormulaGives) {
  const fs::path dir = Saved(Model(4));
  auto meta = ReadCheckpointMetadata(dir.string());
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_FALSE(meta->has_pending_update());
  int64_t elements = 0;
  for (const CheckpointShard& shard : meta->shards()) {
    EXPECT_EQ(fs::file_size(dir / shard.file()), ShardFileBytes(shard.count(), false)) << shard.file();
    elements += shard.count();
  }
  EXPECT_EQ(elements, models::CountParameters(Model(4)));
  EXPECT_EQ(ShardFileBytes(10, false), 24u + 10 * 12);
  EXPECT_EQ(ShardFileBytes(10, true), 24u + 10 * 16);
}

TEST_F(CheckpointMeaning, AModelWithOtherHeadsIsRefused) {
  const std::string dir = Saved(Model(4));
  Training eight(Model(8));  // the same tensors: hidden 32 as 8 heads of 4
  const absl::Status st = eight.trainer->Load(dir);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("holds a model with heads = 4; this model has heads = 8"), std::string::npos) << st;
  EXPECT_TRUE(Training(Model(4)).trainer->Load(dir).ok()) << "the same model loads";

  // The same for an exported file: heads are recorded in its metadata.
  Training four(Model(4));
  const std::string file = (root_ / "four.safetensors").string();
  ASSERT_TRUE(models::ExportGpt(*four.model, *four.trainer->MasterWeights(), file).ok());
  auto read = models::SafetensorsFile::Read(file);
  ASSERT_TRUE(read.ok()) << read.status();
  Training into(Model(8));
  const absl::Status imported = models::ImportGpt(*read, *into.model, *into.device);
  EXPECT_EQ(imported.code(), absl::StatusCode::kInvalidArgument) << imported;
  EXPECT_NE(imported.message().find("exported from a model with heads = 4; this model (GptConfig 'heads8') has "
                                    "heads = 8"),
            std::string::npos)
      << imported;
}

// A shard rewritten with one NaN master weight and its checksums made to
// match: only the meaning is wrong.
TEST_F(CheckpointMeaning, NonFiniteMasterWeightsNeitherLoadNorConsolidate) {
  const fs::path dir = Saved(Model(4));
  auto meta = ReadCheckpointMetadata(dir.string());
  ASSERT_TRUE(meta.ok()) << meta.status();
  const CheckpointTensor& wpe = meta->tensors(1);
  ASSERT_EQ(wpe.name(), "wpe.weight");
  const fs::path shard = dir / meta->shards(0).file();
  std::string bytes = test::ReadAll(shard);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 24 + 4 * (wpe.offset() + 7), &nan, 4);  // master section, wpe element 7
  test::RewriteShard(dir, 0, bytes);
  ASSERT_TRUE(ReadCheckpointMetadata(dir.string()).ok()) << "the checksums match";

  const std::string says = "holds a non-finite master weight (tensor wpe.weight element 7)";
  Training run(Model(4));
  const std::vector<float> before = *run.trainer->MasterWeights();
  const absl::Status loaded = run.trainer->Load(dir.string());
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
  EXPECT_NE(loaded.message().find(says), std::string::npos) << loaded;
  EXPECT_EQ(*run.trainer->MasterWeights(), before) << "refused before any state changed";
  const fs::path out = root_ / "out.safetensors";
  const auto consolidated = ConsolidateCheckpoint(dir.string(), out.string());
  EXPECT_EQ(consolidated.status().code(), absl::StatusCode::kDataLoss) << consolidated.status();
  EXPECT_NE(consolidated.status().message().find(says), std::string::npos) << consolidated.status();
  EXPECT_FALSE(fs::exists(out));

  // Nor does a live run export NaN weights.
  std::vector<float> weights = before;
  weights[3] = -std::numeric_limits<float>::infinity();
  const absl::Status exported = models::ExportGpt(*run.model, weights, out.string());
  EXPECT_EQ(exported.code(), absl::StatusCode::kInvalidArgument) << exported;
  EXPECT_NE(exported.message().find("tensor wte.weight holds -inf at element 3"), std::string::npos) << exported;
  EXPECT_FALSE(fs::exists(out));
}

// A run whose update overflowed (AdamW's decay factor 1 - lr · wd is -inf)
// holds non-finite master weights: Save refuses them, naming a tensor, and
// leaves no complete checkpoint.
TEST_F(CheckpointMeaning, ASaveOfNonFiniteMasterWeightsIsRefused) {
  Training run(Model(4), [](TrainingConfig& t) {
    t.mutable_adam()->set_lr(1e38f);
    t.mutable_adam()->set_weight_decay(1e3f);
    t.mutable_adam()->set_adamw(true);
  });
  ASSERT_TRUE(run.trainer->Step(Data()).ok());
  const auto saved = run.trainer->Save((root_ / "diverged").string());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kFailedPrecondition) << saved.status();
  EXPECT_NE(saved.status().message().find("not saving step 1: the master weights hold "), std::string::npos)
      << saved.status();
  EXPECT_NE(saved.status().message().find("(tensor "), std::string::npos) << saved.status();
  EXPECT_FALSE(LatestCheckpoint((root_ / "diverged").string()).ok());
}

TEST_F(CheckpointMeaning, ConsolidationCannotWriteIntoACheckpoint) {
  const fs::path dir = Saved(Model(4));
  auto meta = ReadCheckpointMetadata(dir.string());
  ASSERT_TRUE(meta.ok());
  const fs::path shard = dir / meta->shards(0).file();
  const std::string shard_bytes = test::ReadAll(shard);
  for (const fs::path& out : {shard, dir / "metadata.pb", dir / "weights.safetensors", dir / "sub" / "w.safetensors"}) {
    const auto st = ConsolidateCheckpoint(dir.string(), out.string()).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << out << ": " << st;
    EXPECT_NE(st.message().find("is inside the checkpoint " + dir.string()), std::string::npos) << st;
  }
  EXPECT_EQ(test::ReadAll(shard), shard_bytes) << "the checkpoint is untouched";
  EXPECT_FALSE(fs::exists(dir / "weights.safetensors"));
  const auto into_dir = ConsolidateCheckpoint(dir.string(), root_.string()).status();
  EXPECT_EQ(into_dir.code(), absl::StatusCode::kInvalidArgument) << into_dir;
  EXPECT_NE(into_dir.message().find("is a directory"), std::string::npos) << into_dir;
  // Beside the checkpoints, in the run directory, is where it belongs.
  const fs::path beside = root_ / "run" / "weights.safetensors";
  EXPECT_TRUE(ConsolidateCheckpoint(dir.string(), beside.string()).ok());
  Training run(Model(4));
  EXPECT_TRUE(run.trainer->Load(dir.string()).ok()) << "and the checkpoint still loads";
}

// The consolidated file of a tiled run is what ExportGpt writes for its
// weights: the untiled names and shapes, byte for byte.
TEST_F(CheckpointMeaning, ATiledCheckpointConsolidatesToTheUntiledFile) {
  Training tiled(Model(4, /*tiling=*/4));
  ASSERT_TRUE(tiled.trainer->Step(Data()).ok());
  auto dir = tiled.trainer->Save((root_ / "run").string());
  ASSERT_TRUE(dir.ok()) << dir.status();
  const fs::path consolidated = root_ / "consolidated.safetensors", exported = root_ / "exported.safetensors";
  ASSERT_TRUE(ConsolidateCheckpoint(*dir, consolidated.string()).ok());
  ASSERT_TRUE(models::ExportGpt(*tiled.model, *tiled.trainer->MasterWeights(), exported.string()).ok());
  EXPECT_EQ(test::ReadAll(consolidated), test::ReadAll(exported));
  auto file = models::SafetensorsFile::Read(consolidated.string());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_NE(file->Find("h.0.mlp.c_fc.weight"), nullptr);
  EXPECT_EQ(file->Find("h.0.mlp.c_fc.weight")->shape, (std::vector<int64_t>{32, 128}));
  // It loads into the untiled model.
  Training plain(Model(4));
  EXPECT_TRUE(models::ImportGpt(*file, *plain.model, *plain.device).ok());
}

// Valid metadata of a 10-element model in one shard, step 0.
CheckpointMetadata TenElements() {
  CheckpointMetadata meta;
  meta.set_format_version(1);
  meta.set_world_size(1);
  meta.set_precision("fp32");
  meta.set_numel(10);
  meta.set_global_batch(1);
  meta.set_seq(1);
  meta.set_loss_scale(1);
  CheckpointShard* sh = meta.add_shards();
  sh->set_file("rank_00000.shard");
  sh->set_count(10);
  sh->set_bytes(24 + 12 * 10);
  return meta;
}

TEST(CheckpointMetadataBounds, AStepBeyondTwoToThe53IsRefused) {
  CheckpointMetadata meta = TenElements();
  meta.set_step(5);
  EXPECT_TRUE(ValidateCheckpointMetadata(meta, "d").ok());
  meta.set_step((int64_t{1} << 62) + 1);
  const absl::Status st = ValidateCheckpointMetadata(meta, "d");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("has step 4611686018427387905"), std::string::npos) << st;
  meta.set_step(5);
  meta.set_seq(int64_t{1} << 40);
  EXPECT_EQ(ValidateCheckpointMetadata(meta, "d").code(), absl::StatusCode::kDataLoss);
  meta.set_seq(1);
  meta.set_hysteresis_left(-1);
  const absl::Status hysteresis = ValidateCheckpointMetadata(meta, "d");
  EXPECT_EQ(hysteresis.code(), absl::StatusCode::kDataLoss) << hysteresis;
  EXPECT_NE(hysteresis.message().find("has hysteresis_left -1"), std::string::npos) << hysteresis;
}

// Metadata holding a field this version does not know (a newer writer's,
// or damage that still parses) is refused, not read without it.
TEST(CheckpointMetadataBounds, UnknownFieldsAreRefused) {
  CheckpointMetadata meta = TenElements();
  const std::string known = meta.SerializeAsString();
  EXPECT_TRUE(ParseCheckpointMetadata(CheckpointMarker(known), known, "d").ok());
  const std::string newer = known + std::string("\x98\x06\x01", 3);  // field 99, varint 1
  const auto parsed = ParseCheckpointMetadata(CheckpointMarker(newer), newer, "d");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << parsed.status();
  EXPECT_NE(parsed.status().message().find("holds fields this memwall does not know"), std::string::npos)
      << parsed.status();
}

// A pending delayed update adds a fourth section to every shard, and is
// the update of the metadata's Adam step, with a finite rate and scale.
TEST(CheckpointMetadataBounds, APendingUpdateMustMatchItsShardsAndStep) {
  CheckpointMetadata meta = TenElements();
  meta.set_step(5);
  meta.set_adam_step(5);
  CheckpointShard* sh = meta.mutable_shards(0);
  PendingUpdate* u = meta.mutable_pending_update();
  u->set_lr(1e-3f);
  u->set_step(5);
  u->set_grad_scale(1);
  absl::Status st = ValidateCheckpointMetadata(meta, "d");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("144 bytes for 10 elements (expected 184)"), std::string::npos) << st;
  sh->set_bytes(24 + 16 * 10);
  EXPECT_TRUE(ValidateCheckpointMetadata(meta, "d").ok());
  u->set_step(4);
  st = ValidateCheckpointMetadata(meta, "d");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("pending update with lr 0.001, step 4"), std::string::npos) << st;
  u->set_step(5);
  u->set_grad_scale(std::numeric_limits<float>::infinity());
  EXPECT_EQ(ValidateCheckpointMetadata(meta, "d").code(), absl::StatusCode::kDataLoss);
}

// Shards that list pieces (bandwidth-centric partitioning: a rank owns a
// chunk of every parameter): each shard's pieces are non-empty, in flat
// order and add up to its count, and all shards' runs together hold every
// element exactly once, in whatever order the shards are listed.
TEST(CheckpointMetadataBounds, ShardPiecesMustHoldEveryElementOnce) {
  // Ten elements, two parameters of 4 and 6, chunks of 2 and 3 a rank.
  CheckpointMetadata meta = TenElements();
  meta.set_world_size(2);
  meta.clear_shards();
  const auto shard = [&](int rank, std::vector<std::pair<int64_t, int64_t>> pieces) {
    CheckpointShard* sh = meta.add_shards();
    sh->set_rank(rank);
    sh->set_file(absl::StrCat("rank_0000", rank, ".shard"));
    int64_t count = 0;
    for (const auto& [begin, n] : pieces) {
      CheckpointPiece* piece = sh->add_pieces();
      piece->set_flat_begin(begin);
      piece->set_count(n);
      count += n;
    }
    sh->set_flat_begin(pieces.front().first);
    sh->set_count(count);
    sh->set_bytes(24 + 12 * count);
    return sh;
  };
  shard(1, {{2, 2}, {7, 3}});  // listed first: the order of the list does not matter
  shard(0, {{0, 2}, {4, 3}});
  ASSERT_TRUE(ValidateCheckpointMetadata(meta, "d").ok()) << ValidateCheckpointMetadata(meta, "d");

  const auto refused = [&](const CheckpointMetadata& bad, const std::string& says) {
    const absl::Status st = ValidateCheckpointMetadata(bad, "d");
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find(says), std::string::npos) << st;
  };
  CheckpointMetadata bad = meta;  // an empty piece
  bad.mutable_shards(0)->mutable_pieces(1)->set_count(0);
  refused(bad, "gives shard rank_00001.shard piece 1 elements [7, +0)");
  bad = meta;  // pieces out of flat order
  bad.mutable_shards(1)->mutable_pieces(0)->set_flat_begin(5);
  bad.mutable_shards(1)->set_flat_begin(5);
  refused(bad, "gives shard rank_00000.shard piece 1 elements [4, +3)");
  bad = meta;  // a piece past the end
  bad.mutable_shards(0)->mutable_pieces(1)->set_flat_begin(8);
  refused(bad, "piece 1 elements [8, +3) (pieces are non-empty, in flat order, inside [0, 10)");
  bad = meta;  // pieces that do not add up to the shard's count
  bad.mutable_shards(0)->mutable_pieces(1)->set_count(2);
  refused(bad, "gives shard rank_00001.shard pieces of 4 elements from 2 but elements [2, +5)");
  bad = meta;  // a range that does not start at the first piece
  bad.mutable_shards(1)->set_flat_begin(1);
  refused(bad, "gives shard rank_00000.shard pieces of 5 elements from 0 but elements [1, +5)");
  bad = meta;  // a gap: element 3 in no shard
  bad.mutable_shards(0)->mutable_pieces(0)->set_count(1);
  bad.mutable_shards(0)->set_count(4);
  bad.mutable_shards(0)->set_bytes(24 + 12 * 4);
  refused(bad, "has no shard holding elements [3, 4)");
  bad = meta;  // element 2 in both shards
  bad.mutable_shards(1)->mutable_pieces(0)->set_count(3);
  bad.mutable_shards(1)->set_count(6);
  bad.mutable_shards(1)->set_bytes(24 + 12 * 6);
  refused(bad, "has elements [2, 3) in two shards");
  bad = meta;  // the last element in no shard
  bad.mutable_shards(0)->mutable_pieces(1)->set_count(2);
  bad.mutable_shards(0)->set_count(4);
  bad.mutable_shards(0)->set_bytes(24 + 12 * 4);
  refused(bad, "has no shard holding elements [9, 10)");
}

}  // namespace
}  // namespace memwall::zero
