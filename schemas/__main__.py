"""``python -m msgq.schemas``: prints the service registry and the memory its queues take."""

from msgq.schemas.services import main

main()
