#include "models/module.h"

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

void Module::AddHookRecursive(const Hook& hook) {
  hooks_.push_back(hook);
  for (Module* child : children_) child->AddHookRecursive(hook);
}

absl::Status Module::RunHooks(HookPoint point) {
  for (const Hook& hook : hooks_) MEMWALL_RETURN_IF_ERROR(hook(*this, point));
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
  }
  for (Module* child : children_) {
    child->SetPath(path_.empty() ? child->local_name_ : absl::StrCat(path_, ".", child->local_name_));
  }
}

absl::StatusOr<HookScope> HookScope::Forward(Module& m) {
  MEMWALL_RETURN_IF_ERROR(m.RunHooks(HookPoint::kBeforeForward));
  return HookScope(m, HookPoint::kAfterForward);
}

absl::StatusOr<HookScope> HookScope::Backward(Module& m) {
  MEMWALL_RETURN_IF_ERROR(m.RunHooks(HookPoint::kBeforeBackward));
  return HookScope(m, HookPoint::kAfterBackward);
}

}  // namespace memwall::models
