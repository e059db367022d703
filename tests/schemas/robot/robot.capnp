# A second schema for msgq's own tests, shaped like real application schemas (openpilot's
# cereal is the reference): the root struct's union comes first and `valid` is declared
# late with a default of true, logMonoTime has a non-zero default, and the payloads use
# what real schemas use — bools defaulting to true, non-zero numeric defaults, deep
# nesting, lists of structs, Data lists, enums, groups, a union inside a struct, and types
# imported from another file. There is no logStart member: `initData` is the metadata
# event, as in openpilot. Its registry (services.py beside it) has no message sizes.
@0xc4f1e2d3b4a59687;

using Sensors = import "sensors.capnp";

struct Event {
  logMonoTime @0 :UInt64 = 1000;

  union {
    initData @1 :InitData;
    armState @2 :ArmState;
    imu @3 :Sensors.ImuReading;
    cameraFrame @4 :CameraFrame;
    canFrames @5 :List(CanFrame);
    rawChunks @6 :List(Data);
    missionLog @7 :Text;
    plannerPlan @8 :PlannerPlan;
    heartbeat @9 :Heartbeat;
    diagnostics @10 :Diagnostics;
  }

  valid @11 :Bool = true;
  sequence @12 :UInt32 = 42;
}

struct InitData {
  robotName @0 :Text;
  softwareVersion @1 :Text;
  dirty @2 :Bool = true;
  wallTimeNanos @3 :UInt64;
  params @4 :List(Param);
  struct Param {
    key @0 :Text;
    value @1 :Data;
  }
}

struct ArmState {
  enabled @0 :Bool = true;
  speedLimit @1 :Float32 = 1.5;
  joints @2 :List(Joint);
  mode @3 :Mode = position;
  gripper :group {
    closed @4 :Bool = true;
    force @5 :Float32 = 12.5;
    temperature @6 :Int16 = -40;
  }
  struct Joint {
    name @0 :Text;
    angle @1 :Float64;
    limit @2 :Float64 = 3.14;
    healthy @3 :Bool = true;
  }
  enum Mode {
    idle @0;
    position @1;
    velocity @2;
    torque @3;
  }
}

struct CameraFrame {
  frameId @0 :UInt32;
  exposure @1 :Float32 = 0.01;
  image @2 :Data;
  sensor @3 :Sensors.SensorInfo;
}

struct CanFrame {
  address @0 :UInt32;
  dat @1 :Data;
  src @2 :UInt8 = 128;
}

struct PlannerPlan {
  horizon :group {
    seconds @0 :Float32 = 10.0;
    points @1 :List(Point);
  }
  layers @2 :List(Layer);
  struct Point {
    x @0 :Float32;
    y @1 :Float32;
    v @2 :Float32 = 1.0;
  }
  struct Layer {
    name @0 :Text;
    weights @1 :List(Float32);
    children @2 :List(Layer);
  }
}

struct Heartbeat {
  alive @0 :Bool = true;
  counter @1 :Int64 = -1;
}

struct Diagnostics {
  level @0 :Sensors.Level = warning;
  source :union {
    none @1 :Void;
    sensor @2 :Sensors.SensorInfo;
    component @3 :Text;
  }
  blobs @4 :List(Data);
  nested @5 :Sensors.Deep;
}
