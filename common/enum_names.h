// Enum names as data: one table of {name, value} per enum, read in both directions by the two
// lookups below, so that every to_string of an enum is the same loop and a name that is also parsed
// (a recipe's key, a checkpoint's tensor role) is spelled in one place.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace llmtrain {

template <typename E>
struct EnumName {
  const char* name;
  E value;
};

// The name of `v`, or `otherwise` for a value the table does not hold.
template <typename E>
const char* enum_name(std::span<const EnumName<E>> names, E v, const char* otherwise = "?") {
  for (const EnumName<E>& n : names)
    if (n.value == v) return n.name;
  return otherwise;
}
template <typename E, size_t N>
const char* enum_name(const EnumName<E> (&names)[N], E v, const char* otherwise = "?") {
  return enum_name(std::span<const EnumName<E>>(names), v, otherwise);
}

// The value named `name`, or nullopt.
template <typename E>
std::optional<E> enum_value(std::span<const EnumName<E>> names, std::string_view name) {
  for (const EnumName<E>& n : names)
    if (name == n.name) return n.value;
  return std::nullopt;
}
template <typename E, size_t N>
std::optional<E> enum_value(const EnumName<E> (&names)[N], std::string_view name) {
  return enum_value(std::span<const EnumName<E>>(names), name);
}

}  // namespace llmtrain
