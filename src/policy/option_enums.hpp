// The text of each enumeration option's values, as written in a policy file and printed back.
//
// Contract: for every enum E of actpage/options.hpp, EnumNames<E>::values lists each enumerator
// once, in declaration order, with its policy text (PythonHooks::automatic is "auto": `auto` is a
// C++ keyword). A test checks each list against the option's unit text in option_list.def.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "actpage/options.hpp"

namespace actpage::policy {

template <class E>
struct EnumNames;

template <>
struct EnumNames<Mode> {
  static constexpr std::array<std::pair<Mode, std::string_view>, 2> values{
      {{Mode::observe, "observe"}, {Mode::offload, "offload"}}};
};
template <>
struct EnumNames<ReleaseAfter> {
  static constexpr std::array<std::pair<ReleaseAfter, std::string_view>, 2> values{
      {{ReleaseAfter::range_end, "range_end"}, {ReleaseAfter::enclosing_range, "enclosing_range"}}};
};
template <>
struct EnumNames<StrayAccess> {
  static constexpr std::array<std::pair<StrayAccess, std::string_view>, 3> values{
      {{StrayAccess::fault, "fault"}, {StrayAccess::host_mapped, "host_mapped"}, {StrayAccess::poison, "poison"}}};
};
template <>
struct EnumNames<PythonHooks> {
  static constexpr std::array<std::pair<PythonHooks, std::string_view>, 3> values{
      {{PythonHooks::automatic, "auto"}, {PythonHooks::on, "on"}, {PythonHooks::off, "off"}}};
};
template <>
struct EnumNames<PythonHooksScope> {
  static constexpr std::array<std::pair<PythonHooksScope, std::string_view>, 2> values{
      {{PythonHooksScope::blocks, "blocks"}, {PythonHooksScope::all, "all"}}};
};
template <>
struct EnumNames<PythonHooksBackward> {
  static constexpr std::array<std::pair<PythonHooksBackward, std::string_view>, 4> values{
      {{PythonHooksBackward::automatic, "auto"},
       {PythonHooksBackward::layers, "layers"},
       {PythonHooksBackward::hooked, "hooked"},
       {PythonHooksBackward::none, "none"}}};
};
template <>
struct EnumNames<PythonHooksCall> {
  static constexpr std::array<std::pair<PythonHooksCall, std::string_view>, 2> values{
      {{PythonHooksCall::hooks, "hooks"}, {PythonHooksCall::wrap, "wrap"}}};
};
template <>
struct EnumNames<AutoGoal> {
  static constexpr std::array<std::pair<AutoGoal, std::string_view>, 2> values{
      {{AutoGoal::near_free, "near_free"}, {AutoGoal::off, "off"}}};
};
template <>
struct EnumNames<LayersEndDrain> {
  static constexpr std::array<std::pair<LayersEndDrain, std::string_view>, 3> values{
      {{LayersEndDrain::off, "off"},
       {LayersEndDrain::while_gpu_behind, "while_gpu_behind"},
       {LayersEndDrain::always, "always"}}};
};
template <>
struct EnumNames<LogLevel> {
  static constexpr std::array<std::pair<LogLevel, std::string_view>, 6> values{
      {{LogLevel::trace, "trace"},
       {LogLevel::debug, "debug"},
       {LogLevel::info, "info"},
       {LogLevel::warn, "warn"},
       {LogLevel::error, "error"},
       {LogLevel::off, "off"}}};
};

// "offload" for Mode::offload; "?" for a value outside the enumeration.
template <class E>
constexpr std::string_view enum_name(E value) {
  for (const auto& [candidate, name] : EnumNames<E>::values) {
    if (candidate == value) return name;
  }
  return "?";
}

// Exact, case-sensitive: "offload" -> Mode::offload; anything else -> nullopt.
template <class E>
constexpr std::optional<E> parse_enum(std::string_view text) {
  for (const auto& [value, name] : EnumNames<E>::values) {
    if (name == text) return value;
  }
  return std::nullopt;
}

// "observe|offload": the allowed values, for messages.
template <class E>
std::string enum_choices() {
  std::string text;
  for (const auto& entry : EnumNames<E>::values) {
    if (!text.empty()) text += '|';
    text += entry.second;
  }
  return text;
}

}  // namespace actpage::policy
