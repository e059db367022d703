"""``python -m msgq.schemas``: prints the service registry in force (msgq's own unless
MSGQ_SCHEMA/MSGQ_REGISTRY say otherwise) and the memory its queues take."""

from msgq.schemas.selection import registry_in_force

print(registry_in_force().table())
