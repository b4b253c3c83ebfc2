"""What is kept per origin (scheme, host and port), in one registry (``limit.py``): how many requests it may
have in flight, the adaptive limit that remote sources take a slot from before each request, and what it cost
its readers, its outages and the full deadlines they met. Its own layer below ``readahead``, whose scheduler
sizes its fetch pool by the limit's ceiling, and above ``quant``/``core``: it knows nothing of sources or
caches."""
