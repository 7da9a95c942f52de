"""Redis: the store of API keys' limits and usage that every router shares."""
