"""A suite of 150+ JSON schemas through the OpenAI SDK's json_schema response format, on the bundled SmolLM2 (cpu):
every answer must finish and validate with the jsonschema package. The schemas are built from hand-written leaves
(integers with bounds and multiples, enums and consts, strings with lengths, patterns and unicode, booleans,
nulls, type unions)
placed in hand-written shapes (the root, a required or optional property, arrays with item bounds, anyOf with null,
$defs and $ref, nested objects), plus a few whole schemas written out. Strings and arrays carry small maxima so that
a 135M model's answers end (the bound is part of the schema, so the check is strict)."""
import json
import os
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from conftest import openai_client, smollm2_server

LEAVES = [
    {"type": "integer", "minimum": 0, "maximum": 9},
    {"type": "integer", "minimum": -50, "maximum": -10},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
    {"type": "integer", "minimum": 1000, "maximum": 1005},
    {"type": "integer", "minimum": 0, "maximum": 60, "multipleOf": 15},
    {"type": "boolean"},
    {"type": "null"},
    {"type": "string", "maxLength": 10},
    {"type": "string", "minLength": 3, "maxLength": 8},
    {"type": "string", "pattern": "^[a-z]{2,6}$"},
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
    {"type": "string", "pattern": "^(yes|no|maybe)$"},
    {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
    {"type": "string", "pattern": "^[0-9a-f]{8}$"},
    {"type": "string", "pattern": "^[äöüß]{1,5}$"},
    {"enum": ["red", "green", "blue"]},
    {"enum": [1, 2, 3, 5, 8]},
    {"enum": ["東京", "Zürich", "São Paulo", "Кыив"]},
    {"enum": ["a", 1, True, None]},
    {"enum": [True, False, None]},
    {"const": "fixed"},
    {"const": 42},
    {"type": ["string", "null"], "maxLength": 6},
    {"type": "string", "enum": ["🙂", "🙃", "😐"]},
]
# Unbounded numbers are left out of the shapes: at temperature 0 the 135M model writes digits until max_tokens (a
# valid number that never ends); bounded numbers are in WHOLE.


def shapes(leaf, other):
    """The places a leaf is put: the root, a required property, an optional one beside a required other, an array of
    it, anyOf with null, a $ref to it, and two levels down."""
    return [
        leaf,
        {"type": "object", "properties": {"value": leaf}, "required": ["value"], "additionalProperties": False},
        {"type": "object", "properties": {"value": leaf, "note": other}, "required": ["note"],
         "additionalProperties": False},
        {"type": "array", "items": leaf, "minItems": 1, "maxItems": 3},
        {"anyOf": [leaf, {"type": "null"}]},
        {"$defs": {"leaf": leaf}, "type": "object", "properties": {"items": {"type": "array", "items":
                                                                              {"$ref": "#/$defs/leaf"},
                                                                              "maxItems": 2}},
         "required": ["items"], "additionalProperties": False},
        {"type": "object", "properties": {"outer": {"type": "object", "properties": {"inner": leaf},
                                                    "required": ["inner"], "additionalProperties": False}},
         "required": ["outer"], "additionalProperties": False},
    ]


WHOLE = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
        "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 3}},
     "required": ["name", "age", "email", "tags"], "additionalProperties": False},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                                          "y": {"type": "integer", "minimum": -9, "maximum": 9}},
                         "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"type": "object", "properties": {"shape": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0,
                                                                            "maximum": 10}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1,
                                                                               "maximum": 10}},
         "required": ["kind", "side"], "additionalProperties": False}]}},
     "required": ["shape"], "additionalProperties": False},
    {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                "minItems": 1, "maxItems": 2}, "minItems": 1, "maxItems": 2},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "object", "properties": {"d": {"type": "boolean"}}, "required": ["d"],
              "additionalProperties": False}}, "required": ["c"], "additionalProperties": False}},
        "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "items": {"type": "number", "minimum": 0,
                                                                            "maximum": 1}, "minItems": 2,
                                                 "maxItems": 2},
                                      "label": {"type": ["string", "null"], "maxLength": 5}},
     "required": ["matrix", "label"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"enum": ["ok", "error"]}, "code": {"type": "integer", "minimum": 100,
                                                                                     "maximum": 599}},
     "required": ["status", "code"], "additionalProperties": False},
    {"type": "object", "properties": {"q": {"type": "string", "maxLength": 10}, "a": {"type": "string",
                                                                                     "maxLength": 10},
                                      "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["q", "a", "confidence"], "additionalProperties": False},
]

SCHEMAS = [s for i, leaf in enumerate(LEAVES) for s in shapes(leaf, LEAVES[(i + 9) % len(LEAVES)])] + WHOLE


@pytest.fixture(scope="module")
def served():
    # The stored 4-bit weights: what is checked here is that answers validate, not their numerics.
    s = smollm2_server(structured_output_max_bytes=8192, cpu_weights="as_stored")
    yield s
    assert s.stop() == 0, s.logs()


def test_the_suite_is_large_and_every_schema_is_a_valid_schema():
    assert len(SCHEMAS) >= 150
    for schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema)


def test_every_answer_finishes_and_validates(served):
    client, model = openai_client(served, timeout=600)

    def ask(i):
        schema = SCHEMAS[i]
        r = client.chat.completions.create(
            model=model, max_tokens=300, temperature=0,
            messages=[{"role": "user", "content": "Answer with JSON that fits the schema."}],
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema,
                                                                    "strict": True}})
        (choice,) = r.choices
        try:
            assert choice.finish_reason == "stop", f"did not finish ({choice.finish_reason})"
            jsonschema.validate(json.loads(choice.message.content), schema, cls=jsonschema.Draft202012Validator)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            return f"schema {i} {json.dumps(schema)[:200]}: {str(e)[:200]} in {choice.message.content[:200]!r}"
        return None

    # Under the sanitizers (scripts/test_sanitizers.sh sets ASAN_OPTIONS) a quarter of them: the same paths, in CI's
    # time; the plain build answers all.
    chosen = range(0, len(SCHEMAS), 4 if "ASAN_OPTIONS" in os.environ else 1)
    with ThreadPoolExecutor(16) as pool:
        failures = [f for f in pool.map(ask, chosen) if f]
    assert not failures, "\n".join(failures)


def test_keywords_the_grammar_cannot_enforce_are_refused_naming_them(served):
    import openai
    client, model = openai_client(served, timeout=60)
    for schema, named in (({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
                          ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "beside a pattern"),
                          ({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}},
                           "multipleOf on a number at /properties/n")):
        with pytest.raises(openai.BadRequestError, match=named):
            client.chat.completions.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "s", "schema": schema}})
