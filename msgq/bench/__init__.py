"""The benchmark programs, one home: every performance claim of the project is one of these
programs printing a table, never a timed unit test.

Suites (``msgq bench SUITE``, or ``python -m msgq.bench.SUITE``):

* :mod:`msgq.bench.core` — pub/sub throughput and round trips of msgq against pyzmq,
  kickmsg and iceoryx2 (``python -m msgq.bench`` runs it); built from
  :mod:`~msgq.bench.peers` (the transports), :mod:`~msgq.bench.workers` (the processes),
  :mod:`~msgq.bench.runner` (the parent side) and :mod:`~msgq.bench.report` (the table);
* :mod:`msgq.bench.visionipc` — VisionIPC frame rates and latency;
* :mod:`msgq.bench.messaging` — SubMaster.update and PubMaster.send per call;
* :mod:`msgq.bench.logs` — log reading and the recorder's zero-drop rate;
* :mod:`msgq.bench.spark` — the Spark data source and ``msgq logstats`` against a loop;
* :mod:`msgq.bench.fixtures` — the services and realistic messages suites share.

Layer: programs, at the top. A suite may import any layer of msgq; nothing below imports
a suite. Optional peers (kickmsg, iceoryx2, pyspark) are imported when a suite runs.
"""
