// Module and Parameter: the model tree that every ZeRO stage drives without
// changing model code.
//
// A Module has a local name ("ln_1"), children and parameters; the dotted
// path from the root ("h.3.attn.c_attn.weight") is a parameter's stable name
// (Hugging Face GPT-2 spelling). A Parameter knows its name and shape; its
// storage does not belong to the model. The engine (zero/) decides where
// parameters and gradients live (one flat buffer at stage 0, gathered
// shards at stage 3, ...) and points each Parameter's `value` and `grad` at
// that memory. Before the engine binds them both are empty Tensors, so a
// model can be built and counted (a 1T-parameter config included) without
// allocating anything.
//
// Hooks run before and after each module's forward and backward, in that
// module's code path; this is where stage 3 gathers a module's parameters
// and releases them, and where stage 2 learns that gradients are ready.
//
// [Note: deferred binding]
// An engine may bind a value or gradient as a Tensor with the parameter's
// dtype and shape but no memory (data() == nullptr) and fill in the memory
// from a before-hook: stage 2 places gradients in a reduce bucket, stage 3
// gathers values. After the before-hooks of a forward (backward) scope,
// every own parameter of that module must have value (and gradient) memory,
// or the scope fails with FailedPrecondition naming the parameter. Every
// access of a parameter is inside a scope of its owner; a module's
// parameters may be used in several scopes (GPT's tied wte: the embedding
// and the LM head), and the head's gradient is written inside a backward
// scope of wte nested in its forward scope.
#ifndef MEMWALL_MODELS_MODULE_H_
#define MEMWALL_MODELS_MODULE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/tensor.h"

namespace memwall::models {

class Module;

// Where a tile of a larger, logical parameter sits in it (memory-centric
// tiling, models/layers.h TiledLinear): this parameter's last dimension is
// columns [begin, begin + shape.back()) of the logical parameter `name`,
// whose last dimension is `width` and whose other dimensions are this one's.
struct ColumnSlice {
  std::string name;  // the logical parameter's full dotted name
  int64_t width = 0;
  int64_t begin = 0;
};

struct Parameter {
  std::string name;            // full dotted name
  std::vector<int64_t> shape;  // HF GPT-2 layout (linear weights are (in, out))
  Module* owner = nullptr;
  // Set for a tile: the logical parameter it is part of. Its local part is
  // fixed at registration; Module re-derives the full name with the path.
  std::optional<ColumnSlice> slice;
  // Bound by the engine; every parameter of a model shares one dtype (fp32,
  // or fp16/bf16 for mixed precision), its gradient too.
  Tensor value;                // the values compute reads
  Tensor grad;                 // accumulated (+=) by backward

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

enum class HookPoint { kBeforeForward, kAfterForward, kBeforeBackward, kAfterBackward };
absl::string_view HookPointName(HookPoint point);

class Module {
 public:
  // A hook sees the module it runs for; an error stops the pass.
  using Hook = std::function<absl::Status(Module&, HookPoint)>;

  explicit Module(std::string local_name) : local_name_(std::move(local_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& local_name() const { return local_name_; }
  // Dotted path from the root ("" for the root itself).
  const std::string& path() const { return path_; }

  // This module's own parameters, then its children's, depth first in
  // registration order: the fixed order of flat buffers and checkpoints.
  std::vector<Parameter*> Parameters();
  // Only this module's own parameters.
  const std::vector<std::unique_ptr<Parameter>>& own_parameters() const { return params_; }
  const std::vector<Module*>& children() const { return children_; }

  // Registers `hook` on this module and every module below it; returns an
  // id for RemoveHookRecursive (an engine that dies before its model).
  int AddHookRecursive(const Hook& hook);
  void RemoveHookRecursive(int id);
  // Runs this module's hooks for `point`, in registration order.
  absl::Status RunHooks(HookPoint point);

 protected:
  // Registration, called from constructors: names are local ("weight").
  Parameter& AddParameter(absl::string_view local, std::vector<int64_t> shape);
  // A tile of this module's logical parameter `logical` (a local name, e.g.
  // "weight"): its full name follows this module's path.
  Parameter& AddTileParameter(absl::string_view local, std::vector<int64_t> shape, absl::string_view logical,
                              int64_t width, int64_t begin);
  // Takes ownership; `child` is named by its local name under this module.
  template <typename M>
  M& AddChild(std::unique_ptr<M> child) {
    M& ref = *child;
    AdoptChild(std::move(child));
    return ref;
  }

 private:
  void AdoptChild(std::unique_ptr<Module> child);
  // Re-derives paths and parameter names below this module.
  void SetPath(std::string path);

  std::string local_name_;
  std::string path_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::unique_ptr<Module>> owned_children_;
  std::vector<Module*> children_;
  std::vector<std::pair<int, Hook>> hooks_;
};

// Runs kBefore* hooks on construction and reports kAfter* through Finish();
// a pass body reads as: MEMWALL_ASSIGN_OR_RETURN(auto scope, ...); ... ;
// return scope.Finish().
class HookScope {
 public:
  static absl::StatusOr<HookScope> Forward(Module& m);
  static absl::StatusOr<HookScope> Backward(Module& m);
  absl::Status Finish() { return module_->RunHooks(after_); }

 private:
  HookScope(Module& m, HookPoint after) : module_(&m), after_(after) {}
  Module* module_;
  HookPoint after_;
};

}  // namespace memwall::models

#endif  // MEMWALL_MODELS_MODULE_H_
