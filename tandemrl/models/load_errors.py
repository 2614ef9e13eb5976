"""What load.py and gguf.py share: the error a user can fix, and the name transformers gives the dtype argument.
Its own module because load.py loads gguf.py: neither imports the other back."""

from __future__ import annotations

import transformers
from packaging.version import Version

# transformers 4.56 added `dtype=` to from_pretrained; 5.0 removed `torch_dtype=`.
DTYPE_KWARG = "dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype"


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded, for a reason the user can fix; the message says how."""
