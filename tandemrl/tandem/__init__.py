"""Tandem rollouts' policy: the config, the selectors that decide who writes each position, and their boundary
tokens. The engine runs tandem steps through the small contract of ``tandemrl.engine.tandem`` (each request's
owner stream); ``TandemConfig.for_engine`` builds it from here."""
