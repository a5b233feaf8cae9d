"""Adapters: the outside world (PostgreSQL, the broker, storage, imaging libraries) behind our own interfaces, with vendor errors translated into ``app.errors`` at the edge."""
