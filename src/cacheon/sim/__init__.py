"""A simulator of an SGLang worker (not an engine): real HTTP, a real prefix cache, real KV events."""
