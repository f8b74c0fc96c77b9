// Renders a parsed template with a set of global variables.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/chat/jinja/ast.h"

namespace inferd::jinja {

// Errors (raise_exception, type errors, unknown filters) name the line and the cause.
absl::StatusOr<std::string> Render(const Body& body, const Dict& globals);

}  // namespace inferd::jinja
