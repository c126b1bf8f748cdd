"""flashspec_fast plugin: a graph-captured device path for Qwen2/Llama models."""
