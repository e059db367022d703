"""VisionIPC: large frame buffers shared by file descriptor, announced over msgq.

Importable as ``msgq.visionipc``. The server and client arrive with their own issue;
this package holds the place in the layout (see DESIGN.md).
"""
