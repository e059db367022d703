"""The bridge: carry services and VisionIPC frames between machines over ZMQ.

On the robot, :class:`Outbound` forwards chosen local services (and VisionIPC streams)
to two ZMQ PUB sockets; on a laptop, :class:`Inbound` subscribes to them and re-publishes
into local msgq, so local subscribers and ``VisionIpcClient`` work unchanged. Wire format:
:mod:`msgq.bridge.wire`; the ``msgq bridge`` command wraps both.

Layer: a tool — over the services (:mod:`msgq.visionipc`), the package's sockets, the
Event layer and pyzmq; nothing in msgq imports it but the ``msgq bridge`` command.
"""

from msgq.bridge.inbound import Inbound
from msgq.bridge.outbound import Outbound
from msgq.bridge.wire import DEFAULT_PORT

__all__ = ["DEFAULT_PORT", "Inbound", "Outbound"]
