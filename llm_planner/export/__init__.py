"""Exports of plans to other frameworks: Megatron-style placement configs, vLLM and SGLang scripts."""
