"""Each framework adapter through its framework's own machinery, driven by
a scripted model instead of an LLM, against a real pycelld: the model asks
for run_python, then for python_session twice (state kept), and the tools'
answers reach it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import Pycelld

# The calls the scripted models make, in order, and what each answer must say.
CALLS = [
    ("run_python", {"code": "print(6 * 7)"}, "42"),
    ("python_session", {"code": "x = 40"}, "(no output, no value)"),
    ("python_session", {"code": "x + 2"}, "value: 42"),
    ("run_python", {"code": "import sys\nsys.exit('no')"}, "status: error (exit code 1)"),
]


def check_answers(answers: list[str]) -> None:
    assert len(answers) == len(CALLS), answers
    for (tool, _, want), got in zip(CALLS, answers, strict=True):
        assert want in got, (tool, want, got)


def test_pydantic_ai_toolset(pycelld: Pycelld) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from pycell.pydantic_ai import sandbox_toolset

    answers: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart):
                answers.append(str(part.content))
        assert {t.name for t in info.function_tools} == {"run_python", "python_session"}
        if len(answers) < len(CALLS):
            tool, args, _ = CALLS[len(answers)]
            return ModelResponse(parts=[ToolCallPart(tool, args)])
        return ModelResponse(parts=[TextPart("done")])

    toolset = sandbox_toolset()

    async def main() -> str:
        try:
            result = await Agent(FunctionModel(model), toolsets=[toolset]).run("compute")
            return str(result.output)
        finally:
            await toolset.tools_state.aclose()

    assert asyncio.run(main()) == "done"
    check_answers(answers)


def test_langchain_tools(pycelld: Pycelld) -> None:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

    from pycell.langchain import sandbox_tools

    tools = sandbox_tools()
    by_name = {t.name: t for t in tools}
    assert set(by_name) == {"run_python", "python_session"}
    assert "fresh, isolated sandbox" in by_name["run_python"].description
    assert set(by_name["run_python"].args) == {"code", "dependencies"}
    scripted = [
        AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"c{i}"}]) for i, (n, a, _) in enumerate(CALLS)
    ]
    model = FakeMessagesListChatModel(responses=[*scripted, AIMessage(content="done")])

    async def main() -> list[str]:
        messages: list[BaseMessage] = [HumanMessage("compute")]
        answers: list[str] = []
        try:
            while True:
                reply = await model.ainvoke(messages)
                messages.append(reply)
                if not isinstance(reply, AIMessage) or not reply.tool_calls:
                    return answers
                for call in reply.tool_calls:
                    out = await by_name[call["name"]].ainvoke(call)
                    assert isinstance(out, ToolMessage)
                    answers.append(str(out.content))
                    messages.append(out)
        finally:
            await tools[0].metadata["sandbox"].aclose()  # type: ignore[index]

    check_answers(asyncio.run(main()))
    # run_python also runs sync.
    assert "42" in by_name["run_python"].invoke({"code": "print(6 * 7)"})


def test_openai_agents_tools(pycelld: Pycelld) -> None:
    from agents import Agent, Model, ModelResponse, Runner
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from pycell._agent_tools import SandboxTools
    from pycell.openai_agents import sandbox_tools

    answers: list[str] = []

    class Scripted(Model):
        async def get_response(
            self,
            system_instructions: Any,
            input: Any,
            model_settings: Any,
            tools: Any,
            output_schema: Any,
            handoffs: Any,
            tracing: Any,
            **kwargs: Any,
        ) -> ModelResponse:
            assert {t.name for t in tools} == {"run_python", "python_session"}
            if isinstance(input, list):
                answers[:] = [
                    str(i["output"]) for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"
                ]
            if len(answers) < len(CALLS):
                n = len(answers)
                tool, args, _ = CALLS[n]
                call = ResponseFunctionToolCall(
                    type="function_call",
                    call_id=f"c{n}",
                    name=tool,
                    arguments=json.dumps({"dependencies": None, **args}) if tool == "run_python" else json.dumps(args),
                )
                return ModelResponse(output=[call], usage=Usage(), response_id=None)
            text = ResponseOutputText(type="output_text", text="done", annotations=[])
            message = ResponseOutputMessage(
                type="message", id="m", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            raise NotImplementedError

    state = SandboxTools()
    agent = Agent(name="analyst", instructions="compute", model=Scripted(), tools=sandbox_tools(tools=state))

    async def main() -> str:
        try:
            result = await Runner.run(agent, "compute", max_turns=len(CALLS) + 2)
            return str(result.final_output)
        finally:
            await state.aclose()

    assert asyncio.run(main()) == "done"
    check_answers(answers)


def test_a_refusal_reads_as_an_answer(pycelld: Pycelld) -> None:
    from pycell._agent_tools import SandboxTools

    async def main() -> str:
        return await SandboxTools(policy="no-such-policy").run_python("print(1)")

    answer = asyncio.run(main())
    assert answer.startswith("refused (invalid_request)"), answer


@pytest.fixture(autouse=True)
def _no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The Agents SDK would send traces to OpenAI: off.
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
