"""Weight sync into a separate inference process: the WeightSync protocol and its kinds (base.py)."""
