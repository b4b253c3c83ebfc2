"""Cache tiers below the in-memory LRU: a disk folder and Redis (issue 19); see docs/caches.md."""
