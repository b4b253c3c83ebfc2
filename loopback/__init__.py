"""Real servers on 127.0.0.1 that the test suite and the benchmarks start and stop: Debian's nginx (with a
throwaway TLS CA), moto's S3 server, a Hugging Face Hub stand-in (servers.py), a fault-injecting proxy
(faultproxy.py), redis-server and a 3-node Redis Cluster (redis_server.py, redis_cluster_server.py).

Neither tests/ nor benchmarks/ owns them: both import them from here (the repository root is on the import
path of both), and nothing here imports pytest, so a benchmark runs without the test suite. A program a
server needs that is not installed raises :class:`loopback.servers.MissingTool`.
"""
