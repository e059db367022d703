"""The registry of robot.capnp, written the way openpilot's cereal writes services.py:
a Service class of its own with port, should_log, frequency and decimation, and no
message sizes (msgq gives such services upstream's default queue size)."""

STARTING_PORT = 9101


class Service:
    def __init__(self, port, should_log, frequency, decimation=None):
        self.port = port
        self.should_log = should_log
        self.frequency = frequency
        self.decimation = decimation


_services = {
    # service: (should_log, frequency, decimation)
    "initData": (True, 0.0, 1),
    "armState": (True, 100.0, 10),
    "imu": (True, 50.0, 5),
    "cameraFrame": (False, 20.0, None),
    "canFrames": (True, 100.0, None),
    "rawChunks": (True, 0.0, None),
    "missionLog": (True, 0.0, 1),
    "plannerPlan": (True, 20.0, 2),
    "heartbeat": (True, 0.5, 1),
    "diagnostics": (True, 1.0, 1),
}

SERVICE_LIST = {name: Service(STARTING_PORT + index, *values)
                for index, (name, values) in enumerate(_services.items())}
