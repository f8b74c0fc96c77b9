// Parses Jinja template source into statements, with the whitespace rules Hugging Face renders chat
// templates with: trim_blocks and lstrip_blocks on, and `-` on a tag strips the whitespace beside it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/chat/jinja/ast.h"

namespace inferd::jinja {

// An unsupported construct or a syntax error is an error naming the line.
absl::StatusOr<Body> ParseTemplate(const std::string& source);

}  // namespace inferd::jinja
