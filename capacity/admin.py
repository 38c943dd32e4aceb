"""The capacity layer's admin (its models come with its own issue)."""
