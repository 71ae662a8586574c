"""Serving plans for decoder LLMs: output tokens/s of the whole cluster under a per-token
latency target (TPOT), with every prompt's prefill charged and every in-flight sequence's KV
cache in memory. docs/serving.md has the model, its sources and the bound."""
