"""Misspelled field names are said in one line naming the struct, the closest field and
the fields (issue 30 §3), wherever a user's field name meets a struct: SubMaster's
payload views, pycapnp's own readers and builders (new_message, PubMaster users),
``new_message(**fields)`` and dotted field paths (:func:`resolve_field_path`)."""

from __future__ import annotations

from typing import Any

import pytest
from capnp.lib.capnp import KjException

from msgq.messaging import PubMaster, SubMaster, log_from_bytes, new_message
from msgq.schemas.field_errors import UnknownFieldError, resolve_field_path


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and "stack:" not in text and "schema.c++" not in text, text
    return text


@pytest.fixture
def received() -> Any:
    """A SubMaster that has received one vehicleState (speed 2.5), over shared memory."""
    pm = PubMaster(["vehicleState"])
    sm = SubMaster(["vehicleState"])
    try:
        msg = new_message("vehicleState")
        msg.vehicleState.speed = 2.5
        msg.vehicleState.cruiseState.enabled = True
        pm.send("vehicleState", msg)
        sm.update(1000)
        assert sm.updated["vehicleState"]
        yield sm
    finally:
        sm.close()
        pm.close()


def test_a_view_names_its_struct_the_closest_field_and_the_fields(received: Any) -> None:
    view = received["vehicleState"]
    assert view.speed == 2.5  # read by the view itself
    with pytest.raises(AttributeError) as caught:
        view.speeed  # noqa: B018 (reading raises)
    assert _one_line(caught.value).startswith(
        "VehicleState has no field 'speeed'; did you mean 'speed'? (fields: speed, "
        "acceleration, yawRate, ")
    assert "cruiseState, faults)" in str(caught.value)
    with pytest.raises(AttributeError) as caught:
        view.cruiseState.enabld  # noqa: B018 (a nested view: its struct and where it sits)
    assert _one_line(caught.value) == (
        "CruiseState (cruiseState) has no field 'enabld'; did you mean 'enabled'? "
        "(fields: enabled, available, setSpeed, standstill)")
    assert view.cruiseState.enabled is True
    assert not hasattr(view, "noSuchField")  # hasattr still answers False
    assert view.to_dict()["speed"] == 2.5  # what pycapnp has is still pycapnp's


def test_pycapnp_builders_and_readers_name_the_structs_with_a_close_field() -> None:
    msg = new_message("vehicleState")
    with pytest.raises(AttributeError) as caught:
        msg.vehicleState.speeed = 1.0  # a bare pycapnp builder: raised in C++
    assert caught.value.field_name == "speeed"
    text = _one_line(caught.value)
    assert text.startswith("struct has no field 'speeed'; did you mean 'speed' (a field of ")
    assert "VehicleState" in text
    with pytest.raises(AttributeError) as caught:
        msg.vehicleState.speeed  # noqa: B018 (reading raises)
    assert "did you mean 'speed'" in _one_line(caught.value)
    with pytest.raises(AttributeError) as caught:
        msg.logMonoTme = 5
    assert _one_line(caught.value).startswith(
        "struct has no field 'logMonoTme'; did you mean 'logMonoTime' (a field of Event)?")
    reader = log_from_bytes(msg.to_bytes())
    with pytest.raises(AttributeError) as caught:
        reader.vehicleState.cruiseState.enabld  # noqa: B018
    text = _one_line(caught.value)
    assert "did you mean 'enabled' (a field of " in text and "CruiseState" in text
    assert not hasattr(msg.vehicleState, "speeed")  # the message is made only when read
    with pytest.raises(AttributeError, match="no such member; name = __array__"):
        msg.vehicleState.__array__  # noqa: B018 (dunder probes stay pycapnp's, as cheap)
    # other pycapnp errors stay pycapnp's
    with pytest.raises(Exception) as caught:
        msg.vehicleState.speed = "fast"
    assert not isinstance(caught.value, UnknownFieldError)


def test_new_message_fields_name_the_root_struct() -> None:
    with pytest.raises(AttributeError) as caught:
        new_message("vehicleState", logMonoTme=5)
    assert isinstance(caught.value, KjException)  # what pycapnp raised here before
    assert _one_line(caught.value).startswith(
        "Event has no field 'logMonoTme'; did you mean 'logMonoTime'? (fields: logMonoTime, "
        "valid, ")
    assert new_message("vehicleState", logMonoTime=5).logMonoTime == 5


def test_another_schemas_builder_is_looked_up_in_that_schema(robot: Any) -> None:
    struct_services = [s for s in robot.union_fields if s not in robot.sized_fields]
    service = struct_services[0]
    field = robot.event.schema.fields[service].schema.fieldnames[0]
    msg = new_message(service)
    with pytest.raises(AttributeError) as caught:
        setattr(getattr(msg, service), field + "x", 1)
    assert f"did you mean '{field}' (a field of " in _one_line(caught.value)


def test_field_paths_resolve_or_say_where_they_went_wrong() -> None:
    event = new_message().schema
    fields = resolve_field_path(event, "vehicleState.cruiseState.setSpeed")
    assert [f.proto.name for f in fields] == ["vehicleState", "cruiseState", "setSpeed"]
    vehicle_state = event.fields["vehicleState"].schema
    with pytest.raises(AttributeError) as caught:
        resolve_field_path(vehicle_state, "cruiseState.setSped", "vehicleState")
    assert _one_line(caught.value) == (
        "CruiseState (vehicleState.cruiseState) has no field 'setSped'; did you mean "
        "'setSpeed'? (fields: enabled, available, setSpeed, standstill)")
    with pytest.raises(ValueError, match="speed is not a struct, it has no field 'x'"):
        resolve_field_path(event, "vehicleState.speed.x")
