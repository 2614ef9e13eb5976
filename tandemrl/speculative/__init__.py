"""Speculative decoding's policy: the config, and the proposals known on the host (n-gram prompt lookup). The engine
verifies proposals through the small contract of ``tandemrl.engine.speculative``; ``SpeculativeConfig.for_engine``
builds it from here."""
