#include "engine/grammar/schema_support.h"

#include <gtest/gtest.h>

#include <string>

namespace inferd {
namespace {

TEST(SchemaSupport, KeywordsTheGrammarCannotEnforceAreRefusedNamingThemAndWhereTheyAre) {
  struct Case {
    const char* schema;
    const char* names;  // in the message
  };
  for (const Case& c : {
           Case{R"({"type": "array", "items": {"type": "integer"}, "uniqueItems": true})", "uniqueItems at /"},
           Case{R"({"type": "object", "properties": {"tags": {"type": "array", "contains": {"const": 1}}}})",
                "contains at /properties/tags"},
           Case{R"({"not": {"type": "string"}})", "not at /"},
           Case{R"({"anyOf": [{"type": "null"}, {"if": {"type": "string"}}]})", "if at /anyOf/1"},
           Case{R"({"$defs": {"a/b": {"type": "number", "multipleOf": 0.5}}})",
                "multipleOf on a number at /$defs/a~1b"},
           Case{R"({"type": "string", "pattern": "^a+$", "maxLength": 3})",
                "minLength/maxLength beside a pattern at /"},
           Case{R"({"type": "string", "format": "email", "minLength": 3})", "beside a format"},
           Case{R"({"items": [{"type": "string"}, {"dependentRequired": {"a": ["b"]}}]})",
                "dependentRequired at /items/1"},
       }) {
    const absl::Status st = CheckEnforceable(c.schema, "response_format.json_schema.schema");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.schema;
    EXPECT_NE(std::string(st.message()).find(c.names), std::string::npos) << st.message();
    EXPECT_NE(std::string(st.message()).find("response_format.json_schema.schema"), std::string::npos);
  }
}

TEST(SchemaSupport, WhatTheGrammarEnforcesPassesAndDataThatLooksLikeKeywordsIsNotSchema) {
  for (const char* schema : {
           R"({"type": "integer", "multipleOf": 3})", R"({"type": "array", "uniqueItems": false, "maxItems": 3})",
           R"({"type": "string", "pattern": "^[a-z]{1,5}$"})", R"({"type": "string", "minLength": 1, "maxLength": 5})",
           // property names, enum and const values and defaults are data, not keywords
           R"({"type": "object", "properties": {"not": {"type": "string"}, "if": {"enum": [{"not": 1}]}},
               "default": {"uniqueItems": true}, "examples": [{"contains": 1}]})",
           "true",
           "not json at all",  // the compiler's own error names it
       }) {
    EXPECT_TRUE(CheckEnforceable(schema, "f").ok()) << schema;
  }
}

}  // namespace
}  // namespace inferd
