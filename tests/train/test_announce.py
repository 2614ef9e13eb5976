from torch import nn

from tandemrl.config import load_config
from tandemrl.train.announce import feature_lines, parameter_line
from tandemrl.train.loop import train
from tests.train.test_loop import small_config


def half_frozen_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(100, 1000), nn.Linear(1000, 100))  # 101,000 and 100,100 parameters
    model[0].requires_grad_(False)
    return model


def test_the_parameter_line_counts_what_trains():
    cfg = load_config(None, ["model.lora.enabled=true", "model.lora.rank=8"])
    line = parameter_line(cfg, half_frozen_model())
    assert line.startswith("parameters: 0.2M, trainable 0.1M (49.78 %, LoRA rank 8, alpha 32 on q_proj,")


def test_a_feature_is_announced_only_when_on():
    off = feature_lines(load_config(None, []), half_frozen_model())
    assert len(off) == 1 and "LoRA" not in off[0]
    on = feature_lines(load_config(None, ["tandem.enabled=true", "curriculum.enabled=true"]), half_frozen_model())
    assert [line.split(":")[0] for line in on[1:]] == ["tandem", "curriculum"]
    assert "frozen model a copy of the starting model" in on[1]
    (_, spec) = feature_lines(load_config(None, ['rollout.speculative.method="ngram"']), half_frozen_model())
    assert spec == "speculative decoding: n-gram prompt lookup, 4 tokens proposed per round"


def test_a_run_prints_its_parameters_before_the_first_step(tmp_path, capsys):
    train(small_config(tmp_path, "train.max_steps=1", "checkpoint.every_steps=0"), tmp_path / "run")
    out = capsys.readouterr().out
    assert "parameters: " in out and "(100.00 %)" in out
    assert out.index("parameters: ") < out.index("step 1")


class TemplateTokenizer:
    """A chat template that renders the tools it is given, or ignores them."""

    chat_template = "fake"

    def __init__(self, renders_tools: bool) -> None:
        self.renders_tools = renders_tools

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, tools=None):
        listed = " ".join(t["function"]["name"] for t in tools or []) if self.renders_tools else ""
        return f"<tools>{listed}</tools>" + "".join(m["content"] for m in messages)

    def __call__(self, text, add_special_tokens):
        return {"input_ids": [ord(c) for c in text]}


def encoder_with_calculator(tokenizer, use_chat_template: bool):
    from tandemrl.rollout.catalog import build_tools
    from tandemrl.rollout.sandbox import SandboxLimits
    from tandemrl.rollout.tools import ToolRegistry
    from tandemrl.train.rollouts import PromptEncoder

    tools = ToolRegistry(build_tools(["calculator"], SandboxLimits())).describe()
    return PromptEncoder(tokenizer, use_chat_template, None, tools)


def test_tools_the_prompt_never_names_are_warned_about():
    from tandemrl.train.announce import unseen_tools_warning
    from tandemrl.types import Sample

    sample = Sample(prompt="2+2=", answer=None, index=0)
    cfg = load_config(None, ['tools.names=["calculator"]'])
    text_only = unseen_tools_warning(cfg, encoder_with_calculator(TemplateTokenizer(True), False), sample)
    assert "tools calculator are never described" in text_only and "data.use_chat_template = false" in text_only
    ignored = unseen_tools_warning(cfg, encoder_with_calculator(TemplateTokenizer(False), True), sample)
    assert "does not render `tools`" in ignored
    assert unseen_tools_warning(cfg, encoder_with_calculator(TemplateTokenizer(True), True), sample) is None
    plain = load_config(None, ['tools.names=["calculator"]', 'tools.format="plain"'])
    assert unseen_tools_warning(plain, encoder_with_calculator(TemplateTokenizer(False), True), sample) is None
