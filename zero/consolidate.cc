// //zero:consolidate: one Hugging Face GPT-2 safetensors file of full fp32
// weights from a sharded checkpoint (any stage, any number of ranks).
//
//   ./bazelw run //zero:consolidate -- CKPT_DIR OUT.safetensors
//
// CKPT_DIR is a step directory (run/step_00000010) or a run directory, in
// which case its latest complete checkpoint is used. Every shard's checksum
// is verified before OUT is written; OUT appears only when whole (written to
// OUT.tmp and renamed), and at most one tensor is in memory at a time.
// Relative paths are taken from where `bazel run` was started.
// Exits 0 on success, 1 when the checkpoint is unusable, 2 on bad usage.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/launch.h"
#include "zero/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: consolidate CKPT_DIR OUT.safetensors\n"
                 "  CKPT_DIR: a checkpoint step directory, or a run directory (its latest\n"
                 "            complete checkpoint is used)\n");
    return 2;
  }
  auto env = [](const char* name) { return std::getenv(name); };
  const std::string in = memwall::UserPath(argv[1], env);
  const std::string out = memwall::UserPath(argv[2], env);
  const absl::StatusOr<std::string> read = memwall::zero::ConsolidateCheckpoint(in, out);
  if (!read.ok()) {
    std::fprintf(stderr, "consolidate: %s\n", std::string(read.status().message()).c_str());
    return 1;
  }
  std::printf("wrote %s from %s\n", out.c_str(), read->c_str());
  return 0;
}
