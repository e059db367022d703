"""Compatibility packages: code written against another project's Python API runs over
msgq unchanged.

* :mod:`msgq.compat.cereal` — openpilot's ``cereal`` (``from cereal import log``,
  ``import cereal.messaging as messaging``, ``from cereal.services import SERVICE_LIST``)
  with the schema and services of a cereal checkout in force.

Layer: a tool — over the services (:mod:`msgq.messaging`, :mod:`msgq.visionipc`), the
package and the Event layer. Nothing here is imported by ``import msgq``.
"""
