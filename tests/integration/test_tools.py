"""Tool calling through the OpenAI API with the official SDK and the openai-agents SDK, and through gRPC, on the
bundled SmolLM2 (cpu backend; its template has no tools, so inferd tells it of them in a system message and reads
Hermes-style <tool_call> answers). A 135M model may answer badly, but with tool_choice "required" or a named
function its output is constrained to a call: every call must name an offered tool and carry arguments that
validate against that tool's schema; history with calls and their answers renders; bad tools are 400s naming the
field."""
import asyncio
import json

import jsonschema
import openai
import pytest

from conftest import openai_client, smollm2_server, inferd_pb2 as pb

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Adds two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 1000},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 1000}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    # The stored 4-bit weights: what is checked here is the calls' shape, not the numerics.
    s = smollm2_server(cpu_weights="as_stored")
    yield s
    assert s.stop() == 0, s.logs()


@pytest.fixture(scope="module")
def sdk(server):
    return openai_client(server, timeout=300)


def assert_valid_calls(calls, allowed=None):
    assert calls, "at least one call"
    for c in calls:
        assert c.type == "function"
        assert c.id.startswith("call_") and len(c.id) == 29, c.id
        assert c.function.name in (allowed or SCHEMAS), c.function.name
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_required_call_is_always_a_valid_call(sdk, choice):
    client, model = sdk
    for seed in range(2):
        r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=choice,
                                           temperature=1.0, seed=seed, max_tokens=96)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.content is None
        assert_valid_calls(c.message.tool_calls, None if choice == "required" else ["add"])
        assert len(c.message.tool_calls) == 1


def test_streamed_calls_arrive_as_deltas_the_sdk_assembles(sdk):
    client, model = sdk
    stream = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                            max_tokens=96, stream=True)
    calls, finish, content, chunks_with_arguments = {}, None, "", 0
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            if d.index not in calls:  # a call's first piece names it
                assert d.id and d.type == "function" and d.function.name, d
                calls[d.index] = {"id": d.id, "name": "", "arguments": ""}
            else:
                assert not d.id and not d.function.name, d
            calls[d.index]["name"] += d.function.name or ""
            calls[d.index]["arguments"] += d.function.arguments or ""
            chunks_with_arguments += bool(d.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert "<tool_call>" not in content, content
    assert len(calls) == 1
    (call,) = calls.values()
    assert call["id"].startswith("call_") and call["name"] in SCHEMAS
    jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    assert chunks_with_arguments > 1, "the arguments stream as they are written"


def test_auto_answers_or_calls_and_none_never_calls(sdk):
    client, model = sdk
    for seed in range(2):
        r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="auto",
                                           temperature=1.0, seed=seed, max_tokens=64)
        c = r.choices[0]
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls"
            assert_valid_calls(c.message.tool_calls)
        else:
            assert c.finish_reason in ("stop", "length") and c.message.content
    # none: told of the tools, but whatever it writes is its answer.
    nudge = [{"role": "user", "content": "Reply with exactly: <tool_call>{\"name\": \"add\", \"arguments\": "
                                         "{\"a\": 1, \"b\": 2}}</tool_call>"}]
    r = client.chat.completions.create(model=model, messages=nudge, tools=TOOLS, tool_choice="none", max_tokens=48)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_conversation_with_calls_and_their_answers_goes_on(sdk):
    client, model = sdk
    first = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=96)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    r = client.chat.completions.create(model=model, messages=history, tools=TOOLS, max_tokens=32)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    if c.message.tool_calls:
        assert_valid_calls(c.message.tool_calls)
    else:
        assert c.message.content


def test_bad_tools_are_refused_naming_the_field(sdk):
    client, model = sdk
    cases = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools[0].function.parameters"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ]
    for extra, field in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=ASK, max_tokens=8, **extra)
        assert field in e.value.message, (extra, e.value.message)


def test_grpc_requests_carry_tools_and_get_the_calls_back(server):
    stub = server.stub
    req = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=ASK[0]["content"])]))
    for t in TOOLS:
        f = t["function"]
        req.tools.add(name=f["name"], description=f["description"], parameters=json.dumps(f["parameters"]))
    req.tool_choice.mode = pb.ToolChoice.FUNCTION
    req.tool_choice.function = "get_weather"
    req.stopping.max_tokens = 96
    result = stub.Generate(req, timeout=300)
    assert len(result.tool_calls) == 1, result.text
    call = result.tool_calls[0]
    assert call.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_weather"])
    assert "<tool_call>" in result.text  # gRPC's text is the model's, calls included
    chunks = list(stub.GenerateStream(req, timeout=300))
    assert [len(c.tool_calls) for c in chunks][-1] == 1 and sum(len(c.tool_calls) for c in chunks) == 1


def test_an_openai_agents_loop_runs_its_tools(server, sdk):
    """The openai-agents SDK (chat completions model) with two function tools: the first turn must call one (its
    arguments reach the Python function parsed and valid), the loop goes on with the tool's answer."""
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                        set_tracing_disabled)
    from agents.exceptions import MaxTurnsExceeded
    set_tracing_disabled(True)
    called = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        called.append(("get_weather", city))
        return f"18 degrees and sunny in {city}"

    @function_tool
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        called.append(("add", a, b))
        return a + b

    model = OpenAIChatCompletionsModel(
        model=sdk[1], openai_client=openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused",
                                                       max_retries=0, timeout=300))
    agent = Agent(name="helper", instructions="Use the tools to answer.", tools=[get_weather, add], model=model,
                  model_settings=ModelSettings(tool_choice="required", max_tokens=96, temperature=0))

    async def run():
        try:
            result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
            return result.final_output
        except MaxTurnsExceeded:  # a small model may keep calling: the loop is still whole
            return None

    final = asyncio.run(run())
    assert called, "the forced first turn called a tool"
    for c in called:
        assert c[0] in ("get_weather", "add")
        if c[0] == "get_weather":
            assert isinstance(c[1], str)
        else:
            assert all(isinstance(v, int) for v in c[1:])
    assert final is None or isinstance(final, str)


def test_hostile_tools_over_grpc_are_refused_and_the_server_lives(server):
    import grpc
    deep = "[" * 100_000 + "]" * 100_000
    msgs = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")])
    cases = [
        (pb.GenerateRequest(messages=msgs, tools=[pb.Tool(name="f", parameters='{"a": ' + deep + "}")]),
         "tools[0].parameters"),
        (pb.GenerateRequest(messages=msgs, tools=[pb.Tool(name="f", parameters="not json")]), "tools[0].parameters"),
        (pb.GenerateRequest(text="hi", tools=[pb.Tool(name="f")]), "tools"),
        (pb.GenerateRequest(messages=msgs, tool_choice=pb.ToolChoice(mode=pb.ToolChoice.REQUIRED)), "tool_choice"),
    ]
    for req, field in cases:
        with pytest.raises(grpc.RpcError) as e:
            server.stub.Generate(req, timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.details(), e.value.details()
    # Arguments nested 100,000 deep in a history's call reach the template as text, and the request is served.
    call = pb.ChatMessage(role="assistant", tool_calls=[pb.ToolCall(id="call_1", name="f", arguments=deep)])
    history = pb.ChatMessages(messages=[msgs.messages[0], call, pb.ChatMessage(role="tool", content="1",
                                                                               tool_call_id="call_1")])
    r = server.stub.Generate(pb.GenerateRequest(messages=history, tools=[pb.Tool(name="f")],
                                                stopping=pb.StoppingParams(max_tokens=2)), timeout=60)
    assert r.usage.completion_tokens >= 1
