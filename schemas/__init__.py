"""Cap'n Proto schemas and the service registry, importable as ``msgq.schemas``.

The schema files and the registry arrive with their own issue; this package holds the
place in the layout (see DESIGN.md).
"""
