// DeepSpeed JSON configs: each key becomes the memwall field that does the
// same thing (in memwall's units), DeepSpeed's defaults are stated where
// they differ, and every key memwall cannot honour is refused by name.
#include "engine/deepspeed_config.h"

#include <initializer_list>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "zero/config.h"

namespace memwall::engine {
namespace {

absl::StatusOr<DeepSpeedTranslation> Translate(const std::string& json) {
  return TranslateDeepSpeedConfig(json, "ds_config.json");
}

void ExpectRefused(const std::string& json, const std::string& key, const std::string& says) {
  auto t = Translate(json);
  ASSERT_FALSE(t.ok()) << json;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(t.status().message());
  EXPECT_TRUE(absl::StrContains(message, "ds_config.json")) << message;
  EXPECT_TRUE(absl::StrContains(message, key + ": ")) << message;
  EXPECT_TRUE(absl::StrContains(message, says)) << message;
}

TEST(DeepSpeedConfig, TranslatesTheZeroOffloadTutorialConfig) {
  // The shape of DeepSpeed's ZeRO-Offload tutorial config: stage 2, the
  // optimizer on the CPU, bf16, buckets in elements.
  auto t = Translate(R"({
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "steps_per_print": 10,
    "bf16": {"enabled": true},
    "zero_optimization": {
      "stage": 2,
      "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "allgather_partitions": true,
      "allgather_bucket_size": 2e8,
      "overlap_comm": true,
      "reduce_scatter": true,
      "reduce_bucket_size": 5e8,
      "contiguous_gradients": true
    },
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": 0, "warmup_max_lr": 6e-4, "warmup_num_steps": 100,
                             "total_num_steps": 1000, "warmup_type": "linear"}}
  })");
  ASSERT_TRUE(t.ok()) << t.status();
  const zero::TrainingConfig& c = t->training;
  EXPECT_EQ(c.precision(), zero::BF16);
  EXPECT_EQ(c.micro_batch(), 4);
  EXPECT_EQ(c.accumulation(), 4);
  EXPECT_FLOAT_EQ(c.clip_norm(), 1.0f);
  EXPECT_EQ(c.zero().stage(), 2);
  EXPECT_EQ(c.zero().offload_optimizer().device(), zero::OffloadOptimizerConfig::CPU);
  EXPECT_TRUE(c.zero().offload_optimizer().pin_memory());
  // Elements x 2 bytes in bf16.
  EXPECT_EQ(c.zero().allgather_bucket_bytes(), int64_t{400000000});
  EXPECT_EQ(c.zero().reduce_bucket_bytes(), int64_t{1000000000});
  EXPECT_TRUE(c.zero().overlap_comm());
  EXPECT_TRUE(c.adam().adamw());
  EXPECT_FLOAT_EQ(c.adam().beta2(), 0.95f);
  EXPECT_FLOAT_EQ(c.adam().weight_decay(), 0.1f);
  // The scheduler's peak is the lr DeepSpeed trains with.
  EXPECT_FLOAT_EQ(c.adam().lr(), 6e-4f);
  EXPECT_EQ(c.schedule().warmup_steps(), 100);
  EXPECT_EQ(c.schedule().decay_steps(), 1000);
  EXPECT_EQ(c.schedule().decay(), zero::LrSchedule::LINEAR);
  EXPECT_FLOAT_EQ(c.schedule().min_lr_ratio(), 0.0f);
  EXPECT_EQ(t->train_batch_size, 32);
  EXPECT_EQ(t->steps_per_print, 10);
  const std::string lines = absl::StrJoin(t->lines, "\n");
  EXPECT_TRUE(absl::StrContains(lines, "zero_optimization.reduce_bucket_size = 500000000 -> zero.reduce_bucket_bytes: "
                                       "1000000000 (500000000 elements x 2 bytes)"))
      << lines;
  EXPECT_EQ(c.schedule().convention(), zero::LrSchedule::DEEPSPEED);
  EXPECT_TRUE(zero::ValidateTrainingConfig(c).ok());
  // 4 x 4 x 2 ranks = 32; on 4 ranks it is 64.
  EXPECT_TRUE(CheckTrainBatchSize(*t, 2).ok());
  const absl::Status four = CheckTrainBatchSize(*t, 4);
  EXPECT_TRUE(absl::StrContains(four.message(), "train_batch_size 32 != train_micro_batch_size_per_gpu 4 x "
                                                "gradient_accumulation_steps 4 x 4 ranks = 64"))
      << four;
  // The largest micro-batch and accumulation on 2^20 ranks: a product past
  // int64, refused as such.
  auto large = Translate(R"({"train_batch_size": 1024, "train_micro_batch_size_per_gpu": 16777215,
                             "gradient_accumulation_steps": 2147483647})");
  ASSERT_TRUE(large.ok()) << large.status();
  const absl::Status past = CheckTrainBatchSize(*large, 1 << 20);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(past.message(), "x 1048576 ranks = more than 2^63")) << past;
}

TEST(DeepSpeedConfig, BucketBytesFollowThePrecision) {
  auto fp32 = Translate(R"({"zero_optimization": {"stage": 1, "reduce_bucket_size": 1000}})");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(fp32->training.precision(), zero::FP32);
  EXPECT_EQ(fp32->training.zero().reduce_bucket_bytes(), 4000);
  auto fp16 = Translate(R"({"fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 500,
                                     "min_loss_scale": 2, "loss_scale": 0},
                            "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000,
                                                  "stage3_prefetch_bucket_size": 300,
                                                  "stage3_param_persistence_threshold": 77,
                                                  "stage3_max_live_parameters": 1e6,
                                                  "stage3_max_reuse_distance": 1e9,
                                                  "sub_group_size": 4096,
                                                  "offload_param": {"device": "cpu", "pin_memory": true},
                                                  "offload_optimizer": {"device": "cpu"}}})");
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  const zero::TrainingConfig& c = fp16->training;
  EXPECT_EQ(c.precision(), zero::FP16);
  EXPECT_EQ(c.zero().reduce_bucket_bytes(), 2000);
  EXPECT_EQ(c.zero().prefetch_bucket_bytes(), 600);
  EXPECT_EQ(c.zero().param_persistence_threshold(), 77);
  EXPECT_EQ(c.zero().max_live_params(), 1000000);
  EXPECT_EQ(c.zero().max_reuse_distance(), 1000000000);
  // A prefetch bucket of 0 turns prefetch off, in DeepSpeed and memwall.
  auto no_prefetch = Translate(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0}})");
  ASSERT_TRUE(no_prefetch.ok()) << no_prefetch.status();
  EXPECT_TRUE(no_prefetch->training.zero().has_prefetch_bucket_bytes());
  EXPECT_EQ(no_prefetch->training.zero().prefetch_bucket_bytes(), 0);
  ExpectRefused(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}})", "zero_optimization.reduce_bucket_size",
                "whole number in [1, ");
  EXPECT_EQ(c.zero().offload_optimizer().tile_elements(), 4096);
  EXPECT_EQ(c.zero().offload_param().device(), zero::OffloadParamConfig::CPU);
  EXPECT_FLOAT_EQ(c.loss_scaling().initial_scale(), 4096.0f);
  EXPECT_EQ(c.loss_scaling().growth_interval(), 500);
  EXPECT_FLOAT_EQ(c.loss_scaling().min_scale(), 2.0f);
  EXPECT_EQ(c.loss_scaling().hysteresis(), 2) << "DeepSpeed's default, where the block does not say";
  EXPECT_FALSE(c.loss_scaling().consecutive_hysteresis());
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(fp16->lines, "\n"),
                                "fp16.hysteresis (absent) -> loss_scaling.hysteresis: 2 (DeepSpeed's default"));
  auto given = Translate(R"({"fp16": {"enabled": true, "hysteresis": 4, "consecutive_hysteresis": true}})");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->training.loss_scaling().hysteresis(), 4);
  EXPECT_TRUE(given->training.loss_scaling().consecutive_hysteresis());
  auto bf16 = Translate(R"({"bf16": {"enabled": true}})");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_FALSE(bf16->training.loss_scaling().has_hysteresis()) << "no loss scaling outside fp16";
}

TEST(DeepSpeedConfig, StatesDeepSpeedsDefaultsWhereMemwallsDiffer) {
  auto t = Translate(R"({"train_micro_batch_size_per_gpu": 2})");
  ASSERT_TRUE(t.ok()) << t.status();
  // No gradient_clipping: DeepSpeed does not clip; no fp16/bf16 block: fp32;
  // no scheduler: a constant lr.
  EXPECT_FLOAT_EQ(t->training.clip_norm(), 0.0f);
  EXPECT_EQ(t->training.precision(), zero::FP32);
  EXPECT_EQ(t->training.schedule().warmup_steps(), 0);
  EXPECT_EQ(t->training.schedule().decay_steps(), 0);
  const std::string lines = absl::StrJoin(t->lines, "\n");
  EXPECT_TRUE(absl::StrContains(lines, "gradient_clipping (absent) -> clip_norm: 0")) << lines;
  EXPECT_TRUE(absl::StrContains(lines, "precision: FP32 (DeepSpeed's default")) << lines;
  // Adam without adam_w_mode is AdamW in DeepSpeed.
  auto adam = Translate(R"({"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}})");
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_TRUE(adam->training.adam().adamw());
  auto l2 = Translate(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
  ASSERT_TRUE(l2.ok()) << l2.status();
  EXPECT_FALSE(l2->training.adam().adamw());
  // train_batch_size without gradient_accumulation_steps gives the accumulation.
  auto derived = Translate(R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3})");
  ASSERT_TRUE(derived.ok());
  ASSERT_TRUE(CheckTrainBatchSize(*derived, 2).ok());
  EXPECT_EQ(derived->training.accumulation(), 4);
  EXPECT_FALSE(CheckTrainBatchSize(*derived, 5).ok());
}

TEST(DeepSpeedConfig, RefusesEachKeyItCannotHonourByName) {
  ExpectRefused(R"({"zero_optimization": {"stage": 2, "round_robin_gradients": true}})",
                "zero_optimization.round_robin_gradients", "set it to false");
  ExpectRefused(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})",
                "zero_optimization.zero_hpz_partition_size", "ZeRO++ is not implemented");
  ExpectRefused(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})",
                "zero_optimization.offload_optimizer.device", "must be \"cpu\", \"nvme\" or \"none\"");
  ExpectRefused(R"({"fp16": {"enabled": true, "loss_scale": 128}})", "fp16.loss_scale", "dynamically only");
  ExpectRefused(R"({"fp16": {"enabled": true, "hysteresis": 0}})", "fp16.hysteresis", "whole number in [1, ");
  // Not enabled, the fp16 block's settings do nothing (as in DeepSpeed),
  // whatever their values; its names are still checked.
  for (const char* json : {R"({"bf16": {"enabled": true}, "fp16": {"enabled": false, "hysteresis": 2, "loss_scale": 128,
                                                                      "initial_scale_power": 16}})",
                           R"({"fp16": {"hysteresis": 2, "consecutive_hysteresis": true}})"}) {
    auto disabled = Translate(json);
    ASSERT_TRUE(disabled.ok()) << json << ": " << disabled.status();
    EXPECT_NE(disabled->training.precision(), zero::FP16) << json;
    EXPECT_FALSE(disabled->training.has_loss_scaling()) << json;
    EXPECT_TRUE(absl::StrContains(absl::StrJoin(disabled->lines, "\n"),
                                  "fp16.hysteresis = 2 -> nothing: fp16 is not enabled"))
        << absl::StrJoin(disabled->lines, "\n");
  }
  ExpectRefused(R"({"fp16": {"enabled": false, "hysterisis": 2}})", "fp16.hysterisis", "not a DeepSpeed key");
  ExpectRefused(R"({"fp16": {"enabled": "auto", "hysteresis": 2}})", "fp16.enabled", "auto");
  ExpectRefused(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", "fp16.enabled", "enable one of them");
  ExpectRefused(R"({"optimizer": {"type": "Lamb"}})", "optimizer.type", "Adam or AdamW");
  ExpectRefused(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_type": "exp"}}})",
                "scheduler.params.warmup_type", "must be \"linear\" or \"log\", not \"exp\"");
  // Absent, the warmup is DeepSpeed's default, log; said in a line.
  auto log = Translate(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->training.schedule().warmup(), zero::LrSchedule::LOG_WARMUP);
  EXPECT_EQ(log->training.schedule().convention(), zero::LrSchedule::DEEPSPEED);
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(log->lines, "\n"),
                                "scheduler.params.warmup_type (absent) -> schedule.warmup: LOG_WARMUP (DeepSpeed's default"));
  ExpectRefused(R"({"scheduler": {"type": "OneCycle"}})", "scheduler.type", "WarmupLR, WarmupDecayLR");
  ExpectRefused(R"({"aio": {"single_submit": true}})", "aio.single_submit", "set it to false");
  ExpectRefused(R"({"aio": {"queue_depth": 0}})", "aio.queue_depth", "whole number in [1, 4096]");
  ExpectRefused(R"({"tensorboard": {"enabled": true}})", "tensorboard", "step log");
  ExpectRefused(R"({"train_micro_batch_size_per_gpu": "auto"})", "train_micro_batch_size_per_gpu",
                "\"auto\" is filled in by the Hugging Face Trainer; write the number");
  ExpectRefused(R"({"bf16": {"enabled": "auto"}})", "bf16.enabled",
                "\"auto\" is filled in by the Hugging Face Trainer; write true or false");
  ExpectRefused(R"({"optimizer": {"type": "AdamW", "params": {"betas": "auto"}}})", "optimizer.params.betas",
                "\"auto\" is filled in by the Hugging Face Trainer; write the two numbers, [beta1, beta2]");
  ExpectRefused(R"({"train_micro_batch_size_per_gpu": 2.5})", "train_micro_batch_size_per_gpu", "whole number");
  ExpectRefused(R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage", "[0, 3]");
  ExpectRefused(R"({"zero_optimisation": {"stage": 2}})", "zero_optimisation", "not a DeepSpeed key memwall knows");
  // Every refusal at once, in key order.
  auto both = Translate(R"({"zero_optimization": {"round_robin_gradients": true}, "amp": {"enabled": true}})");
  ASSERT_FALSE(both.ok());
  EXPECT_TRUE(absl::StrContains(both.status().message(), "2 keys memwall cannot honour:\n  amp: ")) << both.status();
  // A disabled monitor is harmless.
  EXPECT_TRUE(Translate(R"({"tensorboard": {"enabled": false}})").ok());
  // A key at the value that is memwall's behaviour is accepted and says
  // so; at any other value it is refused, saying which value to write.
  struct Only {
    const char* accepted;
    const char* refused;
    const char* key;
    const char* says;
  };
  for (const Only& o : std::initializer_list<Only>{
           {R"({"activation_checkpointing": {"partition_activations": false}})",
            R"({"activation_checkpointing": {"partition_activations": true}})",
            "activation_checkpointing.partition_activations", "set it to false"},
           {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1.0}}})",
            R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
            "zero_optimization.offload_optimizer.ratio", "set it to 1 or delete it"},
           {R"({"prescale_gradients": false})", R"({"prescale_gradients": true})", "prescale_gradients",
            "set it to false or delete it"},
           {R"({"gradient_predivide_factor": 1.0})", R"({"gradient_predivide_factor": 8})", "gradient_predivide_factor",
            "set it to 1 or delete it"},
           // DeepSpeed's defaults, which configs often state.
           {R"({"sparse_gradients": false})", R"({"sparse_gradients": true})", "sparse_gradients", "set it to false"},
           {R"({"disable_allgather": false})", R"({"disable_allgather": true})", "disable_allgather", "set it to false"},
           {R"({"communication_data_type": null})", R"({"communication_data_type": "fp32"})", "communication_data_type",
            "set it to null or delete the key"},
           {R"({"data_types": {"grad_accum_dtype": null}})", R"({"data_types": {"grad_accum_dtype": "fp32"}})",
            "data_types.grad_accum_dtype", "set it to null or delete it"},
           {R"({"fp16": {"enabled": true, "fp16_master_weights_and_grads": false}})",
            R"({"fp16": {"enabled": true, "fp16_master_weights_and_grads": true}})", "fp16.fp16_master_weights_and_grads",
            "memwall keeps fp32 master weights"},
           {R"({"zero_optimization": {"stage": 3, "stage3_module_granularity_threshold": 0}})",
            R"({"zero_optimization": {"stage": 3, "stage3_module_granularity_threshold": 4096}})",
            "zero_optimization.stage3_module_granularity_threshold", "set it to 0 or delete it"},
           {R"({"checkpoint": {"use_node_local_storage": false}})", R"({"checkpoint": {"use_node_local_storage": true}})",
            "checkpoint.use_node_local_storage", "set it to false"},
           {R"({"checkpoint": {"load_universal": false}})", R"({"checkpoint": {"load_universal": true}})",
            "checkpoint.load_universal", "set it to false"},
       }) {
    auto t = Translate(o.accepted);
    ASSERT_TRUE(t.ok()) << o.accepted << ": " << t.status();
    EXPECT_TRUE(absl::StrContains(absl::StrJoin(t->lines, "\n"), std::string(o.key) + " = ")) << o.accepted;
    EXPECT_TRUE(absl::StrContains(absl::StrJoin(t->lines, "\n"), "-> memwall's behaviour")) << o.accepted;
    ExpectRefused(o.refused, o.key, o.says);
  }
  ExpectRefused(R"({"checkpoint": {"tag_validation": "Sometimes"}})", "checkpoint.tag_validation",
                "must be \"Ignore\", \"Warn\" or \"Fail\"");
  // The older spelling of CPU offload; with offload_optimizer too it is refused.
  auto legacy = Translate(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ(legacy->training.zero().offload_optimizer().device(), zero::OffloadOptimizerConfig::CPU);
  auto no_offload = Translate(R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})");
  ASSERT_TRUE(no_offload.ok()) << no_offload.status();
  EXPECT_EQ(no_offload->training.zero().offload_optimizer().device(), zero::OffloadOptimizerConfig::NONE);
  ExpectRefused(R"({"zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})",
                "zero_optimization.cpu_offload", "give offload_optimizer alone");
  // offload_param below stage 3: DeepSpeed does not read it, nor does the
  // translation.
  auto stage2 = Translate(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "cpu", "pin_memory": true}}})");
  ASSERT_TRUE(stage2.ok()) << stage2.status();
  EXPECT_EQ(stage2->training.zero().offload_param().device(), zero::OffloadParamConfig::NONE);
  // Parameters on NVMe below stage 3, with an aio block: no NVMe offload is
  // left, so the block does nothing either.
  auto nvme2 = Translate(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}, "aio": {"queue_depth": 8}})");
  ASSERT_TRUE(nvme2.ok()) << nvme2.status();
  EXPECT_FALSE(nvme2->training.zero().has_aio());
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(nvme2->lines, "\n"), "aio.queue_depth = 8 -> nothing: no NVMe offload"));
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(stage2->lines, "\n"),
                                "zero_optimization.offload_param.device = \"cpu\" -> nothing: offload_param is stage 3's"))
      << absl::StrJoin(stage2->lines, "\n");
  // Checkpoints re-partition to any world size whatever elastic_checkpoint says.
  for (const char* b : {"true", "false"}) {
    auto t = Translate(absl::StrCat(R"({"zero_optimization": {"elastic_checkpoint": )", b, "}}"));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(absl::StrContains(absl::StrJoin(t->lines, "\n"), "re-partition to any world size"));
  }
  // Not JSON, or not an object.
  ExpectRefused("{\"stage\": ", "", "not a DeepSpeed JSON config");
  auto list = Translate("[1, 2]");
  ASSERT_FALSE(list.ok());
  EXPECT_TRUE(absl::StrContains(list.status().message(),
                                "ds_config.json: not a DeepSpeed JSON config (a JSON object): the top level is not an object"))
      << list.status();
  // The parser's words, without the name of its status code.
  EXPECT_FALSE(absl::StrContains(Translate("{\"a\": 1,").status().message(), "INVALID_ARGUMENT"));
  // A value memwall's own checks refuse names the DeepSpeed key it came from.
  auto lr = Translate(R"({"optimizer": {"type": "AdamW", "params": {"lr": -1}}})");
  ASSERT_FALSE(lr.ok());
  EXPECT_TRUE(absl::StrContains(lr.status().message(),
                                "ds_config.json as TrainingConfig adam.lr = -1 must be finite and >= 0 (DeepSpeed key "
                                "optimizer.params.lr)"))
      << lr.status();
  auto clip = Translate(R"({"gradient_clipping": -1})");
  EXPECT_TRUE(absl::StrContains(clip.status().message(), "(DeepSpeed key gradient_clipping)")) << clip.status();
  // A value memwall's own checks refuse comes back under the file's name.
  auto nvme = Translate(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})");
  ASSERT_FALSE(nvme.ok());
  EXPECT_TRUE(absl::StrContains(nvme.status().message(), "ds_config.json as TrainingConfig zero.offload_optimizer.nvme_path"))
      << nvme.status();
}

// DeepSpeed's ZeRO-Infinity tutorial config keeps an aio block: it sets the
// NVMe engine's blocks, queue and threads; without NVMe offload it does
// nothing, as in DeepSpeed, and says so.
TEST(DeepSpeedConfig, TheAioBlockSetsTheNvmeEngine) {
  const std::string aio = R"("aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 2,
                                      "single_submit": false, "overlap_events": true})";
  auto nvme = Translate(absl::StrCat(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
      "nvme_path": "/local_nvme"}, "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}, )", aio, "}"));
  ASSERT_TRUE(nvme.ok()) << nvme.status();
  const zero::AioConfig& a = nvme->training.zero().aio();
  EXPECT_EQ(a.block_bytes(), 262144);
  EXPECT_EQ(a.queue_depth(), 16);
  EXPECT_EQ(a.threads(), 2);
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(nvme->lines, "\n"), "aio.thread_count = 2 -> zero.aio.threads"));
  auto cpu = Translate(absl::StrCat(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, )",
                                    aio, "}"));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE(cpu->training.zero().has_aio());
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(cpu->lines, "\n"), "aio.block_size = 262144 -> nothing: no NVMe offload"))
      << absl::StrJoin(cpu->lines, "\n");
  // A block DeepSpeed takes but O_DIRECT cannot: named by both keys.
  auto odd = Translate(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/local_nvme"}}, "aio": {"block_size": 1000}})");
  ASSERT_FALSE(odd.ok());
  EXPECT_TRUE(absl::StrContains(odd.status().message(), "zero.aio.block_bytes = 1000 must be a multiple of 4096"))
      << odd.status();
  EXPECT_TRUE(absl::StrContains(odd.status().message(), "aio.block_size")) << odd.status();
}

// The offload blocks' buffer keys, as PyTorch Lightning's DeepSpeedStrategy
// writes them into every config (whatever the device) and as DeepSpeed's
// ZeRO-Infinity tutorial sets them for NVMe.
TEST(DeepSpeedConfig, OffloadBufferKeysTranslateForNvmeAndDoNothingOtherwise) {
  // Lightning's ZeRO-Offload (stage 2, optimizer on the CPU) and its
  // parameter offload (stage 3, parameters on the CPU): the NVMe keys do
  // nothing, as in DeepSpeed, and pin_memory false still pins.
  auto lightning = Translate(R"({"zero_allow_untested_optimizer": true,
    "zero_optimization": {"stage": 3, "contiguous_gradients": true, "overlap_comm": true,
      "allgather_partitions": true, "reduce_scatter": true, "allgather_bucket_size": 200000000,
      "reduce_bucket_size": 200000000, "sub_group_size": 1000000000000,
      "offload_optimizer": {"device": "cpu", "nvme_path": "/local_nvme", "buffer_count": 4, "pin_memory": false},
      "offload_param": {"device": "cpu", "nvme_path": "/local_nvme", "buffer_count": 5, "buffer_size": 100000000,
                        "max_in_cpu": 1000000000, "pin_memory": false}},
    "aio": {"block_size": 1048576, "queue_depth": 8, "single_submit": false, "overlap_events": true,
            "thread_count": 1}})");
  ASSERT_TRUE(lightning.ok()) << lightning.status();
  const zero::ZeroConfig& z = lightning->training.zero();
  EXPECT_EQ(z.offload_optimizer().device(), zero::OffloadOptimizerConfig::CPU);
  EXPECT_EQ(z.offload_param().device(), zero::OffloadParamConfig::CPU);
  EXPECT_TRUE(z.offload_optimizer().pin_memory());
  EXPECT_TRUE(z.offload_optimizer().nvme_path().empty());
  EXPECT_FALSE(z.offload_optimizer().has_pinned_budget_bytes());
  EXPECT_FALSE(!z.offload_param().nvme_path().empty() || z.offload_param().has_buffer_count() ||
               z.offload_param().has_buffer_elements() || z.offload_param().has_host_elements());
  std::string lines = absl::StrJoin(lightning->lines, "\n");
  for (const char* said : {"offload_optimizer.buffer_count = 4 -> nothing: offload_optimizer.device is not nvme",
                           "offload_optimizer.nvme_path = \"/local_nvme\" -> nothing: offload_optimizer.device is not nvme",
                           "offload_param.buffer_size = 100000000 -> nothing: offload_param.device is not nvme",
                           "offload_param.max_in_cpu = 1000000000 -> nothing: offload_param.device is not nvme",
                           "offload_param.buffer_count = 5 -> nothing: offload_param.device is not nvme",
                           "offload_optimizer.pin_memory = false -> pinned all the same",
                           "offload_param.pin_memory = false -> pinned all the same"}) {
    EXPECT_TRUE(absl::StrContains(lines, said)) << said << "\n" << lines;
  }

  // ZeRO-Infinity's tutorial: everything on NVMe. DeepSpeed's 4 optimizer
  // buffers of one fp32 state pin less than memwall's 3 buffers of three
  // states: memwall's least (pinned_budget_bytes 0), said.
  auto infinity = Translate(R"({"bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "sub_group_size": 1e9,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true, "buffer_count": 4,
                            "fast_init": false},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true, "buffer_count": 5,
                        "buffer_size": 1e8, "max_in_cpu": 1e9}}})");
  ASSERT_TRUE(infinity.ok()) << infinity.status();
  const zero::OffloadParamConfig& p = infinity->training.zero().offload_param();
  EXPECT_EQ(p.buffer_count(), 5);
  EXPECT_EQ(p.buffer_elements(), 100000000);
  EXPECT_EQ(p.host_elements(), 1000000000);
  EXPECT_EQ(p.nvme_path(), "/local_nvme");
  EXPECT_EQ(infinity->training.zero().offload_optimizer().pinned_budget_bytes(), 0);
  lines = absl::StrJoin(infinity->lines, "\n");
  EXPECT_TRUE(absl::StrContains(lines, "offload_param.max_in_cpu = 1000000000 -> zero.offload_param.host_elements"))
      << lines;
  EXPECT_TRUE(absl::StrContains(lines, "offload_optimizer.buffer_count = 4 -> zero.offload_optimizer.pinned_budget_bytes: 0"))
      << lines;
  EXPECT_TRUE(absl::StrContains(lines, "memwall's least is 3")) << lines;

  // More buffers than memwall's least: the same pinned bytes, 12 buffers
  // of 4 bytes a sub-group element making 4 of memwall's 12.
  auto twelve = Translate(R"({"zero_optimization": {"stage": 2, "sub_group_size": 1048576,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 12}}})");
  ASSERT_TRUE(twelve.ok()) << twelve.status();
  EXPECT_EQ(twelve->training.zero().offload_optimizer().pinned_budget_bytes(), int64_t{12} * 4 * 1048576);

  // Parameters on NVMe without max_in_cpu: DeepSpeed's default, said; 0
  // puts the whole shard on the drive.
  auto absent = Translate(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}})");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_EQ(absent->training.zero().offload_param().host_elements(), 1000000000);
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(absent->lines, "\n"),
                                "offload_param.max_in_cpu (absent) -> zero.offload_param.host_elements: 1000000000 "
                                "(DeepSpeed's default"))
      << absl::StrJoin(absent->lines, "\n");
  auto none = Translate(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "max_in_cpu": 0}}})");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->training.zero().offload_param().host_elements(), 0);

  ExpectRefused(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "buffer_size": 0}}})",
                "zero_optimization.offload_param.buffer_size", "whole number in [1, ");
  ExpectRefused(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "max_in_cpu": -1}}})",
                "zero_optimization.offload_param.max_in_cpu", "whole number in [0, ");
  ExpectRefused(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "buffer_count": 0}}})",
                "zero_optimization.offload_optimizer.buffer_count", "whole number in [1, ");
  ExpectRefused(R"({"zero_optimization": {"offload_param": {"pin_memory": "yes"}}})",
                "zero_optimization.offload_param.pin_memory", "must be true or false");
}

TEST(DeepSpeedConfig, StageThreeNvmeOffloadKeepsTheGradientPartitionOnNvmeAsDeepSpeedDoes) {
  const std::string infinity = R"({"bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "sub_group_size": 1e8,
                          "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true},
                          "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}})";
  auto t = Translate(infinity);
  ASSERT_TRUE(t.ok()) << t.status();
  const zero::OffloadOptimizerConfig& o = t->training.zero().offload_optimizer();
  EXPECT_EQ(o.device(), zero::OffloadOptimizerConfig::NVME);
  EXPECT_TRUE(o.gradients_on_nvme());
  const std::string lines = absl::StrJoin(t->lines, "\n");
  EXPECT_TRUE(absl::StrContains(lines, "at stage 3 -> zero.offload_optimizer.gradients_on_nvme: true")) << lines;
  EXPECT_TRUE(zero::ValidateTrainingConfig(t->training).ok());
  // --set merges over the translation, so the pinned shard stays one line away.
  zero::TrainingConfig pinned = t->training;
  zero::TrainingConfig over;
  over.mutable_zero()->mutable_offload_optimizer()->set_gradients_on_nvme(false);
  pinned.MergeFrom(over);
  EXPECT_FALSE(pinned.zero().offload_optimizer().gradients_on_nvme());

  // Elsewhere the gradient shard stays in pinned host memory: NVMe at stage
  // 2, and the optimizer on the CPU at stage 3 (parameters on NVMe or not).
  for (const std::string json : {
           R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}})",
           R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})",
           R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                     "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}})"}) {
    auto other = Translate(json);
    ASSERT_TRUE(other.ok()) << json << ": " << other.status();
    EXPECT_FALSE(other->training.zero().offload_optimizer().gradients_on_nvme()) << json;
    EXPECT_FALSE(absl::StrContains(absl::StrJoin(other->lines, "\n"), "gradients_on_nvme")) << json;
  }
}

}  // namespace
}  // namespace memwall::engine
