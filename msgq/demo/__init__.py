"""The demos behind ``./run.sh``: ``throughput`` (a publisher and subscribers at full speed)
and the end-to-end pipeline (a simulated robot, health view, recording, lockstep replay,
Spark statistics)."""
