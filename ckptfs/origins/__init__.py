"""How many requests each origin (scheme, host and port) may have in flight: the adaptive per-origin limit
that remote sources take a slot from before each request (``limit.py``). Its own layer below ``readahead``,
whose scheduler sizes its fetch pool by the limit's ceiling, and above ``quant``/``core``: it knows nothing of
sources or caches."""
