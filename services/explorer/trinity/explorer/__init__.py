"""The Explorer's library: rollout engines, workflows and reward functions.

Each extension point is a registry keyed by the name a config uses:
`trinity.explorer.engines` (`vllm`, `transformers`, `scripted`), `trinity.explorer.workflows`
(`math`, `countdown`, `multi_turn`, `frozen_lake`, ...) and `trinity.explorer.rewards`
(`math`, `accuracy`, `format`, `countdown`, composites). The gRPC service builds on these.
"""
