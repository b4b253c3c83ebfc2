"""A split GGUF set served as one ``model.gguf`` (the shards' headers merged, their tensor data in place)."""
