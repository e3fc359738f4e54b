// Names of enum values as options, messages and files spell them. Each enum that a user names
// (an option's value, a field of meta.json) gets one table beside its definition:
//
//   template <>
//   struct EnumNames<Truncation> {
//     static constexpr std::pair<Truncation, std::string_view> table[] = {
//         {Truncation::remove, "delete"}, {Truncation::left, "left"}, {Truncation::right, "right"}};
//   };
//
// The first name of a value is its spelling; a later entry for the same value is an accepted alias.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace glm {

template <typename E>
struct EnumNames;

template <typename E>
using EnumTable = std::span<const std::pair<E, std::string_view>>;

template <typename E>
concept NamedEnum = std::is_enum_v<E> && requires { EnumNames<E>::table; };

template <typename E>
constexpr std::string_view enum_name(E value, EnumTable<E> table) {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "?";
}

template <typename E>
constexpr std::optional<E> enum_from_name(std::string_view name, EnumTable<E> table) {
  for (const auto& [v, n] : table)
    if (n == name) return v;
  return std::nullopt;
}

// "a, b or c": every accepted name, for messages.
template <typename E>
std::string enum_choices(EnumTable<E> table) {
  std::string s;
  for (size_t i = 0; i < table.size(); ++i) {
    if (i > 0) s += i + 1 == table.size() ? " or " : ", ";
    s += table[i].second;
  }
  return s;
}

template <NamedEnum E>
constexpr std::string_view enum_name(E value) {
  return enum_name<E>(value, EnumNames<E>::table);
}

template <NamedEnum E>
constexpr std::optional<E> enum_from_name(std::string_view name) {
  return enum_from_name<E>(name, EnumNames<E>::table);
}

template <NamedEnum E>
std::string enum_choices() {
  return enum_choices<E>(EnumNames<E>::table);
}

}  // namespace glm
