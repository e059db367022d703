# Types robot.capnp imports: an imported file, with its own defaults and deep nesting.
@0xd5e6f7a8b9c0d1e2;

struct ImuReading {
  acceleration @0 :List(Float32);
  gyro @1 :List(Float32);
  temperature @2 :Float32 = 25.0;
  calibrated @3 :Bool = true;
  sensor @4 :SensorInfo;
}

struct SensorInfo {
  name @0 :Text = "unnamed";
  rateHz @1 :Float32 = 100.0;
  level @2 :Level = ok;
}

enum Level {
  ok @0;
  warning @1;
  error @2;
}

struct Deep {
  level1 :group {
    level2 :group {
      value @0 :Int32 = 7;
      leaf @1 :Leaf;
    }
  }
  struct Leaf {
    flag @0 :Bool = true;
    values @1 :List(UInt16);
  }
}
