"""The demos behind ``./run.sh``: ``throughput`` (a publisher and subscribers at full speed)
and the end-to-end pipeline (a simulated robot, health view, recording, lockstep replay,
Spark statistics).

Layer: a program — over the services and tools (messaging, logs, VisionIPC, lockstep,
Spark) and ``msgq.cli.output``; only the command line and ``./run.sh`` start it.
"""
