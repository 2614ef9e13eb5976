"""Your own tools: typed, documented Python functions (docs/tools.md, "Your own tools").

Name them in a config (`tools.names = ["examples/my_tools.py:reveal"]`, see examples/peek-own-tool.toml) or pass
them to the Python API (`Trainer(..., tools=[reveal])`). The tool's name is the function's name, its description
the docstring's first paragraph, its arguments' JSON schema the type hints (the `Args:` section describes them).
"""

from tandemrl.rollout.tools import ToolContext


def reveal(context: ToolContext) -> str:
    """Reveal this question's hidden digit."""
    # A ToolContext parameter is not an argument the model writes: it carries the dataset row's columns.
    return str(context.columns["answer"])


def unit_price(item: str, quantity: int = 1) -> float:
    """Look up what some items of the shop cost.

    Args:
        item: the item's name, e.g. "apple"
        quantity: how many
    """
    prices = {"apple": 0.5, "bread": 2.25, "milk": 1.1}
    if item not in prices:
        raise ValueError(f"no item {item!r}; the shop sells {', '.join(prices)}")
    return prices[item] * quantity
