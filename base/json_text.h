// JSON text of values that may hold user text (paths, prompts, skipped lines): nlohmann's dump()
// throws on invalid UTF-8, so every file that stores such values is written through json_text.
#pragma once

#include <string>

namespace glm {

// j.dump(indent) with each invalid UTF-8 byte replaced by U+FFFD instead of a type_error: writing a
// manifest, args.json or meta.json never fails on what a user typed. (Messages keep the bytes
// readable as \xNN: base/text.h.)
template <typename Json>
std::string json_text(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace glm
