// models/: safetensors export/import round trips, Hugging Face name
// handling, one refusal test per kind of bad file, and the data sampler.
#include "models/gpt_io.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/data.h"
#include "models/flat_storage.h"
#include "runtime/cpu_device.h"
#include "runtime/files.h"

namespace memwall::models {
namespace {

GptConfig Tiny() {
  GptConfig c;
  c.set_name("tiny");
  c.set_layers(2);
  c.set_hidden(16);
  c.set_heads(2);
  c.set_vocab(300);
  c.set_positions(10);
  return c;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

struct Bound {
  std::unique_ptr<Device> device = *CreateCpuDevice();
  std::unique_ptr<Gpt> model;
  FlatStorage storage;
  explicit Bound(const GptConfig& c, uint64_t seed) {
    model = *Gpt::Create(c);
    storage = *BindFlatStorage(*model, *device, false);
    EXPECT_TRUE(model->Initialize(seed, *device).ok());
  }
  std::vector<float> Logits() {
    std::vector<int32_t> ids = {1, 299, 5, 7, 0, 42, 250, 9, 3, 100};
    return *model->Logits(*device, ids.data(), 1, 10);
  }
};

TEST(Safetensors, ExportThenImportGivesIdenticalLogits) {
  Bound a(Tiny(), 1), b(Tiny(), 2);
  ASSERT_NE(a.Logits(), b.Logits());
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(ExportGpt(*a.model, *a.device, path).ok());
  auto file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->entries().size(), 2u + 12 * 2 + 2);
  EXPECT_EQ(file->Find("h.1.attn.c_attn.weight")->shape, (std::vector<int64_t>{16, 48}));
  ASSERT_TRUE(ImportGpt(*file, *b.model, *b.device).ok());
  EXPECT_EQ(a.Logits(), b.Logits());
  // The config is recoverable from the tensors (all but the heads).
  auto inferred = InferGptConfig(*file, 2);
  ASSERT_TRUE(inferred.ok()) << inferred.status();
  EXPECT_EQ(inferred->layers(), 2);
  EXPECT_EQ(inferred->hidden(), 16);
  EXPECT_EQ(inferred->vocab(), 300);
  EXPECT_EQ(inferred->positions(), 10);
}

// The head count is the one thing the tensors do not say: InferGptConfig
// takes it from the file's metadata or a Hugging Face config.json beside
// it, and refuses each kind of bad or contradicting record by name.
TEST(Safetensors, TheHeadCountComesFromTheMetadataOrConfigJson) {
  Bound a(Tiny(), 1);
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path root = std::string(tmp != nullptr ? tmp : "/tmp") + "/heads";
  std::vector<SafetensorsTensor> tensors;
  for (Parameter* p : a.model->Parameters()) tensors.push_back({p->name, DType::kF32, p->shape, p->value.data()});
  int case_number = 0;
  // Weights with (or without) the exporter's metadata, a config.json beside
  // them holding `json` unless it is null; the inferred config.
  auto infer = [&](bool metadata, const char* json, int64_t heads = 0) {
    const std::filesystem::path dir = root / std::to_string(++case_number);
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "model.safetensors").string();
    if (metadata) {
      EXPECT_TRUE(ExportGpt(*a.model, *a.device, path).ok());
    } else {
      EXPECT_TRUE(WriteSafetensors(path, tensors, {}).ok());
    }
    if (json != nullptr) {
      EXPECT_TRUE(WriteFileAtomically((dir / "config.json").string(), json).ok());
    }
    auto file = SafetensorsFile::Read(path);
    EXPECT_TRUE(file.ok()) << file.status();
    return InferGptConfig(*file, heads);
  };
  auto refused = [](const absl::StatusOr<GptConfig>& got, const std::string& says) {
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_NE(got.status().message().find(says), std::string::npos) << got.status();
    EXPECT_NE(got.status().message().find("config.json"), std::string::npos) << got.status();
  };
  auto from_metadata = infer(true, nullptr);
  ASSERT_TRUE(from_metadata.ok()) << from_metadata.status();
  EXPECT_EQ(from_metadata->heads(), 2);
  auto from_json = infer(false, R"({"model_type": "gpt2", "n_head": 4})");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(from_json->heads(), 4);
  auto both = infer(true, R"({"n_head": 2})");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->heads(), 2);

  refused(infer(true, R"({"n_head": 4})"), "records 2 heads but");
  refused(infer(false, R"({"n_head": 4,)"), "is not a JSON object: ");
  refused(infer(false, "[4]"), "is not a JSON object: the top level is not an object");
  refused(infer(false, R"({"n_head": "4"})"), "n_head must be a whole number >= 1 (the attention heads), not \"4\"");
  refused(infer(false, R"({"n_head": 0})"), "n_head must be a whole number >= 1 (the attention heads), not 0");
  refused(infer(false, R"({"n_head": 2.5})"), "not 2.5");
  refused(infer(false, R"({"n_head": 1e300})"), "n_head must be a whole number >= 1");
  refused(infer(false, R"({"n_head": null})"), "not null");
  // Nothing recorded: the caller must say.
  auto none = infer(false, R"({"model_type": "gpt2"})");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument) << none.status();
  EXPECT_NE(none.status().message().find("records no head count"), std::string::npos) << none.status();
  EXPECT_NE(none.status().message().find("give the head count (--heads)"), std::string::npos) << none.status();
  auto given = infer(false, nullptr, 4);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->heads(), 4);
  EXPECT_NE(infer(true, nullptr, 4).status().message().find("contradicts the 2 heads recorded"), std::string::npos);
}

std::string ReadAll(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  std::string bytes;
  if (f == nullptr) return bytes;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
  std::fclose(f);
  return bytes;
}

// Memory-centric tiling changes how a projection is stored, not the model:
// a tiled model initializes to, exports and imports the untiled model's
// values, byte for byte in the file.
TEST(Safetensors, ATiledModelReadsAndWritesTheUntiledFile) {
  GptConfig tiled_config = Tiny();
  tiled_config.set_tiling(4);
  Bound plain(Tiny(), 3), tiled(tiled_config, 3);
  EXPECT_GT(tiled.model->Parameters().size(), plain.model->Parameters().size());
  const std::string plain_path = TempPath("plain.safetensors"), tiled_path = TempPath("tiled.safetensors");
  ASSERT_TRUE(ExportGpt(*plain.model, *plain.device, plain_path).ok());
  ASSERT_TRUE(ExportGpt(*tiled.model, *tiled.device, tiled_path).ok());
  EXPECT_EQ(ReadAll(tiled_path), ReadAll(plain_path)) << "the same initial values, written whole";
  // Another seed's values, imported into the tiled model, come back out whole.
  Bound other(Tiny(), 8);
  const std::string other_path = TempPath("other.safetensors"), again_path = TempPath("again.safetensors");
  ASSERT_TRUE(ExportGpt(*other.model, *other.device, other_path).ok());
  auto file = *SafetensorsFile::Read(other_path);
  ASSERT_TRUE(ImportGpt(file, *tiled.model, *tiled.device).ok());
  ASSERT_TRUE(ExportGpt(*tiled.model, *tiled.device, again_path).ok());
  EXPECT_EQ(ReadAll(again_path), ReadAll(other_path));
  // JoinTiles is what the export writes: the untiled model's parameters in order.
  const std::vector<float> flat(tiled.storage.values.as<float>(),
                                tiled.storage.values.as<float>() + tiled.storage.numel);
  auto joined = JoinTiles(*tiled.model, flat);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(joined->size(), plain.model->Parameters().size());
  for (size_t i = 0; i < joined->size(); ++i) {
    EXPECT_EQ((*joined)[i].name, plain.model->Parameters()[i]->name);
    EXPECT_EQ((*joined)[i].shape, plain.model->Parameters()[i]->shape);
  }
  EXPECT_EQ(JoinTiles(*tiled.model, std::vector<float>(5)).status().code(), absl::StatusCode::kInvalidArgument);
}

// The file as GPT2LMHeadModel.save_pretrained writes it: "transformer."
// prefix, attention mask buffers, bf16.
TEST(Safetensors, ImportsHuggingFaceSpellingsAndHalfPrecision) {
  Bound a(Tiny(), 3), b(Tiny(), 4);
  std::vector<std::vector<uint16_t>> halves;
  std::vector<SafetensorsTensor> tensors;
  std::vector<float> rounded;
  for (Parameter* p : a.model->Parameters()) {
    halves.emplace_back(p->numel());
    ASSERT_TRUE(Convert(p->value.data(), DType::kF32, halves.back().data(), DType::kBF16, p->numel()).ok());
    tensors.push_back({"transformer." + p->name, DType::kBF16, p->shape, halves.back().data()});
  }
  std::vector<float> mask(100, 1.0f);
  tensors.push_back({"transformer.h.0.attn.bias", DType::kF32, {1, 1, 10, 10}, mask.data()});
  const std::string path = TempPath("hf.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  auto file = *SafetensorsFile::Read(path);
  ASSERT_TRUE(ImportGpt(file, *b.model, *b.device).ok());
  // b now holds a's values rounded to bf16, exactly.
  auto pa = a.model->Parameters(), pb = b.model->Parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<float> want(pa[i]->numel());
    ASSERT_TRUE(Convert(halves[i].data(), DType::kBF16, want.data(), DType::kF32, want.size()).ok());
    EXPECT_EQ(std::vector<float>(pb[i]->value.data_as<float>(), pb[i]->value.data_as<float>() + want.size()),
              want) << pa[i]->name;
  }
}

// Raw file bytes: 8-byte length, header, data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

std::string ParseError(const std::string& bytes) {
  auto f = SafetensorsFile::Parse(bytes, "bad.safetensors");
  EXPECT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(f.status().message());
}

std::string Exported() {
  Bound a(Tiny(), 5);
  const std::string path = TempPath("exported.safetensors");
  EXPECT_TRUE(ExportGpt(*a.model, *a.device, path).ok());
  return ReadAll(path);
}

TEST(Safetensors, StreamingWriterWritesWhatSerializeDoes) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  const std::vector<uint16_t> b = {0x3c00, 0xc000};
  const std::vector<SafetensorsTensor> tensors = {{"a", DType::kF32, {2, 3}, a.data()},
                                                  {"b", DType::kF16, {2}, b.data()}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  const std::string path = TempPath("streamed.safetensors");
  {
    auto w = SafetensorsWriter::Create(path, tensors, metadata);
    ASSERT_TRUE(w.ok()) << w.status();
    // Wrong sizes and early finishes are refused, naming the tensor.
    const absl::Status short_a = (*w)->Append(a.data(), 8);
    EXPECT_EQ(short_a.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(short_a.message().find("tensor a has 24"), std::string::npos) << short_a;
    ASSERT_TRUE((*w)->Append(a.data(), 24).ok());
    EXPECT_EQ((*w)->Finish().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE((*w)->Append(b.data(), 4).ok());
    EXPECT_EQ((*w)->Append(b.data(), 4).code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE((*w)->Finish().ok());
  }
  EXPECT_EQ(ReadAll(path), *SerializeSafetensors(tensors, metadata));
  // An unfinished writer leaves neither the file nor its temporary.
  const std::string dropped = TempPath("dropped.safetensors");
  {
    auto w = SafetensorsWriter::Create(dropped, tensors, metadata);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(a.data(), 24).ok());
  }
  EXPECT_EQ(std::fopen(dropped.c_str(), "rb"), nullptr);
  EXPECT_EQ(std::fopen((dropped + ".tmp").c_str(), "rb"), nullptr);
  EXPECT_EQ(SafetensorsWriter::Create(TempPath("no/such/dir.safetensors"), tensors, metadata).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(SafetensorsRefuses, TruncatedFiles) {
  const std::string good = Exported();
  EXPECT_NE(ParseError(good.substr(0, 5)).find("even the 8-byte header length is missing"), std::string::npos);
  EXPECT_NE(ParseError(good.substr(0, 100)).find("runs past the end"), std::string::npos);
  // Header intact, data cut short: the last tensors' offsets are out of range.
  const std::string msg = ParseError(good.substr(0, good.size() - 4));
  EXPECT_NE(msg.find("tensor 'ln_f.bias': data_offsets"), std::string::npos) << msg;
  EXPECT_NE(msg.find("are outside the"), std::string::npos) << msg;
  EXPECT_EQ(SafetensorsFile::Read(TempPath("no_such.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsRefuses, BadHeaders) {
  EXPECT_NE(ParseError(RawFile("{\"a\": ", 0)).find("header JSON"), std::string::npos);
  EXPECT_NE(ParseError(RawFile("[1, 2]", 0)).find("not a JSON object"), std::string::npos);
  std::string huge(8, '\xff');
  EXPECT_NE(ParseError(huge + "{}").find("exceeds the"), std::string::npos);
  EXPECT_NE(ParseError(RawFile(R"({"w": {"dtype": "F32", "shape": [2]}})", 8)).find("tensor 'w': needs dtype, shape and data_offsets"),
            std::string::npos);
}

TEST(Safetensors, ReadsJsonEscapesAndWritesThemBack) {
  // \u escapes (a surrogate pair too) decode to UTF-8; \" \\ \/ \b \f \n \r \t as JSON says.
  const std::string json =
      R"({"caf\u00e9 \ud83d\ude00": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
      R"( "q\"b\\s\/\b\f\n\r\t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  auto f = SafetensorsFile::Parse(RawFile(json, 8), "escapes.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->entries().size(), 2u);
  EXPECT_EQ(f->entries()[0].name, "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(f->entries()[1].name, "q\"b\\s/\b\f\n\r\t");
  // Written back with escapes, read back to the same names.
  std::vector<SafetensorsTensor> tensors;
  for (const auto& e : f->entries()) tensors.push_back({e.name, e.dtype, e.shape, f->data(e)});
  auto bytes = SerializeSafetensors(tensors, {{"k\"ey", "va\\lue"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto again = SafetensorsFile::Parse(*bytes, "again.safetensors");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->entries()[1].name, f->entries()[1].name);
  EXPECT_EQ(again->metadata().at("k\"ey"), "va\\lue");
}

TEST(SafetensorsRefuses, BadEscapesAndNames) {
  auto one = [](const std::string& name) {
    return RawFile("{\"" + name + R"(": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4);
  };
  EXPECT_NE(ParseError(one(R"(\ud83d)")).find("unpaired high surrogate"), std::string::npos);
  EXPECT_NE(ParseError(one(R"(\ude00)")).find("unpaired low surrogate"), std::string::npos);
  EXPECT_NE(ParseError(one(R"(\u12)")).find("\\u escape"), std::string::npos);
  EXPECT_NE(ParseError(one(R"(\x)")).find("invalid escape '\\x'"), std::string::npos);
  EXPECT_NE(ParseError(one("")).find("a tensor has an empty name"), std::string::npos);
  EXPECT_NE(ParseError(one("\xff")).find("is not valid UTF-8"), std::string::npos);
  // The writers refuse what no reader could take back.
  const float x = 1;
  auto refused = [&](const std::vector<SafetensorsTensor>& t) {
    return std::string(SerializeSafetensors(t, {}).status().message());
  };
  EXPECT_NE(refused({{"__metadata__", DType::kF32, {1}, &x}}).find("reserved"), std::string::npos);
  EXPECT_NE(refused({{"a", DType::kF32, {1}, &x}, {"a", DType::kF32, {1}, &x}}).find("two tensors are named 'a'"),
            std::string::npos);
  EXPECT_NE(refused({{"a\xc3", DType::kF32, {1}, &x}}).find("not valid UTF-8"), std::string::npos);
  EXPECT_NE(refused({{"a", DType::kF32, {-1}, &x}}).find("negative dimension"), std::string::npos);
}

TEST(SafetensorsRefuses, UnknownDtypes) {
  const std::string msg = ParseError(RawFile(R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", 2));
  EXPECT_NE(msg.find("tensor 'w': dtype 'F8_E4M3' is not one memwall reads"), std::string::npos) << msg;
}

TEST(SafetensorsRefuses, OutOfRangeWrongSizeAndOverlappingOffsets) {
  std::string msg = ParseError(RawFile(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", 8));
  EXPECT_NE(msg.find("tensor 'w': data_offsets [0, 16] are outside the 8 data bytes"), std::string::npos) << msg;
  msg = ParseError(RawFile(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8));
  EXPECT_NE(msg.find("span 8 bytes but shape and F32 need 12"), std::string::npos) << msg;
  msg = ParseError(RawFile(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8));
  EXPECT_NE(msg.find("data_offsets [8, 0]"), std::string::npos) << msg;
  msg = ParseError(RawFile(
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12));
  EXPECT_NE(msg.find("tensors 'a' and 'b' overlap"), std::string::npos) << msg;
  msg = ParseError(RawFile(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8));
  EXPECT_NE(msg.find("bad dimension '-2'"), std::string::npos) << msg;
}

// Files that parse but do not fit the model: each names the tensor, and the
// model is untouched.
class ImportRefuses : public ::testing::Test {
 protected:
  std::string Import(std::vector<SafetensorsTensor> tensors) {
    const std::string path = TempPath("import.safetensors");
    EXPECT_TRUE(WriteSafetensors(path, tensors, {}).ok());
    auto file = *SafetensorsFile::Read(path);
    const std::vector<float> before = target_.Logits();
    const absl::Status st = ImportGpt(file, *target_.model, *target_.device);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(target_.Logits(), before) << "a refused import must not change the model";
    return std::string(st.message());
  }
  std::vector<SafetensorsTensor> Good() {
    std::vector<SafetensorsTensor> t;
    for (Parameter* p : source_.model->Parameters()) t.push_back({p->name, DType::kF32, p->shape, p->value.data()});
    return t;
  }
  Bound source_{Tiny(), 6};
  Bound target_{Tiny(), 7};
  std::vector<int32_t> ints_ = std::vector<int32_t>(300 * 16);
};

TEST_F(ImportRefuses, WrongAndMissingNames) {
  auto t = Good();
  t[3].name = "h.0.ln_1.gamma";
  std::string msg = Import(t);
  EXPECT_NE(msg.find("tensor 'h.0.ln_1.gamma' is not a parameter"), std::string::npos) << msg;
  t = Good();
  t.pop_back();
  msg = Import(t);
  EXPECT_NE(msg.find("tensor 'ln_f.bias' is missing"), std::string::npos) << msg;
  t = Good();
  t.push_back(t[1]);
  t.back().name = "transformer." + t[1].name;
  msg = Import(t);
  EXPECT_NE(msg.find("tensors 'transformer.wpe.weight' and 'wpe.weight' are both present"), std::string::npos) << msg;
}

TEST_F(ImportRefuses, WrongShapes) {
  auto t = Good();
  t[4].shape = {48, 16};  // c_attn transposed (nn.Linear layout, not Conv1D)
  const std::string msg = Import(t);
  EXPECT_NE(msg.find("tensor 'h.0.attn.c_attn.weight' has shape [48, 16]; the model needs [16, 48]"),
            std::string::npos) << msg;
}

TEST_F(ImportRefuses, IntegerDtypes) {
  auto t = Good();
  t[0] = {"wte.weight", DType::kI32, {300, 16}, ints_.data()};
  const std::string msg = Import(t);
  EXPECT_NE(msg.find("tensor 'wte.weight' is int32; weights must be F32, F16 or BF16"), std::string::npos) << msg;
}

// The LM head is wte, one tensor. A file that repeats it as lm_head.weight
// (transformers' tied GPT2LMHeadModel) loads when the copy is wte's values,
// also in another dtype that holds the same values; a head trained apart
// from the embedding is refused rather than silently dropped.
TEST_F(ImportRefuses, AnLmHeadThatIsNotWte) {
  auto t = Good();
  const Parameter& wte = *source_.model->Parameters()[0];
  ASSERT_EQ(wte.name, "wte.weight");
  std::vector<uint16_t> wte16(wte.numel());
  std::vector<float> rounded(wte.numel());
  ASSERT_TRUE(Convert(wte.value.data(), DType::kF32, wte16.data(), DType::kBF16, wte16.size()).ok());
  ASSERT_TRUE(Convert(wte16.data(), DType::kBF16, rounded.data(), DType::kF32, rounded.size()).ok());
  // wte in fp32 holding bf16 values, its head copy in bf16: the same values.
  t[0] = {"transformer.wte.weight", DType::kF32, wte.shape, rounded.data()};
  t.push_back({"lm_head.weight", DType::kBF16, wte.shape, wte16.data()});
  {
    const std::string path = TempPath("tied.safetensors");
    ASSERT_TRUE(WriteSafetensors(path, t, {}).ok());
    auto file = *SafetensorsFile::Read(path);
    ASSERT_TRUE(ImportGpt(file, *target_.model, *target_.device).ok());
    // One tensor: the head's logits are the embedding's rows.
    const Parameter& loaded = *target_.model->Parameters()[0];
    EXPECT_EQ(std::memcmp(loaded.value.data(), rounded.data(), rounded.size() * sizeof(float)), 0);
  }
  std::vector<uint16_t> untied = wte16;
  untied[17] ^= 1;  // one bit of one element
  t.back().data = untied.data();
  std::string msg = Import(t);
  EXPECT_NE(msg.find("tensor 'lm_head.weight' differs from 'transformer.wte.weight' at element 17"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("ties its LM head"), std::string::npos) << msg;
  t.back().shape = {16, 300};
  msg = Import(t);
  EXPECT_NE(msg.find("tensor 'lm_head.weight' (bf16 [16, 300]) is not a copy of 'transformer.wte.weight'"),
            std::string::npos) << msg;
}

// ---- Data ---------------------------------------------------------------------

TEST(Data, RanksAndMicroBatchesPartitionTheSameGlobalBatch) {
  auto text = SyntheticSource(10007, 256, 9);
  const int64_t seq = 16;
  // The same step under layouts with the same global batch of 8 sequences.
  auto gather = [&](BatchLayout l, int64_t step) {
    std::multiset<std::vector<int32_t>> seqs;
    std::vector<int32_t> ids(l.micro_batch * seq), targets(l.micro_batch * seq);
    for (int r = 0; r < l.world; ++r) {
      for (int64_t m = 0; m < l.accumulation; ++m) {
        EXPECT_TRUE(FillMicroBatch(*text, l, step, r, m, ids.data(), targets.data()).ok());
        for (int64_t i = 0; i < l.micro_batch; ++i) {
          std::vector<int32_t> s(ids.begin() + i * seq, ids.begin() + (i + 1) * seq);
          s.push_back(targets[(i + 1) * seq - 1]);
          // targets are ids shifted by one
          for (int64_t j = 0; j + 1 < seq; ++j) EXPECT_EQ(targets[i * seq + j], ids[i * seq + j + 1]);
          seqs.insert(s);
        }
      }
    }
    return seqs;
  };
  const auto one = gather({seq, 8, 1, 1}, 3);
  EXPECT_EQ(one.size(), 8u);
  EXPECT_EQ(gather({seq, 2, 2, 2}, 3), one);
  EXPECT_EQ(gather({seq, 1, 2, 4}, 3), one);
  EXPECT_EQ(gather({seq, 4, 2, 1}, 3), one);
  EXPECT_NE(gather({seq, 8, 1, 1}, 4), one) << "the next step reads new windows";
}

// A step number as large as a checkpoint may hold (2^53) or larger reads
// windows inside the data: the sequence number is taken mod the windows
// without overflow. With 1024 windows, step 2^62 reads what step 0 reads.
TEST(Data, AnyStepReadsInsideTheData) {
  const int64_t seq = 16;
  auto text = SyntheticSource(seq + 1024, 256, 4);
  const BatchLayout l{seq, 4, 2, 2};
  auto windows = [&](int64_t step) {
    std::vector<int32_t> all, ids(l.micro_batch * seq), targets(l.micro_batch * seq);
    for (int r = 0; r < l.world; ++r) {
      for (int64_t m = 0; m < l.accumulation; ++m) {
        EXPECT_TRUE(FillMicroBatch(*text, l, step, r, m, ids.data(), targets.data()).ok()) << step;
        all.insert(all.end(), ids.begin(), ids.end());
      }
    }
    return all;
  };
  EXPECT_EQ(windows(int64_t{1} << 62), windows(0));
  EXPECT_EQ(windows((int64_t{1} << 62) + 1), windows(1));
  EXPECT_EQ(windows(INT64_MAX), windows(INT64_MAX % 64));  // 16 sequences a step: 64 steps cover 1024 windows
}

TEST(Data, RefusesBadLayoutsAndShortTexts) {
  auto text = ByteStringSource("hello", "hello.txt");
  std::vector<int32_t> a(64), b(64);
  absl::Status st = FillMicroBatch(*text, {8, 1, 1, 1}, 0, 0, 0, a.data(), b.data());
  EXPECT_NE(st.message().find("hello.txt has 5 tokens; a sequence of 8 needs at least 9"), std::string::npos) << st;
  st = FillMicroBatch(*text, {4, 1, 1, 2}, 0, 2, 0, a.data(), b.data());
  EXPECT_NE(st.message().find("rank 2 of 2"), std::string::npos) << st;
  EXPECT_EQ(ByteTextSource("/nonexistent/text.txt").status().code(), absl::StatusCode::kNotFound);
}

// A token file holds little-endian uint16 ids with no header; read back,
// its ids are what was written, its vocabulary the largest + 1, and the
// bytes of a text written as uint16 ids are the text's own tokens.
TEST(Data, TokenFilesReadLittleEndianUint16) {
  const std::vector<uint16_t> ids = {50256, 0, 1, 258, 65535, 7};
  std::string bytes;
  for (uint16_t id : ids) bytes += {char(id & 0xff), char(id >> 8)};
  const std::string path = TempPath("tokens.bin");
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  auto source = OpenTokenSource(path, DataFormat::kAuto);  // ".bin": a token file
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ((*source)->size(), int64_t(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ((*source)->token(int64_t(i)), ids[i]) << i;
  EXPECT_EQ((*source)->vocab(), 65536);
  auto as_text = OpenTokenSource(path, DataFormat::kText);
  ASSERT_TRUE(as_text.ok());
  EXPECT_EQ((*as_text)->size(), int64_t(bytes.size()));
  EXPECT_EQ((*as_text)->vocab(), 256);

  // The text "hello world" as ids equals the text as bytes, window for window.
  const std::string hello = "hello world";
  std::string wide;
  for (char c : hello) wide += {c, '\0'};
  const std::string hello_path = TempPath("hello.tokens");
  {
    FILE* f = std::fopen(hello_path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(wide.data(), 1, wide.size(), f);
    std::fclose(f);
  }
  auto tokens = OpenTokenSource(hello_path, DataFormat::kUint16);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  auto text = ByteStringSource(hello, "hello");
  const BatchLayout l{4, 2, 1, 1};
  std::vector<int32_t> a(8), at(8), b(8), bt(8);
  for (int64_t step = 0; step < 5; ++step) {
    ASSERT_TRUE(FillMicroBatch(**tokens, l, step, 0, 0, a.data(), at.data()).ok());
    ASSERT_TRUE(FillMicroBatch(*text, l, step, 0, 0, b.data(), bt.data()).ok());
    EXPECT_EQ(a, b);
    EXPECT_EQ(at, bt);
  }

  // An odd size, an unknown format: refused, named.
  {
    FILE* f = std::fopen(path.c_str(), "ab");
    ASSERT_NE(f, nullptr);
    std::fputc(1, f);
    std::fclose(f);
  }
  const absl::Status odd = OpenTokenSource(path, DataFormat::kAuto).status();
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.message().find("is 13 bytes, not a whole number of uint16 token ids"), std::string::npos) << odd;
  const absl::Status format = ParseDataFormat("u16").status();
  EXPECT_NE(format.message().find("data format 'u16' is not one of auto, text, uint16"), std::string::npos) << format;
}

}  // namespace
}  // namespace memwall::models
