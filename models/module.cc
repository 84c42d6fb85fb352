#include "models/module.h"

#include <atomic>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall::models {

absl::string_view HookPointName(HookPoint point) {
  switch (point) {
    case HookPoint::kBeforeForward: return "before_forward";
    case HookPoint::kAfterForward: return "after_forward";
    case HookPoint::kBeforeBackward: return "before_backward";
    case HookPoint::kAfterBackward: return "after_backward";
  }
  return "?";
}

std::vector<Parameter*> Module::Parameters() {
  std::vector<Parameter*> out;
  for (auto& p : params_) out.push_back(p.get());
  for (Module* child : children_) {
    for (Parameter* p : child->Parameters()) out.push_back(p);
  }
  return out;
}

namespace {
std::atomic<int> next_hook_id{1};
}  // namespace

int Module::AddHookRecursive(const Hook& hook) {
  const int id = next_hook_id.fetch_add(1);
  std::vector<Module*> todo = {this};
  while (!todo.empty()) {
    Module* m = todo.back();
    todo.pop_back();
    m->hooks_.emplace_back(id, hook);
    todo.insert(todo.end(), m->children_.begin(), m->children_.end());
  }
  return id;
}

void Module::RemoveHookRecursive(int id) {
  std::erase_if(hooks_, [id](const auto& h) { return h.first == id; });
  for (Module* child : children_) child->RemoveHookRecursive(id);
}

absl::Status Module::RunHooks(HookPoint point) {
  for (const auto& [id, hook] : hooks_) MEMWALL_RETURN_IF_ERROR(hook(*this, point));
  return absl::OkStatus();
}

Parameter& Module::AddParameter(absl::string_view local, std::vector<int64_t> shape) {
  auto p = std::make_unique<Parameter>();
  p->name = path_.empty() ? std::string(local) : absl::StrCat(path_, ".", local);
  p->shape = std::move(shape);
  p->owner = this;
  params_.push_back(std::move(p));
  return *params_.back();
}

namespace {
// "a.b.c" -> "a.b"; "a" -> "".
std::string ParentPath(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}
std::string Join(const std::string& path, absl::string_view local) {
  return path.empty() ? std::string(local) : absl::StrCat(path, ".", local);
}
}  // namespace

Parameter& Module::AddTileParameter(absl::string_view local, std::vector<int64_t> shape,
                                    absl::string_view logical, int64_t width, int64_t begin) {
  Parameter& p = AddParameter(local, std::move(shape));
  p.slice = ColumnSlice{Join(ParentPath(path_), logical), width, begin};
  return p;
}

void Module::AdoptChild(std::unique_ptr<Module> child) {
  child->SetPath(path_.empty() ? child->local_name_ : absl::StrCat(path_, ".", child->local_name_));
  children_.push_back(child.get());
  owned_children_.push_back(std::move(child));
}

void Module::SetPath(std::string path) {
  path_ = std::move(path);
  for (auto& p : params_) {
    const std::string local = p->name.substr(p->name.rfind('.') + 1);
    p->name = path_.empty() ? local : absl::StrCat(path_, ".", local);
    if (p->slice.has_value()) {  // the logical parameter belongs to this module's parent
      const std::string logical = p->slice->name.substr(p->slice->name.rfind('.') + 1);
      p->slice->name = Join(ParentPath(path_), logical);
    }
  }
  for (Module* child : children_) {
    child->SetPath(path_.empty() ? child->local_name_ : absl::StrCat(path_, ".", child->local_name_));
  }
}

namespace {

// After the before-hooks every own parameter (and, for backward, its
// gradient) has memory: a deferred binding must have been supplied by now.
absl::Status CheckHasMemory(Module& m, HookPoint point) {
  for (const auto& p : m.own_parameters()) {
    const bool grads = point == HookPoint::kBeforeBackward;
    if (p->value.data() != nullptr && (!grads || p->grad.data() != nullptr)) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "parameter ", p->name, " has no ", p->value.data() == nullptr ? "value" : "gradient",
        " memory at ", HookPointName(point), " of '", m.path(),
        "': a deferred binding must be filled by the engine's hooks"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HookScope> HookScope::Forward(Module& m) {
  MEMWALL_RETURN_IF_ERROR(m.RunHooks(HookPoint::kBeforeForward));
  MEMWALL_RETURN_IF_ERROR(CheckHasMemory(m, HookPoint::kBeforeForward));
  return HookScope(m, HookPoint::kAfterForward);
}

absl::StatusOr<HookScope> HookScope::Backward(Module& m) {
  MEMWALL_RETURN_IF_ERROR(m.RunHooks(HookPoint::kBeforeBackward));
  MEMWALL_RETURN_IF_ERROR(CheckHasMemory(m, HookPoint::kBeforeBackward));
  return HookScope(m, HookPoint::kAfterBackward);
}

}  // namespace memwall::models
