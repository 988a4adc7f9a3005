"""Client-facing HTTP surfaces: OpenAI- and Anthropic-compatible."""
