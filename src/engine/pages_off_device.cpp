#include "engine/pages_off_device.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "common/units.hpp"
#include "policy/option_enums.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {
namespace {

// Pages gone (or going, or not back yet): what a stray access would miss.
bool off_device(PageState state) {
  return state == PageState::unmapping || state == PageState::offloaded || state == PageState::reloading;
}

struct ModuleOff {
  std::string release;  // "the end of model.layers.0"
  bool moved = false;   // a saved-tensor pack moved some release point
  std::size_t allocations = 0;
  std::uint64_t bytes = 0;
};

std::string name_of(ranges::PathId node) {
  if (node == ranges::kNoPath) return "?";
  const auto& registry = ranges::Registry::instance();
  return std::string(registry.name(registry.node(node).name));
}

const char* what_stray_access_left(StrayAccess stray_access) {
  switch (stray_access) {
    case StrayAccess::fault: return "their addresses unmapped (stray_access fault)";
    case StrayAccess::poison: return "their pages overwritten (stray_access poison)";
    case StrayAccess::host_mapped: return "the host copy mapped at their addresses (stray_access host_mapped)";
  }
  return "";
}

}  // namespace

std::string describe_pages_off_device(const Groups& groups, ReleaseAfter release_after, StrayAccess stray_access) {
  std::map<std::string, ModuleOff> modules;
  for (const auto& [id, group] : groups.all()) {
    for (const Allocation* allocation : group->allocations) {
      if (!off_device(allocation->state)) continue;
      ModuleOff& module = modules[name_of(group->selected)];
      if (module.release.empty()) module.release = "the end of " + name_of(group->release_node);
      module.moved = module.moved || allocation->saved.has_moved_release;
      ++module.allocations;
      module.bytes += allocation->bytes;
    }
  }
  if (modules.empty()) return {};
  std::vector<std::pair<std::string, ModuleOff>> largest(modules.begin(), modules.end());
  std::stable_sort(largest.begin(), largest.end(),
                   [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  std::string text = "pages actpage had taken off the device then, " + std::string(what_stray_access_left(stray_access)) +
                     " (a read of one of them before backward brought it back is the likeliest cause): ";
  for (std::size_t i = 0; i < largest.size() && i < kMaxModulesNamed; ++i) {
    const auto& [name, module] = largest[i];
    if (i > 0) text += "; ";
    text += name + ", released at " + module.release + " (release_after " +
            std::string(policy::enum_name(release_after)) + (module.moved ? ", moved later by a saved-tensor pack" : "") +
            "): " + std::to_string(module.allocations) + " allocation" + (module.allocations == 1 ? "" : "s") + ", " +
            format_bytes(module.bytes);
  }
  if (largest.size() > kMaxModulesNamed) {
    text += "; and " + std::to_string(largest.size() - kMaxModulesNamed) + " more module" +
            (largest.size() - kMaxModulesNamed == 1 ? "" : "s");
  }
  text += ". Check the policy with `actpage validate -- CMD`, drop those modules from it, or set stray_access host_mapped";
  return text;
}

}  // namespace actpage::engine
