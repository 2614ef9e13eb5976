"""A user's own tools: `tools.names` entries `file.py:function` / `module:function`, `Trainer(tools=[fn])`, what the
model reads of them (name, description, schema), and their failures (an error for the model, a traceback once)."""

from __future__ import annotations

import json
import logging
import re
import textwrap
import tomllib
from pathlib import Path

import pytest

from tandemrl import Trainer
from tandemrl.config import load_config
from tandemrl.rollout.catalog import build_tools
from tandemrl.rollout.sandbox import SandboxLimits
from tandemrl.rollout.tools import ToolContext, ToolRegistry
from tandemrl.train.eval_run import evaluate_config, run_config
from tandemrl.train.loop import train

REPO = Path(__file__).resolve().parents[2]
# 64 trajectories of up to 32 tokens: the random tiny model writes the call marker `?` in some of them
SMALL = ["model.device=cpu", "train.max_steps=2", "rollout.prompts_per_step=4", "rollout.group_size=8",
         "rollout.max_tokens=32", "eval.limit=4", "eval.pass_k=0", "log.tensorboard=false",
         "checkpoint.every_steps=0"]


def tools(*names: str) -> ToolRegistry:
    return ToolRegistry(build_tools(list(names), SandboxLimits()))


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def step_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "tools/calls_per_traj" in r]


def test_the_example_trains_with_a_tool_from_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the example names its tool file relative to the repository
    cfg = load_config(REPO / "examples" / "peek-own-tool.toml", [*SMALL, f'model.tiny_dir="{tmp_path / "tiny"}"'])
    summary = train(cfg, tmp_path / "run")
    steps = step_rows(tmp_path / "run")
    assert summary["steps"] == 2 and len(steps) == 2
    assert sum(r["tools/calls_per_traj"] for r in steps) > 0  # the model called it ...
    assert all(r["tools/errors"] == 0 for r in steps)  # ... and it answered (the row's hidden digit)
    written = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert written["tools"]["names"] == ["examples/my_tools.py:reveal"]


def test_trainer_takes_tool_callables_and_eval_asks_for_them_again(tmp_path):
    called: list[str] = []

    def reveal_digit(context: ToolContext) -> str:
        """Reveal this question's hidden digit."""
        called.append(context.columns["answer"])
        return str(context.columns["answer"])

    config = {"data.task": "synthetic:peek", "model.tiny_dir": str(tmp_path / "tiny"), "model.device": "cpu",
              "train.max_steps": 2, "rollout.prompts_per_step": 4, "rollout.group_size": 8, "rollout.max_tokens": 32,
              "eval.limit": 4, "eval.pass_k": 0, "log.tensorboard": False, "checkpoint.every_steps": 0}
    trainer = Trainer(model="tiny", tools=[reveal_digit], config=config, out_dir=tmp_path / "run")
    assert trainer.config.tools.names == ["inline:reveal_digit"]
    trainer.train()
    assert called, "the tool callable was never called"
    saved = run_config(tmp_path / "run")
    with pytest.raises(ValueError, match=re.escape("tool 'inline:reveal_digit' was a Python callable (reveal_digit) "
                                                   "given to Trainer(tools=...)")) as err:
        evaluate_config(saved, source=tmp_path / "run")
    assert "Trainer(..., tools=[reveal_digit], out_dir=<the run>).evaluate()" in str(err.value)
    again = Trainer(model="tiny", tools=[reveal_digit], config=config, out_dir=tmp_path / "run").evaluate()
    assert "accuracy" in again


def test_trainer_mixes_callables_and_names():
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    trainer = Trainer(model="tiny", tools=[shout, "calculator"])
    assert trainer.config.tools.names == ["inline:shout", "calculator"] and trainer.config.tools.active
    assert trainer.inputs.tools == {"inline:shout": shout}
    with pytest.raises(TypeError, match="tools: each tool is a function or a name, got int"):
        Trainer(model="tiny", tools=[3])


def test_a_file_tool_is_described_by_its_name_docstring_and_hints():
    registry = tools(f"{REPO / 'examples' / 'my_tools.py'}:unit_price", "calculator")
    described = {d["function"]["name"]: d["function"] for d in registry.describe()}
    price = described["unit_price"]
    assert price["description"] == "Look up what some items of the shop cost."
    assert price["parameters"]["properties"] == {
        "item": {"type": "string", "description": 'the item\'s name, e.g. "apple"'},
        "quantity": {"type": "integer", "default": 1, "description": "how many"}}
    assert price["parameters"]["required"] == ["item"]
    assert registry.call("unit_price", {"item": "bread", "quantity": 2}).text == "4.5"


def test_a_module_tool_and_an_async_tool(tmp_path, monkeypatch):
    write(tmp_path / "shop_tools.py", '''
        import asyncio

        async def stock(item: str) -> int:
            """How many of an item are in stock."""
            await asyncio.sleep(0)
            return {"apple": 3}.get(item, 0)
    ''')
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = tools("shop_tools:stock")
    assert registry.call("stock", {"item": "apple"}).text == "3"


def test_a_failing_user_tool_tells_the_model_and_logs_its_first_traceback_once(tmp_path, caplog):
    path = write(tmp_path / "flaky.py", '''
        def divide(a: int, b: int) -> float:
            """Divide a by b."""
            return a / b
    ''')
    registry = tools(f"{path}:divide")
    with caplog.at_level(logging.WARNING, logger="tandemrl.rollout.tools"):
        first = registry.call("divide", {"a": 1, "b": 0})
        second = registry.call("divide", {"a": 2, "b": 0})
    assert first.error and first.text == "error: divide raised ZeroDivisionError: division by zero"
    assert second.error
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and "Traceback" in logged[0] and "return a / b" in logged[0]
    assert f"{path}:divide" in logged[0]
    assert registry.call("divide", {"a": 1, "b": 2}).text == "0.5"


def test_a_missing_function_lists_the_functions_of_its_file(tmp_path):
    path = write(tmp_path / "mytools.py", '''
        def lookup(key: str) -> str:
            """Look a key up."""
            return key

        def search(query: str) -> str:
            """Search."""
            return query
    ''')
    with pytest.raises(ValueError, match=re.escape(
            f"tools.names: tool '{path}:lookpu': module '{path}' has no attribute 'lookpu' (did you mean 'lookup'?); "
            "the callables it defines: lookup, search")):
        tools(f"{path}:lookpu")


def test_a_missing_file_is_named():
    with pytest.raises(ValueError, match=re.escape("tools.names: tool 'nowhere/mytools.py:lookup': cannot import "
                                                   "module 'nowhere/mytools.py': no such file: nowhere/mytools.py")):
        tools("nowhere/mytools.py:lookup")


@pytest.mark.parametrize("source, message", [
    ("def lookup(key: str) -> str:\n    return key\n",
     "tools.names: tool 'lookup' ({spec}) needs a docstring: its first line is the description the model reads"),
    ('def lookup(key) -> str:\n    """Look a key up."""\n    return key\n',
     "tools.names: tool 'lookup' ({spec}): parameter 'key' needs a type hint"),
])
def test_a_tool_without_a_docstring_or_type_hints_is_refused(tmp_path, source, message):
    path = write(tmp_path / "mytools.py", source)
    spec = f"{path}:lookup"
    with pytest.raises(ValueError, match=re.escape(message.format(spec=spec))):
        tools(spec)


def test_the_config_takes_specs_and_checks_plain_names():
    cfg = load_config(None, ['tools.names=["mytools.py:lookup", "pkg.mod:search", "calculator"]'])
    assert cfg.tools.active and cfg.tools.names == ["mytools.py:lookup", "pkg.mod:search", "calculator"]
    with pytest.raises(ValueError, match=re.escape("unknown tool 'lookup'; built-in tools: python, calculator, peek; "
                                                   "or your own as 'package.module:function'")):
        load_config(None, ['tools.names=["lookup"]'])


def test_a_tool_of_yours_may_not_take_a_built_in_tools_name(tmp_path):
    path = write(tmp_path / "mytools.py", '''
        def calculator(expression: str) -> str:
            """My own calculator."""
            return expression
    ''')
    with pytest.raises(ValueError, match=re.escape(f"two tools are named 'calculator' (calculator and "
                                                   f"{path}:calculator); rename your function")):
        tools("calculator", f"{path}:calculator")
