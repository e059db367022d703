"""Deprecated: the ZMQ backend is the package :mod:`msgq.zmq` (its security in
:mod:`msgq.zmq.security`). This alias keeps ``from msgq import zmq_backend`` and
``msgq.zmq_backend.NAME``, which earlier documentation showed, working with a
DeprecationWarning; it will be removed."""

from __future__ import annotations

import warnings

from msgq.zmq import *  # noqa: F403 (the alias re-exports the package's public names)
from msgq.zmq import __all__  # noqa: F401

warnings.warn("msgq.zmq_backend is deprecated: import msgq.zmq (keys and permissions: "
              "msgq.zmq.security)", DeprecationWarning, stacklevel=2)
