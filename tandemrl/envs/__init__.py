"""Environment processes (Atropos-style): pull prompts, sample groups from a server, score them, push them to the
trainer. See docs/async.md."""
