"""The LLM stage: one streaming chat interface, a local llama.cpp model and an
OpenAI-compatible HTTP client, plus the aggregator that turns tokens into speakable chunks."""
