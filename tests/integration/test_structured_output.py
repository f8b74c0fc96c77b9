"""Structured output through the OpenAI API with the official SDK, on the bundled SmolLM2 (cpu backend): JSON
schemas (response_format, and the SDK's parse() with a Pydantic model), any JSON object, and vLLM's
structured_outputs (regex, choice, EBNF grammar). Every answer that finishes must satisfy its constraint (checked
with the jsonschema package); constraints that cannot be compiled, or are too large, are 400s naming the field."""
import json
import re

import jsonschema
import openai
import pydantic
import pytest

import grpc

from conftest import openai_client, smollm2_server, inferd_pb2 as pb

ASK = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.fixture(scope="module")
def server():
    # The stored 4-bit weights: what is checked here is that answers validate, not their numerics.
    s = smollm2_server(structured_output_max_bytes=4096, cpu_weights="as_stored")
    yield s
    assert s.stop() == 0, s.logs()


@pytest.fixture(scope="module")
def sdk(server):
    return openai_client(server, timeout=300)


@pytest.fixture(scope="module")
def client(sdk):
    return sdk[0]


@pytest.fixture(scope="module")
def model(sdk):
    return sdk[1]


def bounded(schema):
    """The schema with every string and array given a small maximum, so that a 135M model's answers end."""
    if isinstance(schema, dict):
        schema = {k: bounded(v) for k, v in schema.items()}
        if schema.get("type") == "string" and "enum" not in schema and "pattern" not in schema:
            schema.setdefault("maxLength", 12)
        if schema.get("type") == "array":
            schema.setdefault("maxItems", 3)
    elif isinstance(schema, list):
        schema = [bounded(s) for s in schema]
    return schema


SCHEMAS = [bounded(s) for s in [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0,
                                                                          "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "population": {"type": "number"}},
     "required": ["city"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}},
                                      "ok": {"type": "boolean"}}, "required": ["tags", "ok"],
     "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "number"},
                                                                                "y": {"type": "number"}},
                                                "required": ["x", "y"], "additionalProperties": False}},
     "required": ["point"], "additionalProperties": False},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"],
                "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "b"}, "n": {"type": "integer"}},
                "required": ["kind", "n"], "additionalProperties": False}]},
    {"$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}},
                        "required": ["id"], "additionalProperties": False}},
     "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
     "required": ["code"], "additionalProperties": False},
    {"type": "object", "properties": {"word": {"type": "string", "minLength": 2}, "mood": {"type": ["string", "null"]}},
     "required": ["word", "mood"], "additionalProperties": False},
    {"type": "object", "properties": {"émoji": {"type": "string"}, "日本": {"type": "integer", "minimum": 0,
                                                                           "maximum": 9}},
     "required": ["émoji", "日本"], "additionalProperties": False},
    {"type": "string", "enum": ["red", "green", "blue"]},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["score"], "additionalProperties": False},
]]


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_json_schema_answers_validate(client, model, i):
    schema = SCHEMAS[i]
    r = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=200, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    (choice,) = r.choices
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_sampled_answers_validate_too(client, model):
    schema = SCHEMAS[0]
    for seed in range(3):
        r = client.chat.completions.create(
            model=model, messages=ASK, max_tokens=200, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
        if r.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)


def test_the_sdks_parse_with_a_pydantic_model(client, model):
    r = client.chat.completions.parse(model=model, messages=ASK, max_tokens=200, temperature=0, response_format=Person)
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120


def test_json_object_and_streaming(client, model):
    # Once the object closes only the end may follow: a few-shot prompt leads SmolLM2 to close it.
    r = client.completions.create(model=model, prompt='{"answer": "Paris"}\n{"answer": "Rome"}\n', max_tokens=40,
                                  temperature=0, extra_body={"response_format": {"type": "json_object"}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].text
    assert isinstance(json.loads(r.choices[0].text), dict)
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=ASK, max_tokens=200, temperature=0, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS[0]}}) if c.choices]
    jsonschema.validate(json.loads("".join(parts)), SCHEMAS[0])


def test_vllm_structured_outputs_regex_choice_and_grammar(client, model):
    def ask(structured, prompt="Answer."):
        r = client.completions.create(model=model, prompt=prompt, max_tokens=40, temperature=0,
                                      extra_body={"structured_outputs": structured})
        assert r.choices[0].finish_reason == "stop", r.choices[0].text
        return r.choices[0].text
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", ask({"regex": r"\d{4}-\d{2}-\d{2}"}, "Today's date is"))
    assert ask({"choice": ["yes", "no", "it depends"]}, "Is Paris in France?") in ("yes", "no", "it depends")
    assert re.fullmatch(r"(ab)+c", ask({"grammar": 'root ::= ("ab")+ "c"'}))
    r = client.chat.completions.create(model=model, messages=ASK, max_tokens=60, temperature=0,
                                       extra_body={"structured_outputs": {"json": SCHEMAS[1]}})
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMAS[1])


def test_bad_and_oversized_constraints_are_400s_naming_the_field(client, model):
    with pytest.raises(openai.BadRequestError, match="response_format.json_schema"):
        client.chat.completions.create(model=model, messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    with pytest.raises(openai.BadRequestError, match="structured_outputs.regex|constraint.regex"):
        client.completions.create(model=model, prompt="x", extra_body={"structured_outputs": {"regex": "(unclosed"}})
    with pytest.raises(openai.BadRequestError, match="at most 4096"):
        client.completions.create(model=model, prompt="x",
                                  extra_body={"structured_outputs": {"choice": ["x" * 100] * 50}})
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model=model, messages=ASK, response_format={"type": "xml"})
    with pytest.raises(openai.BadRequestError, match="structured_outputs"):
        client.completions.create(model=model, prompt="x", extra_body={"structured_outputs": {"json": 3}})
    # A complete constraint allows only the end, which min_tokens would forbid.
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        client.completions.create(model=model, prompt="x", extra_body={"min_tokens": 3,
                                                                      "structured_outputs": {"choice": ["a"]}})


def test_ignore_eos_ends_where_the_constraint_does(client, model):
    r = client.completions.create(model=model, prompt="Pick:", max_tokens=30, temperature=0,
                                  extra_body={"ignore_eos": True, "structured_outputs": {"choice": ["left", "right"]}})
    assert r.choices[0].text in ("left", "right") and r.choices[0].finish_reason == "stop"


def test_grpc_takes_the_same_constraints(server):
    def generate(constraint, text="Today's date is"):
        return server.stub.Generate(pb.GenerateRequest(text=text, sampling=pb.SamplingParams(temperature=0),
                                                       stopping=pb.StoppingParams(max_tokens=40),
                                                       constraint=constraint))
    g = generate(pb.OutputConstraint(regex=r"\d{4}-\d{2}-\d{2}"))
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", g.text) and g.finish_reason == pb.EOS
    g = generate(pb.OutputConstraint(json_schema=json.dumps(SCHEMAS[0])), "A person as JSON:")
    jsonschema.validate(json.loads(g.text), SCHEMAS[0])
    g = generate(pb.OutputConstraint(choice=pb.Choices(choices=["alpha", "beta"])))
    assert g.text in ("alpha", "beta")
    with pytest.raises(grpc.RpcError) as e:
        generate(pb.OutputConstraint(grammar="root ::= undefined_rule"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "constraint.grammar" in e.value.details()


def test_hostile_schemas_are_bounded_and_the_server_goes_on(client, model):
    def nested(depth):
        schema = {"type": "integer"}
        for _ in range(depth):
            schema = {"type": "array", "items": schema, "maxItems": 1}
        return schema
    # Deep nesting: in the body, past its bound of 32 levels, refused before anything is built; as the text of a
    # schema (structured_outputs.json takes one), compiled or refused, never a crash or a hang.
    with pytest.raises(openai.BadRequestError, match="nested deeper"):
        client.chat.completions.create(model=model, messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "deep", "schema": nested(40)}})
    for depth in (20, 300):
        try:
            r = client.completions.create(model=model, prompt="[", max_tokens=120, temperature=0,
                                          extra_body={"structured_outputs": {"json": json.dumps(nested(depth))}})
            if r.choices[0].finish_reason == "stop":
                jsonschema.validate(json.loads(r.choices[0].text), nested(depth))
        except openai.BadRequestError as e:
            assert "structured_outputs.json" in str(e)
    # A huge enum: over engine.structured_output_max_bytes.
    with pytest.raises(openai.BadRequestError, match="at most 4096"):
        client.chat.completions.create(model=model, messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "enum", "schema": {"enum": [f"v{i}" for i in range(2000)]}}})
    r = client.chat.completions.create(model=model, messages=ASK, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_constrained_streams_cancelled_mid_way_free_everything(server, client, model):
    """Constrained streams (a schema, a forced tool call) closed by their clients after two chunks: the engine
    drops them and every KV block comes back, and the server answers the next constrained request."""
    from conftest import wait_until_idle
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    tool = {"type": "function", "function": {"name": "tell", "parameters": schema}}
    for extra in ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
                  {"tools": [tool], "tool_choice": "required"}):
        streams = [client.chat.completions.create(model=model, messages=ASK, max_tokens=2000, stream=True, **extra)
                   for _ in range(4)]
        for s in streams:
            for i, _ in enumerate(s):
                if i == 1:
                    break
            s.close()
        info = wait_until_idle(server.stub, timeout=60)
        assert info.running_requests == 0 and info.free_kv_blocks == info.total_kv_blocks, info
    r = client.chat.completions.create(model=model, messages=ASK, max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": bounded(schema)}})
    if r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(r.choices[0].message.content), bounded(schema))
