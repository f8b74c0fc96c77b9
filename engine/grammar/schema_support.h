// What the grammar engine can hold an output to. xgrammar compiles most of JSON Schema into the grammar, but it
// skips a few keywords with only a log line (not, if/then/else, dependentRequired, dependentSchemas, contains and
// its bounds, uniqueItems, multipleOf on numbers, and minLength/maxLength beside a pattern or format): an output
// constrained by such a schema may not satisfy it. inferd refuses those schemas instead, naming the keyword and
// where it is, so that every constrained answer validates.
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace inferd {

// OK, or InvalidArgument naming `field`, the first keyword the grammar cannot enforce and its place in the schema
// (a JSON pointer). Not valid JSON is left to the compiler's own error. The schema's depth is bounded before.
absl::Status CheckEnforceable(std::string_view schema_text, std::string_view field);

}  // namespace inferd
