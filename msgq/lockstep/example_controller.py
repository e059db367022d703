"""An example service written to replay deterministically: a small vehicle controller.

It subscribes to ``vehicleState`` (its trigger: one control step per message),
``gyroscope`` and ``accelerometer``, and publishes ``controlCommand`` and
``controllerState`` once per step:

* longitudinal: a PI controller on speed (target: the cruise set speed, else
  ``--v-cruise``) whose acceleration command is rate limited (``jerk_max``);
* lateral: a PI controller holding the yaw rate (from the gyroscope) at zero, with a
  feedforward on lateral acceleration, its torque rate limited;
* both integrate over ``dt``, the time since the previous step, read from
  :mod:`msgq.lockstep.clock` — the wall clock when it runs live, the replayed
  ``logMonoTime`` of each ``vehicleState`` under the lockstep harness. Its outputs are
  stamped with that clock too, and ``controllerState.cumLagMs`` is how late the step ran
  after its trigger (0 under the harness).

Everything it publishes is a function of the messages it received and the clock, which
is what makes a lockstep replay of it byte-identical from run to run.

Live: ``python -m msgq.lockstep.example_controller [--v-cruise 25] [--max-steps N]``.
Replayed: ``run_lockstep(example_controller.main, log, TRIGGER, OUTPUTS)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from msgq.lockstep import clock
from msgq.messaging import PubMaster, SubMaster, new_message

__all__ = ["INPUTS", "OUTPUTS", "TRIGGER", "Controller", "Pid", "Tuning", "main",
           "rate_limit"]

TRIGGER = "vehicleState"
INPUTS = ("vehicleState", "gyroscope", "accelerometer")
OUTPUTS = ("controlCommand", "controllerState")

#: dt of the first step, when there is no previous one (s).
NOMINAL_DT = 0.01
#: dt is clamped to this range, so a gap in the input does not kick the integrators (s).
MIN_DT, MAX_DT = 0.001, 0.1


@dataclass(frozen=True)
class Tuning:
    """Gains and limits of the controller."""

    v_cruise: float = 25.0  # m/s, when the cruise set speed is 0
    speed_kp: float = 0.6
    speed_ki: float = 0.15
    accel_min: float = -3.5  # m/s^2
    accel_max: float = 2.0
    jerk_max: float = 2.5  # m/s^3: rate limit of the acceleration command
    yaw_kp: float = 1.2
    yaw_ki: float = 0.4
    lat_accel_ff: float = 0.05  # torque per m/s^2 of measured lateral acceleration
    torque_rate_max: float = 1.5  # torque units per second


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def rate_limit(value: float, last: float, max_rate: float, dt: float) -> float:
    """``value``, moved at most ``max_rate * dt`` away from ``last``."""
    return _clamp(value, last - max_rate * dt, last + max_rate * dt)


class Pid:
    """A PI controller with feedforward and anti-windup (the integrator holds while the
    output saturates)."""

    def __init__(self, kp: float, ki: float, low: float, high: float) -> None:
        self.kp, self.ki, self.low, self.high = kp, ki, low, high
        self.reset()

    def reset(self) -> None:
        """Back to rest: integrator and terms at zero."""
        self.error = self.p = self.i = self.f = self.output = 0.0
        self.saturated = False
        self.active = False

    def update(self, error: float, dt: float, feedforward: float = 0.0) -> float:
        """One update over ``dt`` seconds; returns the clamped output."""
        self.active = True
        self.error = error
        self.p = self.kp * error
        self.f = feedforward
        integrated = self.i + self.ki * error * dt
        unclamped = self.p + integrated + self.f
        self.output = _clamp(unclamped, self.low, self.high)
        self.saturated = self.output != unclamped
        if not self.saturated:
            self.i = integrated
        return self.output

    def fill(self, state: Any) -> None:
        """Copies the terms into a ``ControllerState.PidState`` builder."""
        state.active = self.active
        state.error = self.error
        state.p = self.p
        state.i = self.i
        state.f = self.f
        state.output = self.output
        state.saturated = self.saturated


class Controller:
    """The control law, apart from the sockets: :meth:`step` takes a SubMaster (or
    anything indexable the same way) and the time of the step."""

    def __init__(self, tuning: Tuning | None = None) -> None:
        self.tuning = tuning = tuning or Tuning()
        self.speed_pid = Pid(tuning.speed_kp, tuning.speed_ki, tuning.accel_min,
                             tuning.accel_max)
        self.yaw_pid = Pid(tuning.yaw_kp, tuning.yaw_ki, -1.0, 1.0)
        self.accel = 0.0
        self.torque = 0.0
        self.last_ns: int | None = None
        self.steps = 0

    def dt(self, now_ns: int) -> float:
        """Seconds since the previous step (clamped; NOMINAL_DT for the first)."""
        if self.last_ns is None:
            return NOMINAL_DT
        return _clamp((now_ns - self.last_ns) / 1e9, MIN_DT, MAX_DT)

    def step(self, sm: Any, now_ns: int) -> tuple[Any, Any]:
        """One control step at ``now_ns``: returns the controlCommand and controllerState
        Event builders (stamped ``now_ns``)."""
        tuning = self.tuning
        dt = self.dt(now_ns)
        self.last_ns = now_ns
        self.steps += 1

        vehicle = sm["vehicleState"]
        cruise = vehicle.cruiseState
        engaged = bool(cruise.enabled and not vehicle.brakePressed and not vehicle.doorOpen
                       and not vehicle.seatbeltUnlatched)
        overriding = engaged and bool(vehicle.gasPressed or vehicle.steeringPressed)
        v_target = float(cruise.setSpeed) if cruise.setSpeed > 0 else tuning.v_cruise

        if engaged and not vehicle.gasPressed:
            accel = self.speed_pid.update(v_target - vehicle.speed, dt)
        else:
            self.speed_pid.reset()
            accel = 0.0
        self.accel = rate_limit(accel, self.accel, tuning.jerk_max, dt)

        yaw_rate = sm["gyroscope"].value.z if sm.seen["gyroscope"] else vehicle.yawRate
        lateral_accel = sm["accelerometer"].value.y if sm.seen["accelerometer"] else 0.0
        if engaged and not vehicle.steeringPressed:
            torque = self.yaw_pid.update(-yaw_rate, dt, -tuning.lat_accel_ff * lateral_accel)
        else:
            self.yaw_pid.reset()
            torque = 0.0
        self.torque = rate_limit(torque, self.torque, tuning.torque_rate_max, dt)

        valid = sm.all_checks()
        command = new_message("controlCommand", logMonoTime=now_ns, valid=valid)
        c = command.controlCommand
        c.enabled = engaged
        c.latActive = self.yaw_pid.active
        c.longActive = self.speed_pid.active
        c.accel = self.accel
        c.steerTorque = self.torque
        c.hudAlert = "steerLimit" if self.yaw_pid.saturated else "none"

        state = new_message("controllerState", logMonoTime=now_ns, valid=valid)
        s = state.controllerState
        s.state = "overriding" if overriding else "enabled" if engaged else "disabled"
        s.enabled = engaged
        s.active = engaged and not overriding
        s.vCruise = v_target
        self.yaw_pid.fill(s.lateral)
        self.speed_pid.fill(s.longitudinal)
        s.cumLagMs = (now_ns - sm.logMonoTime["vehicleState"]) / 1e6
        s.step = self.steps
        if self.yaw_pid.saturated:
            s.alertText = "steering limited"
        return command, state


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the controller until Ctrl-C (or ``--max-steps``)."""
    parser = argparse.ArgumentParser(
        prog="python -m msgq.lockstep.example_controller",
        description="Example controller: vehicleState + gyroscope + accelerometer in, "
                    "controlCommand + controllerState out, one step per vehicleState.")
    parser.add_argument("--v-cruise", type=float, default=Tuning.v_cruise,
                        help="target speed (m/s) when the cruise set speed is 0 "
                             "(default %(default)s)")
    parser.add_argument("--max-steps", type=int, default=0,
                        help="stop after this many steps (default: run until Ctrl-C)")
    parser.add_argument("--timeout-ms", type=int, default=100,
                        help="how long one update waits for vehicleState "
                             "(default %(default)s)")
    args = parser.parse_args(argv)


    sm = SubMaster(list(INPUTS), poll=TRIGGER)
    pm = PubMaster(list(OUTPUTS))
    controller = Controller(Tuning(v_cruise=args.v_cruise))
    try:
        while not args.max_steps or controller.steps < args.max_steps:
            sm.update(args.timeout_ms)
            if not sm.updated[TRIGGER]:
                continue
            command, state = controller.step(sm, clock.monotonic_ns())
            pm.send("controlCommand", command)
            pm.send("controllerState", state)
    except KeyboardInterrupt:
        pass
    finally:
        sm.close()
        pm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
